"""The seccomp filter every sandbox runs under (bwrap --seccomp FD), in the spirit of Docker's default profile.

A deny list: every syscall is allowed except the ones below, which fail with EPERM (a clean error, not a kill).
clone3 fails with ENOSYS instead, so glibc falls back to clone, whose flags the filter can inspect (clone3 passes
them in memory); clone is denied when it asks for a new namespace. Only the native architecture is in the filter:
a syscall made through another ABI (i386 `int 0x80`, x32 numbers) kills the process, so none of them can reach a
denied call by another number. ptrace, process_vm_readv/writev and pidfd_getfd stay allowed (debuggers, strace).
"""

import errno
import functools
import os

from standalone.network import data_fd

# Syscalls that fail with EPERM, by family (space-separated names); a name libseccomp does not know as a syscall of
# this architecture is skipped.
DENIED: dict[str, str] = {
    # kernel keyrings are not namespaced per workspace: one sandbox could leave or read keys for another
    "keyring": "add_key keyctl request_key",
    # large, frequently exploited kernel attack surface that an agent's workload does not need
    "io_uring": "io_uring_setup io_uring_enter io_uring_register",
    "bpf": "bpf",
    "perf": "perf_event_open",  # also leaks information about other processes on the host
    "userfaultfd": "userfaultfd",  # makes kernel race conditions easy to win
    # the host's kernel, boot and swap are not the workspace's
    "kernel_modules": "init_module finit_module delete_module create_module query_module get_kernel_syms",
    "kexec": "kexec_load kexec_file_load",
    "reboot": "reboot",
    "swap": "swapon swapoff",
    "accounting": "acct",
    # the clock is shared by the whole host (adjtimex is denied entirely, even its read-only use)
    "clock": "clock_settime clock_adjtime settimeofday stime adjtimex",
    # the mount tree was built by bwrap; nothing inside may change it
    "mount": "mount umount umount2 pivot_root move_mount open_tree fsopen fsconfig fsmount fspick mount_setattr",
    # no new or foreign namespaces (bwrap --disable-userns already stops user namespaces)
    "namespaces": "unshare setns",
    # file handles bypass the mount namespace (open_by_handle_at reaches any inode of a bound filesystem)
    "file_handles": "open_by_handle_at name_to_handle_at",
    # obsolete or host-wide interfaces, denied by Docker as well
    "obsolete": "lookup_dcookie nfsservctl quotactl quotactl_fd uselib ustat sysfs _sysctl vm86 vm86old iopl ioperm",
    "kcmp": "kcmp",  # compares kernel objects of other processes (Docker: only with CAP_SYS_PTRACE)
    "fanotify": "fanotify_init",  # filesystem-wide event monitoring (Docker: only with CAP_SYS_ADMIN)
}
# clone flags that make a new namespace: such a clone fails with EPERM
CLONE_NAMESPACE_FLAGS = (
    0x10000000,  # CLONE_NEWUSER
    0x00020000,  # CLONE_NEWNS
    0x20000000,  # CLONE_NEWPID
    0x40000000,  # CLONE_NEWNET
    0x04000000,  # CLONE_NEWUTS
    0x08000000,  # CLONE_NEWIPC
    0x02000000,  # CLONE_NEWCGROUP
)
PIPE_BUFFER = 65536  # data_fd writes the program in one go: it must fit the pipe


class SeccompUnavailable(OSError):
    """libseccomp (or pyseccomp) is missing: no sandbox may start (an OSError, so a start fails cleanly)."""


@functools.cache
def _program() -> bytes:
    """The compiled classic-BPF program (once per process)."""
    try:
        import pyseccomp as sc
    except (ImportError, OSError, RuntimeError) as exc:  # pyseccomp raises RuntimeError without libseccomp
        raise SeccompUnavailable(
            f"cannot build the sandbox seccomp filter ({exc}): install libseccomp2 (apt-get install libseccomp2) "
            "and the pyseccomp package (scripts/setup.sh does both); sandboxes do not start without the filter"
        ) from exc
    native = sc.system_arch()
    flags_arg = 1 if native in (sc.Arch.S390, sc.Arch.S390X) else 0  # clone's flags come second on s390
    filt = sc.SyscallFilter(sc.ALLOW)
    filt.set_attr(sc.Attr.ACT_BADARCH, sc.KILL_PROCESS)  # i386/x32 syscalls: no second way to a denied call
    for names in DENIED.values():
        for name in names.split():
            if sc.resolve_syscall(sc.Arch.NATIVE, name) >= 0:  # negative: unknown or not a syscall on this arch
                filt.add_rule(sc.ERRNO(errno.EPERM), name)
    filt.add_rule(sc.ERRNO(errno.ENOSYS), "clone3")
    for flag in CLONE_NAMESPACE_FLAGS:
        filt.add_rule(sc.ERRNO(errno.EPERM), "clone", sc.Arg(flags_arg, sc.MASKED_EQ, flag, flag))
    with os.fdopen(os.memfd_create("flarebox-seccomp"), "w+b") as buf:  # in memory, any size
        filt.export_bpf(buf)  # libseccomp writes to the fd itself
        buf.seek(0)
        program = buf.read()
    assert 0 < len(program) < PIPE_BUFFER, len(program)
    return program


def filter_fd() -> int:
    """A fresh pipe read end holding the filter, for `bwrap --seccomp FD` (the caller closes it)."""
    return data_fd(_program())
