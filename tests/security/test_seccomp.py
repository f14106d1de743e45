"""The seccomp filter (src/standalone/seccomp.py), from inside real sandboxes: every denied family fails with EPERM
(clone3 with ENOSYS), other ABIs cannot reach a denied call, and ordinary work (shells, threads, subprocesses,
ptrace, strace) is unharmed. Each probe also reports the process's seccomp mode, so on a sandbox without the
filter every denial test fails even where the kernel would refuse the call for lack of capabilities anyway."""

import asyncio
import json
import os
import secrets
import shlex
import shutil
import subprocess
import sys

import pytest
import sandbox_fixtures as fx
from test_sandbox import run, spec

from standalone import seccomp

sc = pytest.importorskip("pyseccomp")
short_tmp, make_sandbox = fx.short_tmp, fx.make_sandbox
pytestmark = pytest.mark.timeout(120)

# Runs inside the sandbox with the system python3: argv[1] = {name: number} (resolved on the host for its arch),
# argv[2] = the calls to make, as [label, name, args...]; strings are passed as C strings, None as NULL.
PROBE = r"""
import ctypes, errno, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR, calls = json.loads(sys.argv[1]), json.loads(sys.argv[2])

def arg(a):
    return ctypes.c_char_p(a.encode()) if isinstance(a, str) else ctypes.c_void_p(a) if a is None else ctypes.c_long(a)

out = {}
for label, name, *args in calls:
    ctypes.set_errno(0)
    rc = libc.syscall(ctypes.c_long(NR[name]), *map(arg, args))
    if rc == 0 and name == "clone":  # a fork-like clone that got through: the child leaves at once
        os._exit(0)
    if rc > 0 and name == "clone":
        os.waitpid(rc, 0)
    out[label] = "ok" if rc >= 0 else errno.errorcode.get(ctypes.get_errno(), str(ctypes.get_errno()))
status = dict(line.split(":", 1) for line in open("/proc/self/status").read().splitlines() if ":" in line)
print(json.dumps({"seccomp": status.get("Seccomp", "").strip(), "results": out}))
"""
CLONE_NEWUSER, CLONE_NEWNS, CLONE_NEWNET, SIGCHLD = 0x10000000, 0x00020000, 0x40000000, 17
KEY_SPEC_USER_KEYRING, KEYCTL_GET_KEYRING_ID, KEYCTL_SEARCH, KEYCTL_READ = -4, 0, 10, 11
CLOCK_REALTIME, AT_FDCWD = 0, -100

# One entry per denied family: calls whose args the kernel would otherwise accept or reject differently.
FAMILIES = {
    "keyring": [
        ("add_key", "add_key", "user", "fbx-probe", "secret", 6, KEY_SPEC_USER_KEYRING),
        ("keyctl", "keyctl", KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING, 0),
        ("request_key", "request_key", "user", "fbx-none", None, 0),
    ],
    "io_uring": [
        ("setup", "io_uring_setup", 1, None),
        ("enter", "io_uring_enter", -1, 0, 0, 0, None, 0),
        ("register", "io_uring_register", -1, 0, None, 0),
    ],
    "bpf": [("bpf", "bpf", 0, None, 0)],
    "perf": [("perf_event_open", "perf_event_open", None, 0, -1, -1, 0)],
    "userfaultfd": [("userfaultfd", "userfaultfd", 0)],
    "kernel_modules": [
        ("init_module", "init_module", None, 0, ""),
        ("finit_module", "finit_module", -1, "", 0),
        ("delete_module", "delete_module", "fbx_nonexistent", 0),
    ],
    "kexec": [("kexec_load", "kexec_load", 0, 0, None, 0)],
    "reboot": [("reboot", "reboot", 0, 0, 0, None)],
    "swap": [("swapon", "swapon", "/nonexistent", 0), ("swapoff", "swapoff", "/nonexistent")],
    "accounting": [("acct", "acct", None)],
    "clock": [
        ("clock_settime", "clock_settime", CLOCK_REALTIME, None),
        ("settimeofday", "settimeofday", None, None),
        ("adjtimex", "adjtimex", None),
    ],
    "mount": [
        ("mount", "mount", None, None, None, 0, None),
        ("umount2", "umount2", "/nonexistent", 0),
        ("fsopen", "fsopen", "tmpfs", 0),
        ("open_tree", "open_tree", AT_FDCWD, "/", 0),
    ],
    "namespaces": [
        ("unshare_user", "unshare", CLONE_NEWUSER),
        ("unshare_none", "unshare", 0),  # even a no-op
        ("setns", "setns", -1, 0),
    ],
    "file_handles": [
        ("name_to_handle_at", "name_to_handle_at", AT_FDCWD, "/", None, None, 0),
        ("open_by_handle_at", "open_by_handle_at", -1, None, 0),
    ],
    "obsolete": [("sysfs", "sysfs", 3), ("ustat", "ustat", 0, None), ("ioperm", "ioperm", 0, 0, 0)],
    "kcmp": [("kcmp", "kcmp", 1, 1, 0, 0, 0)],
    "fanotify": [("fanotify_init", "fanotify_init", 0, 0)],
    "clone_namespaces": [
        ("newuser", "clone", CLONE_NEWUSER | SIGCHLD, 0, 0, 0, 0),
        ("newns", "clone", CLONE_NEWNS | SIGCHLD, 0, 0, 0, 0),
        ("newnet", "clone", CLONE_NEWNET | SIGCHLD, 0, 0, 0, 0),
    ],
}


def _numbers(calls) -> dict[str, int]:
    return {name: sc.resolve_syscall(sc.Arch.NATIVE, name) for _, name, *_ in calls}


async def probe(sandbox, calls) -> dict:
    """Make `calls` inside the sandbox; {"seccomp": mode ("2" = filtered), "results": {label: "ok" | errno name}}."""
    known = [c for c in calls if sc.resolve_syscall(sc.Arch.NATIVE, c[1]) >= 0]  # e.g. no ustat on aarch64
    script = sandbox.root_dir / "workspace" / "probe.py"
    script.write_text(PROBE)
    script.chmod(0o644)
    argv = ["python3", "/workspace/probe.py", json.dumps(_numbers(known)), json.dumps(known)]
    code, out, _ = await run(sandbox, shlex.join(argv))
    assert code == 0, out
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.parametrize("family", sorted(FAMILIES))
async def test_denied_family_fails_with_eperm(make_sandbox, family):
    sandbox = make_sandbox()
    await sandbox.start(spec())
    report = await probe(sandbox, FAMILIES[family])
    assert report["seccomp"] == "2", report  # SECCOMP_MODE_FILTER
    assert report["results"] and set(report["results"].values()) == {"EPERM"}, report


async def test_every_denied_name_fails_with_eperm(make_sandbox):
    """All of seccomp.DENIED (with all-zero arguments: harmless without capabilities), so the list cannot rot."""
    sandbox = make_sandbox()
    await sandbox.start(spec())
    calls = [(name, name, 0, 0, 0, 0, 0, 0) for names in seccomp.DENIED.values() for name in names.split()]
    report = await probe(sandbox, calls)
    assert report["seccomp"] == "2", report
    assert len(report["results"]) >= 40 and set(report["results"].values()) == {"EPERM"}, report


async def test_clone3_fails_with_enosys_and_plain_clone_works(make_sandbox):
    sandbox = make_sandbox()
    await sandbox.start(spec())
    report = await probe(sandbox, [("clone3", "clone3", None, 0), ("fork", "clone", SIGCHLD, 0, 0, 0, 0)])
    assert report["seccomp"] == "2", report
    assert report["results"] == {"clone3": "ENOSYS", "fork": "ok"}, report  # ENOSYS: glibc falls back to clone


async def test_allowed_calls_still_work(make_sandbox):
    """Debugging and introspection stay: ptrace of a child, process_vm_readv, pidfd_getfd, personality."""
    sandbox = make_sandbox()
    await sandbox.start(spec())
    script = r"""
import ctypes, os, signal
libc = ctypes.CDLL(None, use_errno=True)
pid = os.fork()
if pid == 0:
    if libc.ptrace(0, 0, None, None) != 0:  # PTRACE_TRACEME
        os._exit(3)
    os.kill(os.getpid(), signal.SIGSTOP)
    os._exit(0)
_, status = os.waitpid(pid, 0)
assert os.WIFSTOPPED(status), status  # stopped under our trace
assert libc.ptrace(7, pid, None, None) == 0, ctypes.get_errno()  # PTRACE_CONT
_, status = os.waitpid(pid, 0)
assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
class IOV(ctypes.Structure):
    _fields_ = [("base", ctypes.c_void_p), ("len", ctypes.c_size_t)]
src, dst = ctypes.create_string_buffer(b"hello"), ctypes.create_string_buffer(5)
local, remote = IOV(ctypes.addressof(dst), 5), IOV(ctypes.addressof(src), 5)
libc.process_vm_readv.restype = ctypes.c_ssize_t
n = libc.process_vm_readv(os.getpid(), ctypes.byref(local), 1, ctypes.byref(remote), 1, 0)
assert n == 5 and dst.raw == b"hello", (n, ctypes.get_errno())
pidfd = libc.syscall(434, os.getpid(), 0)  # pidfd_open (x86_64 and generic numbering)
assert pidfd >= 0, ctypes.get_errno()
fd = libc.syscall(438, pidfd, 0, 0)  # pidfd_getfd: our own stdin
assert fd >= 0, ctypes.get_errno()
assert libc.personality(0xFFFFFFFF) >= 0  # query the persona
print("allowed-ok")
"""
    (sandbox.root_dir / "workspace" / "allowed.py").write_text(script)
    code, out, _ = await run(sandbox, "python3 /workspace/allowed.py")
    assert code == 0 and "allowed-ok" in out, out


async def test_ordinary_work_is_unharmed(make_sandbox):
    sandbox = make_sandbox()
    await sandbox.start(spec())
    command = (
        "bash -c 'echo shell-ok' && "
        'python3 -c \'import threading, subprocess; t = threading.Thread(target=print, args=("thread-ok",)); '
        't.start(); t.join(); print(subprocess.run(["echo", "subprocess-ok"], capture_output=True, '
        "text=True).stdout.strip())' && "
        "(sleep 0.1 & wait) && echo background-ok && grep '^Seccomp:' /proc/self/status"
    )
    code, out, _ = await run(sandbox, command)
    assert code == 0, out
    assert out.split()[:4] == ["shell-ok", "thread-ok", "subprocess-ok", "background-ok"], out
    assert "Seccomp:\t2" in out, out


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace is not installed")
async def test_strace_works_inside_a_sandbox(make_sandbox):
    sandbox = make_sandbox()
    await sandbox.start(spec())
    code, out, _ = await run(sandbox, "strace -f -e trace=execve true 2>&1 && grep '^Seccomp:' /proc/self/status")
    assert code == 0 and "execve(" in out and "+++ exited with 0 +++" in out, out
    assert "Seccomp:\t2" in out, out


async def test_keyring_cannot_carry_a_secret_between_workspaces(make_sandbox):
    """The attack end to end: A leaves a key in the (host-shared) user keyring, B finds and reads it."""
    a, b = make_sandbox("ws-a"), make_sandbox("ws-b")
    await a.start(spec())
    await b.start(spec())
    name = f"fbx-xws-{secrets.token_hex(4)}"
    left = await probe(a, [("add_key", "add_key", "user", name, "the-secret", 10, KEY_SPEC_USER_KEYRING)])
    assert left["results"] == {"add_key": "EPERM"}, left
    code, out, _ = await run(b, "cat /proc/keys 2>&1; echo; echo end")
    assert code == 0 and name not in out and "end" in out, out
    found = await probe(
        b,
        [
            ("search", "keyctl", KEYCTL_SEARCH, KEY_SPEC_USER_KEYRING, "user", name, 0),
            ("read", "keyctl", KEYCTL_READ, KEY_SPEC_USER_KEYRING, None, 0),
        ],
    )
    assert found["results"] == {"search": "EPERM", "read": "EPERM"}, found


INT80_KEYCTL = r"""
int main(void) {
    long ret;
    /* i386 keyctl(KEYCTL_GET_KEYRING_ID, KEY_SPEC_USER_KEYRING, 0) through the 32-bit entry point */
    __asm__ volatile ("int $0x80" : "=a"(ret) : "a"(288L), "b"(0L), "c"(-4L), "d"(0L) : "memory");
    return ret < 0 ? 2 : 0;
}
"""


@pytest.mark.skipif(os.uname().machine != "x86_64" or shutil.which("gcc") is None, reason="needs gcc on x86_64")
async def test_the_i386_entry_point_cannot_reach_keyctl(make_sandbox, short_tmp):
    source = short_tmp / "int80.c"
    source.write_text(INT80_KEYCTL)
    sandbox = make_sandbox()
    binary = sandbox.root_dir / "workspace" / "int80"
    await sandbox.start(spec())
    gcc = ["gcc", "-O0", "-o", str(binary), str(source)]
    await asyncio.to_thread(subprocess.run, gcc, check=True, capture_output=True)
    binary.chmod(0o755)
    code, out, _ = await run(sandbox, "ulimit -c 0; /workspace/int80; echo rc=$?")
    assert "rc=159" in out, out  # 128 + SIGSYS: a foreign-arch syscall kills the process


@pytest.mark.skipif(os.uname().machine != "x86_64", reason="x32 is an x86_64 ABI")
async def test_x32_syscall_numbers_cannot_reach_keyctl(make_sandbox):
    sandbox = make_sandbox()
    await sandbox.start(spec())
    command = (
        "ulimit -c 0; python3 -c 'import ctypes; libc = ctypes.CDLL(None); "
        "print(libc.syscall(0x40000000 | 250, 0, -4, 0))'; echo rc=$?"  # x32 keyctl = X32 bit | 250
    )
    code, out, _ = await run(sandbox, command)
    assert "rc=159" in out, out


UNPRIVILEGED_PROBE = r"""
import asyncio, json, sys
from pathlib import Path
from durable.ports import StartSpec
from standalone.sandbox import SandboxContainer
from standalone.snapshots import SnapshotStore

async def main():
    base = Path(sys.argv[1])
    box = SandboxContainer("ns", "rootless", base / "live", base / "run", SnapshotStore(base / "snaps"))
    try:
        await box.start(StartSpec(image="hermes", instance="lite", env={}, enable_internet=False))
        command = "id -u; grep '^Seccomp:' /proc/self/status; python3 -c '%s'" % sys.argv[2]
        body = json.dumps({"request_id": "0" * 32, "command": command}).encode()
        response = await box.fetch("POST", "/exec", body=body, headers={"content-type": "application/json"})
        print(json.dumps([json.loads(line) for line in (await response.read()).splitlines()]))
    finally:
        await box.destroy()

asyncio.run(main())
"""
KEYCTL_ONE_LINER = (
    "import ctypes, os; libc = ctypes.CDLL(None, use_errno=True); "
    "print(libc.syscall({nr}, 0, -4, 0), os.strerror(ctypes.get_errno()))"
)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to switch to another unprivileged user")
def test_unprivileged_server_sandboxes_are_filtered_too(short_tmp):
    """The same filter when the server is not root (bwrap run as the server's own uid); set up like
    tests/standalone/test_sandbox.py's unprivileged-server test."""
    one_liner = KEYCTL_ONE_LINER.format(nr=sc.resolve_syscall(sc.Arch.NATIVE, "keyctl"))
    result = fx.run_as_unprivileged_server(short_tmp, 64002, UNPRIVILEGED_PROBE, one_liner)
    assert result.returncode == 0, result.stderr.decode(errors="replace")[-3000:]
    events = json.loads(result.stdout.decode().strip().splitlines()[-1])
    output = "".join(e.get("data", "") for e in events)
    assert events[-1]["exit_code"] == 0, output
    assert output.split("\n")[:3] == ["1000", "Seccomp:\t2", "-1 Operation not permitted"], output


def test_filter_is_small_and_cached():
    program = seccomp._program()
    assert program is seccomp._program() and 0 < len(program) < seccomp.PIPE_BUFFER and len(program) % 8 == 0
    fd = seccomp.filter_fd()
    try:
        assert os.read(fd, seccomp.PIPE_BUFFER) == program
    finally:
        os.close(fd)


def test_missing_libseccomp_fails_closed_with_a_clear_message(monkeypatch):
    seccomp._program.cache_clear()
    monkeypatch.setitem(sys.modules, "pyseccomp", None)  # import fails as if libseccomp/pyseccomp were missing
    try:
        with pytest.raises(seccomp.SeccompUnavailable, match="install libseccomp2"):
            seccomp.filter_fd()
    finally:
        monkeypatch.undo()
        seccomp._program.cache_clear()
