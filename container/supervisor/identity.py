"""Who commands and file operations run as, and the clean environment commands start with.

Started as root, the supervisor drops to the sandbox user for everything it runs; started unprivileged (tests, a
rootless sandbox) it runs everything as itself. Nothing from the supervisor's own environment reaches a command.
"""

import os
import pwd
import shutil
from dataclasses import dataclass

_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
_SETPRIV = shutil.which("setpriv", path="/usr/bin:/bin")


@dataclass(frozen=True)
class Identity:
    name: str
    uid: int
    gid: int
    groups: tuple[int, ...]
    home: str
    drop: bool  # True when the supervisor is root and must switch to this user for every command and file access

    def base_env(self) -> dict[str, str]:
        return {
            "PATH": _PATH,
            "HOME": self.home,
            "USER": self.name,
            "LOGNAME": self.name,
            "SHELL": "/bin/bash",
            "LANG": "C.UTF-8",
            "TERM": "dumb",
        }

    def spawn(self, argv: list[str]) -> tuple[list[str], dict]:
        """argv and extra subprocess.Popen arguments that start `argv` as this user.

        setpriv (util-linux) is preferred: Popen(user=...) cannot use vfork and costs a full fork of the supervisor
        (milliseconds per command); a vfork + exec of setpriv, which then switches ids and execs bash, is cheaper.
        """
        if not self.drop:
            return argv, {}
        if _SETPRIV:
            groups = f"--groups={','.join(map(str, self.groups))}" if self.groups else "--clear-groups"
            return [_SETPRIV, f"--reuid={self.uid}", f"--regid={self.gid}", groups, "--", *argv], {}
        return argv, {"user": self.uid, "group": self.gid, "extra_groups": list(self.groups)}

    def become(self) -> None:
        """Irreversibly switch the calling (forked) process to this user: groups first, then gid, then uid."""
        if not self.drop:
            return
        os.setgroups(list(self.groups))
        os.setresgid(self.gid, self.gid, self.gid)
        os.setresuid(self.uid, self.uid, self.uid)


def resolve_identity(user: str) -> Identity:
    if os.geteuid() != 0:
        uid, gid = os.getuid(), os.getgid()
        try:
            entry = pwd.getpwuid(uid)
            name, home = entry.pw_name, entry.pw_dir
        except KeyError:
            name, home = str(uid), "/"
        return Identity(name, uid, gid, tuple(os.getgroups()), home, drop=False)
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise SystemExit(f"unknown sandbox user {user!r}") from None
    if entry.pw_uid == 0:
        raise SystemExit("the sandbox user must not be root")
    groups = tuple(g for g in os.getgrouplist(entry.pw_name, entry.pw_gid))
    return Identity(entry.pw_name, entry.pw_uid, entry.pw_gid, groups, entry.pw_dir, drop=True)
