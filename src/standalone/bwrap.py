"""bubblewrap's command line for one sandbox: a pure function of what sandbox.py gathered (ids, dirs, descriptors).

Kept apart from the fds, cgroups and Popen of `SandboxContainer._spawn` so the isolation it describes can be read
and unit-tested as one list. The order is bwrap's: mounts apply in sequence, so a later one covers an earlier one
(the network's resolv.conf over /etc, Python sources over the live dirs, `--remount-ro /` over everything).
"""

import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

WORKSPACE = "/workspace"
SANDBOX_TMP = "/tmp"  # noqa: S108 - the sandbox's own /tmp, bound from its live dir
SUPERVISOR_PACKAGES = "/run/supervisor-python"  # the supervisor's own packages, bound under their import names
SUPERVISOR_MODULE = "flarebox_supervisor"


def supervisor_command(python: str, python_path: Sequence[str]) -> list[str]:
    """`python -m flarebox_supervisor` without `site` (-S): its path is set here instead, and `site` (the venv's
    .pth files, an editable install's import hook) was ~20 ms of every sandbox start. Isolated (-I: no environment
    variable, user site or cwd on the path) and writing no bytecode (-B: its sources are bound read-only)."""
    boot = (
        f"import sys; sys.path += {list(python_path)!r}; import runpy; "
        f"runpy.run_module({SUPERVISOR_MODULE!r}, run_name='__main__', alter_sys=True)"
    )
    return [python, "-I", "-S", "-B", "-c", boot]


@dataclass(frozen=True)
class SystemDir:
    """A read-only system directory as the host has it: a real directory, or a symlink (`link` = its target)."""

    path: str
    link: str | None = None


def host_system_dirs(paths: Iterable[str]) -> list[SystemDir]:
    """The host's layout of `paths` (merged /usr makes /bin a symlink to usr/bin); absent paths are left out."""
    found: list[SystemDir] = []
    for path in paths:
        if os.path.islink(path):
            found.append(SystemDir(path, os.readlink(path)))
        elif os.path.isdir(path):
            found.append(SystemDir(path))
    return found


@dataclass(frozen=True)
class LiveDirs:
    """Bind sources of the workspace's writable directories, as bwrap sees them (staged paths on a root server)."""

    workspace: str
    home: str
    tmp: str


@dataclass(frozen=True)
class SandboxFds:
    """Descriptors bwrap inherits: generated /etc/passwd and /etc/group, the seccomp filter, the bound socket, and
    the pipe the supervisor writes one byte to once it listens (`ready`)."""

    passwd: int
    group: int
    seccomp: int
    listen: int
    ready: int | None = None


def bwrap_argv(
    *,
    bwrap: str,
    uid: int,
    gid: int,
    workspace: str,
    internet: bool,
    system_dirs: Sequence[SystemDir],
    fds: SandboxFds,
    network_args: Sequence[str],
    live: LiveDirs,
    home: str,
    python_sources: Sequence[tuple[str, str]],
    env: Mapping[str, str],
    python: str,
    python_path: Sequence[str] = (),
    image_binds: Sequence[tuple[str, str]] = (),
) -> list[str]:
    """The full bwrap command that runs the supervisor. `python_sources` and `image_binds` (the workspace image's
    IMAGE_BINDS, config.py) are (bind source, path inside) pairs, bound read-only; `python_path` is what the
    supervisor's interpreter adds to its stdlib's path (supervisor_command); `network_args` are the private
    network's (network.py), empty without one; `env` is the sandbox's whole environment (SANDBOX_API_TOKEN is
    dropped whoever put it there)."""
    argv = [bwrap]
    argv += ["--unshare-user", "--uid", str(uid), "--gid", str(gid), "--disable-userns"]
    argv += ["--unshare-pid", "--unshare-ipc", "--unshare-uts", "--unshare-cgroup-try"]
    argv += ["--seccomp", str(fds.seccomp)]  # applied just before bwrap execs the supervisor
    if not internet:
        argv += ["--unshare-net"]  # no network at all (a private one is made by the launcher, see network.py)
    argv += ["--hostname", workspace[:63], "--die-with-parent", "--new-session"]
    for entry in system_dirs:
        if entry.link is not None:
            argv += ["--symlink", entry.link, entry.path]
        else:
            argv += ["--ro-bind", entry.path, entry.path]
    argv += ["--ro-bind-data", str(fds.passwd), "/etc/passwd", "--ro-bind-data", str(fds.group), "/etc/group"]
    argv += network_args  # after /etc: it covers /etc/resolv.conf
    argv += ["--proc", "/proc", "--dev", "/dev"]
    argv += ["--bind", live.workspace, WORKSPACE]
    argv += ["--bind", live.home, home]
    argv += ["--bind", live.tmp, SANDBOX_TMP]
    argv += ["--dir", "/var", "--symlink", "../tmp", "/var/tmp"]  # noqa: S108 - points at the sandbox /tmp
    argv += ["--dir", "/run"]  # read-only, as in an image: nothing of the server's is in it but the supervisor's code
    for source, path in image_binds:  # before the Python sources: a bind never hides the supervisor's Python
        argv += ["--ro-bind", source, path]
    for source, path in python_sources:  # after the live dirs: a Python installed below /tmp stays visible
        argv += ["--ro-bind", source, path]
    argv += ["--remount-ro", "/"]  # the root tmpfs bwrap builds would otherwise belong to the sandbox user
    argv += ["--chdir", WORKSPACE, "--clearenv"]
    for key, value in env.items():
        if key != "SANDBOX_API_TOKEN":
            argv += ["--setenv", key, value]
    argv += ["--", *supervisor_command(python, python_path), "--listen-fd", str(fds.listen)]
    if fds.ready is not None:
        argv += ["--ready-fd", str(fds.ready)]
    argv += ["--workdir", WORKSPACE]
    return argv
