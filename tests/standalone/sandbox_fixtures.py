"""Fixtures and helpers shared by the sandbox and snapshot-store tests (imported by name: conftest.py is not ours)."""

import contextlib
import hashlib
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest


def tree_digest(root: Path) -> dict[str, tuple]:
    """Everything a snapshot must preserve, per relative path: type, mode, owner, content hash or link target."""
    out: dict[str, tuple] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = str(path.relative_to(root))
            st = path.lstat()
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path), st.st_uid, st.st_gid)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
            else:
                out[rel] = (
                    "file",
                    stat.S_IMODE(st.st_mode),
                    st.st_uid,
                    st.st_gid,
                    hashlib.sha256(path.read_bytes()).hexdigest(),
                )
    return out


def make_mixed_tree(root: Path) -> None:
    """Files a workspace really holds: text, binary, executable, symlinks, empty dirs, unicode names, odd owners."""
    (root / "workspace" / "src").mkdir(parents=True)
    (root / "home").mkdir()
    (root / "tmp").mkdir()
    (root / "workspace" / "src" / "main.py").write_text("print('hello')\n")
    (root / "workspace" / "bin.dat").write_bytes(os.urandom(300_000))
    run = root / "workspace" / "run.sh"
    run.write_text("#!/bin/sh\necho run\n")
    run.chmod(0o755)
    secret = root / "home" / "private.key"
    secret.write_text("not really a key\n")
    secret.chmod(0o600)
    (root / "workspace" / "empty" / "nested").mkdir(parents=True)
    (root / "workspace" / "ünïcödé 文件 🚀.txt").write_text("unicode ✓\n", encoding="utf-8")
    (root / "workspace" / "link-to-main").symlink_to("src/main.py")
    (root / "workspace" / "dangling").symlink_to("/nowhere/at/all")
    (root / "workspace" / "abs-link").symlink_to("/etc/passwd")
    os.chown(root / "workspace" / "src" / "main.py", 64123, 64124)
    os.lchown(root / "workspace" / "link-to-main", 64125, 64126)
    (root / "tmp").chmod(0o1777)


@pytest.fixture
def short_tmp():
    """A temp dir with a short path (unix socket paths must stay < 108 bytes), removed afterwards."""
    path = Path(tempfile.mkdtemp(prefix="fbx-", dir="/tmp"))  # noqa: S108 - short on purpose, removed below
    path.chmod(0o755)  # the unprivileged sandbox uid must be able to traverse it
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def small_tmpfs(short_tmp):
    """A 4 MiB tmpfs, to fill up; skipped where mounting is not allowed."""
    mnt = short_tmp / "small"
    mnt.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mnt)], capture_output=True)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {result.stderr.decode(errors='replace').strip()}")
    try:
        yield mnt
    finally:
        with contextlib.suppress(Exception):
            subprocess.run(["umount", "-l", str(mnt)], check=False)


def bwrap_usable() -> str | None:
    """Why sandboxes cannot run here, or None when they can."""
    if shutil.which("bwrap") is None:
        return "bwrap is not installed"
    try:
        import flarebox_supervisor  # noqa: F401
    except ImportError:
        return "the supervisor package is not importable"
    return None


@pytest.fixture
async def make_sandbox(short_tmp):
    """Factory for real sandboxes under a short temp dir: make_sandbox(name, store=..., cgroups=...). Every sandbox
    is destroyed (killed, live dir removed) at teardown, even when the test failed."""
    from standalone.sandbox import SandboxContainer
    from standalone.snapshots import SnapshotStore

    reason = bwrap_usable()
    if reason:
        pytest.skip(reason)
    made = []
    default_store = SnapshotStore(short_tmp / "snapshots")

    def make(workspace: str = "ws", *, store=None, cgroups=None, namespace: str = "ns"):
        container = SandboxContainer(
            namespace,
            workspace,
            short_tmp / "live" / namespace / workspace,
            short_tmp / "run",
            store or default_store,
            cgroups=cgroups,
        )
        made.append(container)
        return container

    try:
        yield make
    finally:
        for container in made:
            with contextlib.suppress(Exception):
                await container.destroy()


def run_as_unprivileged_server(short_tmp: Path, uid: int, script: str, *args: str) -> subprocess.CompletedProcess:
    """Run `script` (python -c) as host `uid` with the system Python 3.11 in a throwaway venv that reuses this venv's
    packages (the dev interpreter may live in a directory other users cannot enter), cwd and HOME a fresh dir that
    uid owns (passed as the script's first argument). Skips where that cannot be set up. Needs root."""
    import sys

    system_python = next((p for p in ("/usr/bin/python3.11", "/usr/local/bin/python3.11") if os.path.exists(p)), None)
    reason = bwrap_usable()
    if reason or system_python is None or sys.version_info[:2] != (3, 11):
        pytest.skip(reason or "needs a system python3.11 matching the dev venv")
    venv = short_tmp / "venv"
    subprocess.run([system_python, "-m", "venv", "--without-pip", str(venv)], check=True)
    dev_site = next(p for p in sys.path if p.endswith("site-packages") and p.startswith(sys.prefix))
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "dev_packages.pth").write_text(f"import site; site.addsitedir({dev_site!r})\n")
    work = short_tmp / "rootless"
    work.mkdir()
    os.chown(work, uid, uid)
    return subprocess.run(
        ["setpriv", f"--reuid={uid}", f"--regid={uid}", "--clear-groups", str(venv / "bin" / "python"), "-c"]
        + [script, str(work), *args],
        capture_output=True,
        timeout=60,
        env={"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": str(work)},
        cwd=work,
    )
