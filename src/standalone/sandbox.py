"""The standalone runtime's container: a bubblewrap sandbox running the real supervisor on a unix socket.

One `SandboxContainer` per workspace implements the `Container` port. Its files live on the host in `root_dir`:
`workspace/` (→ /workspace), `home/` (→ /home/sandbox) and `tmp/` (→ /tmp); they outlive a crashed sandbox
(`has_disk()`), and snapshots archive exactly that directory.

Isolation: read-only /usr, /etc (with a generated passwd/group naming user `sandbox`), /bin, /lib*, /sbin and the
Python that runs the supervisor; its own PID, IPC, UTS (hostname = workspace) and cgroup namespaces; its own network
namespace: empty when internet is off, and with internet on (root server with slirp4netns) an outbound-only
user-mode NAT that refuses the host's loopback, so a sandbox never reaches this server's port or other local services
(see network.py; otherwise it shares the host network, and `flarebox serve` says so); a clean environment (nothing
of the server's, so never SANDBOX_API_TOKEN); no capabilities and no nested user namespaces. It never runs as host
root: a root server starts bwrap as the workspace's own unprivileged host uid (= gid), allocated once from the
server's range and never reused (uids.py; owner of the live dirs), mapped to the sandbox uid inside (default 1000);
an unprivileged server runs it as itself. See sandbox_launch.py for how a root server gets bind sources below
private directories to that uid. A seccomp filter (seccomp.py) makes host-wide or risky syscalls (keyrings, io_uring,
bpf, mounts, namespaces, clock, kernel modules) fail with EPERM.

The control socket: the server binds it in a directory of its own (`<runtime>/<key>/`, 0700, made afresh at every
start, never bound into the sandbox) and hands the bound descriptor to the supervisor, which listens on it; every
connection's peer must be this sandbox (peer.py). The sandbox's stdout/stderr is a pipe the server drains into a
bounded tail (log_tail.py), never a host file. See docs/architecture.md.

Not isolated: with internet on and no slirp4netns (or an unprivileged server), the sandbox shares the host's network
namespace (so it also reaches services on the host's loopback); disk use is not limited (the live dirs are plain
host directories).
"""

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import signal
import socket
import stat
import subprocess
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from durable.ports import ContainerGone, SnapshotInfo, StartSpec
from protocol import limits
from protocol.errors import ProtocolError
from standalone import sandbox_launch, seccomp
from standalone.bwrap import (
    SANDBOX_TMP,
    SUPERVISOR_PACKAGES,
    WORKSPACE,
    LiveDirs,
    SandboxFds,
    bwrap_argv,
    host_system_dirs,
)
from standalone.cgroups import Cgroups, SandboxGroup, limits_for
from standalone.config import IMAGE_BINDS_VAR, ImageBind, parse_image_binds
from standalone.log_tail import LogTail
from standalone.network import PrivateNetwork, data_fd, private_network_available
from standalone.restoring import BackgroundRestore
from standalone.sandbox_socket import SupervisorSocket, open_socket
from standalone.snapshots import SnapshotStore
from standalone.supervisor_http import Answer, SupervisorConnections
from standalone.uids import adopt_tree
from standalone.upstream import PortConnections, PortResponse, open_port_socket

log = logging.getLogger("flarebox.sandbox")

SANDBOX_USER = "sandbox"
SANDBOX_HOME = "/home/sandbox"
SOCKET_NAME = "sv.sock"
MAX_SOCKET_PATH = 100  # sun_path is 108 bytes; keep a margin
STAGE_DIR = "/tmp"  # noqa: S108 - covered by a private tmpfs in the launcher's own mount namespace, never written
STARTUP_TIMEOUT = 30.0
STOP_GRACE = 2.0
# A healthy supervisor answers at once and sends a heartbeat at least every HEARTBEAT_SECONDS on a stream, so this
# much silence on a request (waiting for its answer, or for the next bytes of a stream) means it is frozen or
# wedged: the request ends with ContainerGone instead of hanging its client forever.
SILENCE_SECONDS = 3 * limits.HEARTBEAT_SECONDS
CONNECT_SECONDS = 10.0
PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
LIVE_SUBDIRS = {"workspace": 0o755, "home": 0o755, "tmp": 0o1777}
_SYSTEM_DIRS = ("/usr", "/etc", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")


@dataclass(frozen=True)
class SandboxIds:
    """Who the sandbox is: `uid`/`gid` inside (user `sandbox`), `host_uid`/`host_gid` on the host when the server
    is root (an unprivileged server always uses its own ids). A root `flarebox serve` gives each workspace its own
    host ids from its range (sandbox_driver.py, uids.py); the defaults serve sandboxes built directly (tests)."""

    uid: int = 1000
    gid: int = 1000
    host_uid: int = 64000
    host_gid: int = 64000


def _site_dirs() -> list[str]:
    """The server's site dirs (the venv's, --system-site-packages, a user site, one a .pth adds): where the
    supervisor's third-party packages are. Never '' or the server's cwd, which may hold its data directory."""
    found = [p for p in sys.path if os.path.basename(p) in ("site-packages", "dist-packages") and os.path.isdir(p)]
    return list(dict.fromkeys(os.path.realpath(p) for p in found))


def _python_sources() -> list[str]:
    """Host directories the sandbox needs to run the supervisor's interpreter, bound where they are: the
    interpreter's install, the venv and the site dirs (its own packages are bound apart: `_supervisor_packages`)."""
    found: list[str] = []
    for path in [sys.base_prefix, sys.prefix, *_site_dirs()]:
        real = os.path.realpath(path)
        if real in found or any(real.startswith(p.rstrip("/") + "/") for p in found):
            continue
        if any(real == d or real.startswith(d + "/") for d in ("/usr", "/bin", "/lib", "/lib64", "/sbin")):
            continue  # already bound read-only as a system directory
        found.append(real)
    return found


def _binds_below_live_dirs() -> bool:
    """Whether a Python source is bound below a live dir's path inside (a Python installed under /tmp, a checkout
    in a home directory): bwrap then creates its mount point's parents inside that live dir as it starts, so the
    sandbox cannot start on staged live dirs while a restore is extracted into them (restoring.py)."""
    inside = (SANDBOX_TMP, WORKSPACE, SANDBOX_HOME)
    return any(p == d or p.startswith(d + "/") for p in _python_sources() for d in inside)


def _supervisor_packages() -> list[tuple[str, str]]:
    """(host directory, path inside) of the `flarebox_supervisor` and `protocol` packages, bound under their import
    names below SUPERVISOR_PACKAGES: the supervisor then starts without `site` (an editable install maps
    `flarebox_supervisor` to container/supervisor through an import hook `site` loads: ~20 ms of every start)."""
    import flarebox_supervisor
    import protocol

    return [
        (str(Path(m.__file__).resolve().parent), f"{SUPERVISOR_PACKAGES}/{m.__name__}")
        for m in (flarebox_supervisor, protocol)
    ]


@cache
def write_supervisor_bytecode() -> bool:
    """Compile the supervisor's and the protocol's modules where they are, once per server, as an installer would.
    The supervisor runs with -B from a read-only bind, so it never writes its own bytecode: without it (an editable
    install, a fresh checkout) every sandbox start compiles them again, ~25 ms here. Only stale files are written;
    False when the tree is not the server's to write (a root-owned install), which is then used as it is."""
    import compileall

    import flarebox_supervisor
    import protocol

    return all(
        compileall.compile_dir(Path(m.__file__).parent, quiet=2, maxlevels=0) for m in (flarebox_supervisor, protocol)
    )


@cache
def _configured_image_binds() -> dict[str, tuple[ImageBind, ...]]:
    """The server's IMAGE_BINDS (config.py), read once; load_settings already refused a bad one at start."""
    return parse_image_binds(os.environ.get(IMAGE_BINDS_VAR))


def _passwd(ids: SandboxIds) -> tuple[bytes, bytes]:
    passwd = (
        "root:x:0:0:root:/root:/usr/sbin/nologin\n"
        f"{SANDBOX_USER}:x:{ids.uid}:{ids.gid}:Flarebox sandbox:{SANDBOX_HOME}:/bin/bash\n"
        "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n"
    )
    group = f"root:x:0:\n{SANDBOX_USER}:x:{ids.gid}:\nnogroup:x:65534:\n"
    return passwd.encode(), group.encode()


def remove_tree(path: Path) -> None:
    """rmtree that also removes what the sandbox made unreadable (chmod 000 dirs stop an unprivileged server).
    Called only once the sandbox is dead, so nothing swaps a directory for a symlink under our feet."""
    if not path.is_dir() or path.is_symlink():
        return
    if os.geteuid() != 0:
        with contextlib.suppress(OSError):
            os.chmod(path, 0o700)
        for dirpath, dirnames, _ in os.walk(path):
            for name in dirnames:
                child = os.path.join(dirpath, name)
                if not os.path.islink(child):
                    with contextlib.suppress(OSError):
                        os.chmod(child, 0o700)
    shutil.rmtree(path, ignore_errors=True)


def remove_path(path: Path) -> None:
    """Remove whatever is at `path` — file, socket, symlink (not its target) or directory tree — or nothing."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(path)  # never follows symlinks inside
    else:
        os.unlink(path)


class SandboxContainer:
    def __init__(
        self,
        namespace: str,
        workspace: str,
        root_dir: str | os.PathLike,
        runtime_dir: str | os.PathLike,
        store: SnapshotStore,
        *,
        ids: SandboxIds = SandboxIds(),
        cgroups: Cgroups | None = None,
        startup_timeout: float = STARTUP_TIMEOUT,
        image_binds: Mapping[str, tuple[ImageBind, ...]] | None = None,
    ):
        self.namespace = namespace
        # extra read-only binds for the workspace's image (IMAGE_BINDS); None: the server's environment
        self.image_binds = _configured_image_binds() if image_binds is None else image_binds
        self.workspace = workspace
        self.root_dir = Path(root_dir)
        self.store = store
        self.ids = ids
        self.cgroups = cgroups
        self.startup_timeout = startup_timeout
        self._as_root = os.geteuid() == 0
        key = hashlib.sha256(f"{namespace}/{workspace}\0{self.root_dir.resolve()}".encode()).hexdigest()[:12]
        self.name = f"fbx-{key}"
        # the supervisor's socket: in a directory only the server can reach, never bound into any sandbox
        self.socket_dir = Path(runtime_dir) / key
        self.socket_path = self.socket_dir / SOCKET_NAME
        if len(os.fsencode(self.socket_path)) >= MAX_SOCKET_PATH:
            raise ValueError(f"runtime dir too long for a unix socket path: {self.socket_path}")
        self._proc: subprocess.Popen | None = None
        self._ready_fd: int | None = None  # read end of the pipe the supervisor writes to once it listens
        self._log: LogTail | None = None
        (Path(runtime_dir) / f"{key}.log").unlink(missing_ok=True)  # a host log file of older versions
        self._group: SandboxGroup | None = None
        self._net: PrivateNetwork | None = None
        self._client: SupervisorConnections | None = None
        self._port_connections: PortConnections | None = None  # kept-alive upstreams of the running sandbox
        self._shares_host_network = False  # internet on without a private network: its loopback is the host's
        self._lock = asyncio.Lock()
        # what the next save increments from (snapshots.py): the server's own, beside root_dir, never inside it
        self.base_dir = self.root_dir.parent / f"{self.root_dir.name}.snapshot-base"
        self._clean_restore_leftovers()

    # ---- state --------------------------------------------------------------------------------------------
    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def has_disk(self) -> bool:
        return self.root_dir.is_dir() and not self.running()

    @property
    def pid(self) -> int | None:
        """The bwrap process on the host (for tests and diagnostics)."""
        return self._proc.pid if self._proc is not None else None

    @property
    def cgroup(self) -> SandboxGroup | None:
        return self._group

    @property
    def host_ids(self) -> tuple[int, int]:
        return (self.ids.host_uid, self.ids.host_gid) if self._as_root else (os.getuid(), os.getgid())

    # ---- lifecycle ----------------------------------------------------------------------------------------
    async def start(self, spec: StartSpec) -> None:
        async with self._lock:
            if self.running():
                return
            await self._reap()
            restoring: BackgroundRestore | None = None
            try:
                if spec.snapshot_id and _binds_below_live_dirs():  # snapshot_damaged leaves the live dir as it was
                    # bwrap makes those binds' mount points inside a live dir: not while tar is extracting into it
                    await asyncio.to_thread(self.store.forget, self.base_dir)
                    await asyncio.to_thread(
                        self.store.restore, self.namespace, self.workspace, spec.snapshot_id, self.root_dir
                    )
                    self._prepare_live_dirs()
                    await asyncio.to_thread(self._track, spec.snapshot_id)  # after the adoption: it changes ctimes
                    await self._boot(spec, self.root_dir)
                elif spec.snapshot_id:
                    # first: while the tree is being replaced, nothing may pair it with the old base
                    await asyncio.to_thread(self.store.forget, self.base_dir)
                    restoring = BackgroundRestore(
                        self.store,
                        self.namespace,
                        self.workspace,
                        spec.snapshot_id,
                        self.root_dir,
                        LIVE_SUBDIRS,
                        decide_seconds=4 * self.startup_timeout,  # the network, the ready signal, /health, margin
                    )
                    await self._boot_restoring(spec, restoring)
                    await asyncio.to_thread(self._track, spec.snapshot_id)  # after the adoption: it changes ctimes
                else:
                    if not self.root_dir.is_dir():
                        await asyncio.to_thread(self.store.forget, self.base_dir)  # a fresh tree: a full first save
                    await self._boot(spec, self.root_dir)
            except (OSError, ValueError, subprocess.SubprocessError) as exc:
                await self._stop_start(restoring)
                raise ProtocolError("container_unavailable", f"the sandbox could not start: {exc}") from None
            except BaseException:
                await self._stop_start(restoring)
                raise

    async def _boot(self, spec: StartSpec, live_root: Path) -> None:
        """Start the sandbox on the live subdirs under `live_root` and wait until it is ready for commands."""
        if live_root == self.root_dir:
            self._prepare_live_dirs()
        self._fresh_socket_dir()
        self._spawn(spec, live_root)
        await self._started()

    async def _boot_restoring(self, spec: StartSpec, restoring: BackgroundRestore) -> None:
        """Start the sandbox on the staged live subdirs while the snapshot is extracted into them (restoring.py);
        once both are done, swap the tree into place and adopt it: nothing in the sandbox runs yet."""
        boot_error: Exception | None = None
        try:
            await self._boot(spec, restoring.staging)
        except Exception as exc:  # raised below, unless the archive itself is why (it replaced a staged subdir)
            boot_error = exc
        if await restoring.extracted():  # the sandbox did not bind the tree's own subdirs: start it on those
            await self._kill()
            await restoring.finish()
            await self._boot(spec, self.root_dir)
            return
        if boot_error is not None:
            raise boot_error  # the live dir stays as it was: the start abandons the extraction
        await restoring.finish()
        self._prepare_live_dirs()

    async def _stop_start(self, restoring: BackgroundRestore | None) -> None:
        if restoring is not None:
            restoring.abandon()
        await self._kill()

    async def _started(self) -> None:
        """Until the sandbox is ready for commands: its supervisor answers and, with a private network, the NAT is
        plugged in. The two happen at once: the supervisor's start does not wait for the network."""
        ready = asyncio.ensure_future(self._ready_signal(self.startup_timeout))
        try:
            if self._net is not None:
                procs = self._group.procs_files if self._group else []
                await self._net.start(self._proc.pid, self.startup_timeout, self._log.write_fd, self.running, procs)
            self._log.close_writer()
            await ready
        finally:
            ready.cancel()
        await self._health()

    def _prepare_live_dirs(self) -> None:
        self.root_dir.mkdir(parents=True, exist_ok=True, mode=0o755)
        uid, gid = self.host_ids
        if self._as_root:  # before the loop below, which would mark the top dirs adopted
            adopt_tree(self.root_dir, uid, gid)
        for sub, mode in LIVE_SUBDIRS.items():
            path = self.root_dir / sub
            if not path.is_dir() or path.is_symlink():
                if path.is_symlink() or path.exists():
                    path.unlink()
                path.mkdir(mode=mode)
                os.chmod(path, mode)
            if self._as_root:
                os.lchown(path, uid, gid)

    def _fresh_socket_dir(self) -> None:
        """A fresh, server-only directory on every start: nothing of a predecessor's is used, whatever it left."""
        remove_path(self.socket_dir)
        self.socket_dir.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.socket_dir.mkdir(mode=0o700)

    def _spawn(self, spec: StartSpec, live_root: Path) -> None:
        sources: list[str] = []  # host directories to stage for an unprivileged bwrap (root server only)

        def source(path: str | Path) -> str:
            if not self._as_root:
                return str(path)
            sources.append(str(path))
            return f"{STAGE_DIR}/{len(sources) - 1}"

        passwd, group = _passwd(self.ids)
        seccomp_fd = seccomp.filter_fd()  # first: it raises (no libseccomp) before any other fd is open
        passwd_fd, group_fd = data_fd(passwd), data_fd(group)
        # bound here, listened on by the supervisor (so SO_PEERCRED names it), closed here once it holds a copy
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self._ready_fd, ready_write = os.pipe2(os.O_CLOEXEC)
        self._log = LogTail()
        try:
            listener.bind(str(self.socket_path))
            self._net = PrivateNetwork() if spec.enable_internet and private_network_available() else None
            self._shares_host_network = spec.enable_internet and self._net is None
            # source() stages in call order (the launcher's numbering): live dirs first, then Python sources
            live = LiveDirs(source(live_root / "workspace"), source(live_root / "home"), source(live_root / "tmp"))
            write_supervisor_bytecode()
            python_sources = [(source(path), path) for path in _python_sources()]
            python_sources += [(source(host), inside) for host, inside in _supervisor_packages()]
            image_binds = [(source(b.source), b.target) for b in self.image_binds.get(spec.image, ())]
            env = {"PATH": PATH, "HOME": SANDBOX_HOME, "LANG": "C.UTF-8", "USER": SANDBOX_USER, **(spec.env or {})}
            argv = bwrap_argv(
                bwrap=shutil.which("bwrap") or "/usr/bin/bwrap",
                uid=self.ids.uid,
                gid=self.ids.gid,
                workspace=self.workspace,
                internet=spec.enable_internet,
                system_dirs=host_system_dirs(_SYSTEM_DIRS),
                fds=SandboxFds(
                    passwd=passwd_fd, group=group_fd, seccomp=seccomp_fd, listen=listener.fileno(), ready=ready_write
                ),
                network_args=self._net.bwrap_args() if self._net is not None else [],
                live=live,
                home=SANDBOX_HOME,
                python_sources=python_sources,
                env=env,
                python=sys.executable,
                python_path=[SUPERVISOR_PACKAGES, *_site_dirs()],
                image_binds=image_binds,
            )

            if self.cgroups is not None:
                self._group = self.cgroups.create(self.name, limits_for(spec.instance))
            launch = {
                "cgroup_procs": self._group.procs_files if self._group else [],
                "stage": STAGE_DIR if self._as_root else None,
                "sources": sources,
                "uid": self.ids.host_uid if self._as_root else None,
                "gid": self.ids.host_gid if self._as_root else None,
                "argv": argv,
                "env": {"PATH": PATH},  # bwrap's own environment; the sandbox's is set by --clearenv/--setenv
                **(self._net.launch_spec() if self._net is not None else {}),
            }
            # spawned from the event loop's thread: --die-with-parent watches the thread that forked bwrap
            self._proc = subprocess.Popen(
                sandbox_launch.command(launch),
                stdin=subprocess.DEVNULL,
                stdout=self._log.write_fd,
                stderr=subprocess.STDOUT,
                env={"PATH": PATH},
                pass_fds=(
                    passwd_fd,
                    group_fd,
                    seccomp_fd,
                    listener.fileno(),
                    ready_write,
                    *(self._net.child_fds() if self._net else ()),
                ),
                start_new_session=True,
            )
            self._log.start()
        finally:
            os.close(passwd_fd)
            os.close(group_fd)
            os.close(seccomp_fd)
            os.close(ready_write)  # only the sandbox holds it now: EOF here if it dies before listening
            listener.close()
            if self._net is not None:
                self._net.spawned()
        self._client = SupervisorConnections(str(self.socket_path), self._expected_peer, CONNECT_SECONDS)

    def _expected_peer(self) -> tuple[int, int] | None:
        """(host uid, bwrap pid) of the sandbox running now: only its processes may answer on its socket."""
        proc = self._proc
        return (self.host_ids[0], proc.pid) if proc is not None and proc.poll() is None else None

    async def _ready_signal(self, timeout: float) -> None:
        """Wait until the supervisor says it listens (or the pipe ends: the sandbox died). No polling: /health is
        then asked once, at the moment it can answer."""
        fd, self._ready_fd = self._ready_fd, None
        if fd is None:
            return
        loop = asyncio.get_running_loop()
        signalled = loop.create_future()
        loop.add_reader(fd, lambda: signalled.done() or signalled.set_result(None))
        try:
            async with asyncio.timeout(timeout):
                await signalled
        except TimeoutError:
            pass  # the loop below reports the timeout
        finally:
            loop.remove_reader(fd)
            os.close(fd)

    async def _health(self) -> None:
        """Until /health answers (once the ready signal came, at once)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.startup_timeout
        delay = 0.01
        while True:
            if not self.running():
                raise ProtocolError("container_unavailable", f"the sandbox exited during startup: {self._log_tail()}")
            if self.socket_path.exists():
                try:
                    response = await self.fetch("GET", "/health", timeout=5.0)
                    await response.read()  # capped: an impostor's endless answer is refused, not buffered
                    if response.status == 200:
                        return
                except ContainerGone:
                    pass
            if loop.time() > deadline:
                raise ProtocolError(
                    "startup_timeout", f"the sandbox did not answer /health in {self.startup_timeout:g} s"
                )
            await asyncio.sleep(delay)
            delay = min(delay * 2, 0.05)

    def _log_tail(self, limit: int = 600) -> str:
        return self._log.text(limit) if self._log is not None else "(no output)"

    async def stop(self) -> None:
        """Stop the sandbox and keep its files (server shutdown; the next start reports `restarted`)."""
        async with self._lock:
            await self._kill()

    async def destroy(self) -> None:
        async with self._lock:
            await self._kill()
            await asyncio.to_thread(remove_tree, self.root_dir)
            remove_path(self.base_dir)
            remove_path(self.socket_dir)

    async def _kill(self) -> None:
        proc = self._proc
        if proc is not None and proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)  # bwrap dies; --die-with-parent takes the whole PID namespace
            if not await self._wait_exit(proc, STOP_GRACE):
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
                await self._wait_exit(proc, 10.0)
        await self._reap()

    async def _reap(self) -> None:
        """Release what a dead sandbox leaves: its HTTP client, its cgroup, its log pipe, its socket directory."""
        if self._proc is not None and self._proc.poll() is None:
            return
        self._proc = None
        if self._ready_fd is not None:
            ready_fd, self._ready_fd = self._ready_fd, None
            os.close(ready_fd)
        if self._net is not None:
            net, self._net = self._net, None
            await asyncio.to_thread(net.stop)
        if self._port_connections is not None:  # the next sandbox gets a pool of its own
            connections, self._port_connections = self._port_connections, None
            connections.close()
        if self._client is not None:
            client, self._client = self._client, None
            client.close()
        if self._group is not None and self.cgroups is not None:
            group, self._group = self._group, None
            try:
                await asyncio.to_thread(self.cgroups.remove, group)
            except OSError:
                log.warning("could not remove cgroup %s", group.dirs)
        if self._log is not None:
            sandbox_log, self._log = self._log, None
            sandbox_log.close()
        remove_path(self.socket_dir)

    @staticmethod
    async def _wait_exit(proc: subprocess.Popen, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while proc.poll() is None:
            if loop.time() > deadline:
                return False
            await asyncio.sleep(0.02)
        return True

    def _clean_restore_leftovers(self) -> None:
        """A restore interrupted by a crash leaves `.tmp-restore-<name>-*` next to the live dir."""
        parent = self.root_dir.parent
        if parent.is_dir():
            pattern = re.compile(rf"\.tmp-(restore|old)-{re.escape(self.root_dir.name)}-[0-9a-f]{{8}}")
            for entry in parent.iterdir():
                if pattern.fullmatch(entry.name):
                    remove_tree(entry)

    # ---- requests -----------------------------------------------------------------------------------------
    async def fetch(
        self,
        method: str,
        path: str,
        *,
        body: Any = None,
        headers: dict[str, str] | None = None,
        timeout: float | None = None,
    ) -> "SandboxResponse":
        client = self._client
        if client is None or not self.running():
            raise ContainerGone("the sandbox is not running")
        answer = await client.request(method, path, headers, body, SILENCE_SECONDS if timeout is None else timeout)
        return SandboxResponse(answer, read_seconds=timeout)

    async def connect(self, path: str) -> SupervisorSocket:
        if self._client is None or not self.running():
            raise ContainerGone("the sandbox is not running")
        return await open_socket(str(self.socket_path), path, self._expected_peer)

    async def fetch_port(
        self,
        port: int,
        method: str,
        path: str,
        *,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> PortResponse:
        """Straight to the service, HTTP/1.1 on a socket the supervisor connected inside the sandbox's network
        namespace (which only its processes reach) and handed over; kept alive for the next request to that port
        (upstream.py). No silence limit on the answer (an SSE stream may be quiet for long); its head must come
        within PROXY_HEAD_SECONDS of the last request byte sent."""
        proc = self._proc
        if self._client is None or proc is None or not self.running():
            raise ContainerGone("the sandbox is not running")
        if self._shares_host_network:
            # its 127.0.0.1 is the host's: a proxied request would reach whatever the host serves on loopback
            raise ProtocolError(
                "upstream_unavailable",
                "the port proxy needs the sandbox in a network of its own, and this one shares the host's (an"
                " unprivileged server with ENABLE_INTERNET=true): run the server as root with slirp4netns, or set"
                " ENABLE_INTERNET=false",
            )
        connections = self._port_connections
        if connections is None:
            socket_path = str(self.socket_path)

            def opener(to: int, closer):
                return open_port_socket(socket_path, self._expected_peer, to, limits.PROXY_HEAD_SECONDS, closer)

            connections = self._port_connections = PortConnections(opener)
        return await connections.request(port, method, path, headers or {}, body, limits.PROXY_HEAD_SECONDS)

    # ---- snapshots ----------------------------------------------------------------------------------------
    async def snapshot(self) -> SnapshotInfo:
        """Archive the live files from the host. No sync of its own: the host reads the same page cache the sandbox
        wrote to, and the workspace already asked the supervisor for one (best effort) — a frozen supervisor then
        costs one timeout, not two."""
        if not self.root_dir.is_dir():
            raise ProtocolError("snapshot_failed", "the workspace has no files to snapshot")
        # an increment of the last save or restore of these live files when there is one (snapshots.py)
        return await asyncio.to_thread(
            self.store.create, self.namespace, self.workspace, self.root_dir, base_dir=self.base_dir
        )

    def _track(self, snapshot_id: str) -> None:
        """Make the tree just restored from `snapshot_id` the base of its next save (a stat walk); failing that,
        the next save is full, and the sandbox starts all the same."""
        try:
            self.store.track(self.namespace, self.workspace, snapshot_id, self.root_dir, self.base_dir)
        except Exception as exc:  # whatever went wrong costs one full save, never the start
            log.warning("%s/%s: no incremental base after the restore: %s", self.namespace, self.workspace, exc)
            with contextlib.suppress(OSError):
                self.store.forget(self.base_dir)

    def snapshot_expiry(self, alive_from_ms: int) -> int | None:
        return None  # the snapshot store keeps a snapshot until retention or a delete drops it

    async def snapshot_ref(self, snapshot_id: str) -> dict[str, Any]:
        listed = await asyncio.to_thread(self.store.list, self.namespace, self.workspace)
        if not any(s.id == snapshot_id for s in listed):
            raise ProtocolError(
                "snapshot_not_found", f"{self.namespace}/{self.workspace} has no snapshot {snapshot_id}"
            )
        return {"namespace": self.namespace, "workspace": self.workspace, "id": snapshot_id}

    async def adopt_snapshot(self, ref: dict[str, Any]) -> SnapshotInfo:
        """Link the archives of another workspace's snapshot (every link of its chain) into this one's store."""
        fields = ("namespace", "workspace", "id")
        if not isinstance(ref, dict) or not all(isinstance(ref.get(k), str) for k in fields):
            raise ProtocolError("snapshot_not_found", "not a snapshot reference of this deployment")
        try:
            return await asyncio.to_thread(
                self.store.clone, ref["namespace"], ref["workspace"], ref["id"], self.namespace, self.workspace
            )
        except ValueError:  # not a snapshot id
            raise ProtocolError("snapshot_not_found", f"no snapshot {ref['id']!r}") from None
        except ProtocolError as err:
            if err.code in ("snapshot_not_found", "snapshot_damaged", "snapshot_failed"):
                raise
            raise ProtocolError("snapshot_not_found", f"no workspace {ref['namespace']}/{ref['workspace']}") from None

    async def delete_snapshot(self, snapshot_id: str) -> None:
        await asyncio.to_thread(self.store.delete, self.namespace, self.workspace, snapshot_id)


# A control answer (health, an error, sync, cancel) must arrive whole within its request's timeout, or this long for
# a request without one: a drip of bytes, each within the silence timeout, must not hold a request for ever.
CONTROL_READ_SECONDS = 30.0


class SandboxResponse:
    """The supervisor's answer; `body` streams it and raises ContainerGone if the sandbox dies mid-body.
    `read_seconds` bounds a whole `read()` (the request's timeout; CONTROL_READ_SECONDS for one without)."""

    def __init__(self, answer: Answer, *, read_seconds: float | None = None):
        self._answer = answer
        self.status = answer.status
        self.header_pairs = [(k.lower(), v) for k, v in answer.header_pairs]
        self.headers = dict(self.header_pairs)
        self.body = answer.chunks()
        self.read_seconds = read_seconds or CONTROL_READ_SECONDS

    async def read(self, limit: int = limits.CONTROL_BODY_BYTES) -> bytes:
        """The whole body, for a control answer; ContainerGone past `limit` bytes or `read_seconds`."""
        try:
            async with asyncio.timeout(self.read_seconds):
                return await self._read_at_most(limit)
        except TimeoutError:
            raise ContainerGone(f"the sandbox did not finish a control answer in {self.read_seconds:g} s") from None
        finally:
            await self.aclose()  # a no-op after a whole body; otherwise drops the connection, unread

    async def _read_at_most(self, limit: int) -> bytes:
        chunks: list[bytes] = []
        size = 0
        async for chunk in self.body:
            size += len(chunk)
            if size > limit:
                raise ContainerGone(f"the sandbox sent more than {limit} bytes for a control answer")
            chunks.append(chunk)
        return b"".join(chunks)

    async def json(self) -> Any:
        return json.loads(await self.read())

    async def aclose(self) -> None:
        await self.body.aclose()
        self._answer.release()  # a body never iterated: its generator's cleanup never ran
