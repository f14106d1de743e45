"""bwrap_argv: the sandbox's whole bubblewrap command line — binds, namespaces, environment — read as a list.

The list is parsed with bwrap's own option arities; an option the parser does not know fails the test, so a new
mount or capability option is never added without being looked at here."""

# ruff: noqa: S108 - "/tmp/..." here are bwrap arguments (paths inside the sandbox, staged sources), never opened

import pytest

from standalone.bwrap import LiveDirs, SandboxFds, SystemDir, bwrap_argv, host_system_dirs

DATA = "/srv/flarebox"
RUNTIME = f"{DATA}/run"
ROOT = f"{DATA}/workspaces/ns/ws"
LIVE = LiveDirs(f"{ROOT}/workspace", f"{ROOT}/home", f"{ROOT}/tmp")
STAGED = LiveDirs("/tmp/0", "/tmp/1", "/tmp/2")  # a root server's staged bind sources (sandbox_launch.py)
FDS = SandboxFds(passwd=11, group=12, seccomp=13, listen=14)
SYSTEM = [SystemDir("/usr"), SystemDir("/etc"), SystemDir("/bin", "usr/bin"), SystemDir("/lib64", "usr/lib64")]
PYTHON = [("/opt/py", "/opt/py"), ("/home/dev/src/protocol", "/home/dev/src/protocol")]
NET_ARGS = ["--ro-bind-data", "21", "/etc/resolv.conf"]

# bwrap options the sandbox may use, with the number of arguments each takes
ARITY = {
    "--unshare-user": 0,
    "--unshare-pid": 0,
    "--unshare-ipc": 0,
    "--unshare-uts": 0,
    "--unshare-cgroup-try": 0,
    "--unshare-net": 0,
    "--disable-userns": 0,
    "--die-with-parent": 0,
    "--new-session": 0,
    "--clearenv": 0,
    "--uid": 1,
    "--gid": 1,
    "--seccomp": 1,
    "--hostname": 1,
    "--proc": 1,
    "--dev": 1,
    "--dir": 1,
    "--remount-ro": 1,
    "--chdir": 1,
    "--symlink": 2,
    "--ro-bind": 2,
    "--bind": 2,
    "--ro-bind-data": 2,
    "--setenv": 2,
}
MOUNT_OPS = {"--symlink", "--ro-bind", "--bind", "--ro-bind-data", "--proc", "--dev", "--dir", "--remount-ro"}
NAMESPACE_FLAGS = [
    "--unshare-user",
    "--unshare-pid",
    "--unshare-ipc",
    "--unshare-uts",
    "--unshare-cgroup-try",
    "--disable-userns",
    "--die-with-parent",
    "--new-session",
    "--clearenv",
]


def build(**overrides) -> list[str]:
    args = {
        "bwrap": "/usr/bin/bwrap",
        "uid": 1000,
        "gid": 1001,
        "workspace": "ws",
        "internet": False,
        "system_dirs": SYSTEM,
        "fds": FDS,
        "network_args": [],
        "live": LIVE,
        "home": "/home/sandbox",
        "python_sources": PYTHON,
        "env": {"PATH": "/usr/bin:/bin", "HOME": "/home/sandbox"},
        "python": "/opt/py/bin/python3",
    }
    return bwrap_argv(**{**args, **overrides})


def parse(argv: list[str]) -> tuple[list[tuple[str, ...]], list[str]]:
    """(the options before `--`, each as (name, *args)), the command after it."""
    assert argv[0] == "/usr/bin/bwrap"
    ops, i = [], 1
    while argv[i] != "--":
        name = argv[i]
        assert name in ARITY, f"unexpected bwrap option {name}"
        ops.append((name, *argv[i + 1 : i + 1 + ARITY[name]]))
        i += 1 + ARITY[name]
    return ops, argv[i + 1 :]


def mounts(argv: list[str]) -> list[tuple[str, ...]]:
    return [op for op in parse(argv)[0] if op[0] in MOUNT_OPS]


def test_mounts_in_bwrap_order_with_a_private_network():
    assert mounts(build(internet=True, network_args=NET_ARGS)) == [
        ("--ro-bind", "/usr", "/usr"),
        ("--ro-bind", "/etc", "/etc"),
        ("--symlink", "usr/bin", "/bin"),
        ("--symlink", "usr/lib64", "/lib64"),
        ("--ro-bind-data", "11", "/etc/passwd"),
        ("--ro-bind-data", "12", "/etc/group"),
        ("--ro-bind-data", "21", "/etc/resolv.conf"),  # after /etc, which it covers
        ("--proc", "/proc"),
        ("--dev", "/dev"),
        ("--bind", f"{ROOT}/workspace", "/workspace"),
        ("--bind", f"{ROOT}/home", "/home/sandbox"),
        ("--bind", f"{ROOT}/tmp", "/tmp"),
        ("--dir", "/var"),
        ("--symlink", "../tmp", "/var/tmp"),
        ("--dir", "/run"),
        ("--ro-bind", "/opt/py", "/opt/py"),  # after the live dirs: a Python below /tmp stays visible
        ("--ro-bind", "/home/dev/src/protocol", "/home/dev/src/protocol"),
        ("--remount-ro", "/"),
    ]


def test_without_a_private_network_nothing_covers_resolv_conf():
    assert [m for m in mounts(build()) if m[0] == "--ro-bind-data"] == [
        ("--ro-bind-data", "11", "/etc/passwd"),
        ("--ro-bind-data", "12", "/etc/group"),
    ]


def test_staged_sources_are_bound_as_given():
    binds = [m for m in mounts(build(live=STAGED, python_sources=[("/tmp/3", "/opt/py")])) if "bind" in m[0]]
    assert ("--bind", "/tmp/0", "/workspace") in binds
    assert ("--bind", "/tmp/1", "/home/sandbox") in binds
    assert ("--bind", "/tmp/2", "/tmp") in binds
    assert ("--ro-bind", "/tmp/3", "/opt/py") in binds


@pytest.mark.parametrize("internet", [False, True])
def test_namespaces_ids_and_seccomp(internet):
    ops, _ = parse(build(internet=internet))
    names = [op[0] for op in ops]
    for flag in NAMESPACE_FLAGS:
        assert names.count(flag) == 1, flag
    assert ("--unshare-net" in names) is (not internet)
    assert ("--seccomp", "13") in ops
    assert ("--uid", "1000") in ops and ("--gid", "1001") in ops
    assert ("--hostname", "ws") in ops
    assert ("--chdir", "/workspace") in ops


def test_hostname_is_cut_to_63_characters():
    ops, _ = parse(build(workspace="w" * 80))
    assert ("--hostname", "w" * 63) in ops


def test_environment_is_cleared_and_never_carries_the_api_token():
    env = {"PATH": "/usr/bin", "SANDBOX_API_TOKEN": "secret-token", "FOO": "bar"}
    argv = build(env=env)
    ops, _ = parse(argv)
    names = [op[0] for op in ops]
    assert [op[1:] for op in ops if op[0] == "--setenv"] == [("PATH", "/usr/bin"), ("FOO", "bar")]
    assert names.index("--clearenv") < names.index("--setenv")
    assert not any("SANDBOX_API_TOKEN" in arg or "secret-token" in arg for arg in argv)


def test_runs_the_supervisor_on_the_listening_descriptor_without_site():
    _, command = parse(build(python_path=["/run/supervisor-python", "/opt/py/lib/python3.11/site-packages"]))
    assert command[:5] == ["/opt/py/bin/python3", "-I", "-S", "-B", "-c"]
    assert command[6:] == ["--listen-fd", "14", "--workdir", "/workspace"]
    boot = command[5]
    assert "sys.path += ['/run/supervisor-python', '/opt/py/lib/python3.11/site-packages']" in boot
    assert "runpy.run_module('flarebox_supervisor', run_name='__main__', alter_sys=True)" in boot


def test_tells_the_supervisor_its_ready_pipe():
    _, command = parse(build(fds=SandboxFds(passwd=11, group=12, seccomp=13, listen=14, ready=15)))
    assert command[-6:] == ["--listen-fd", "14", "--ready-fd", "15", "--workdir", "/workspace"]


@pytest.mark.parametrize(
    "overrides",
    [{}, {"internet": True}, {"internet": True, "network_args": NET_ARGS}, {"live": STAGED}],
    ids=["offline", "host-network", "private-network", "staged"],
)
def test_nothing_exposes_the_host_or_the_server(overrides):
    argv = build(**overrides)
    live = overrides.get("live", LIVE)
    ops, _ = parse(argv)
    assert not any(arg.startswith("--cap") or arg.startswith("--dev-bind") for arg in argv)
    sources = [op[1] for op in ops if op[0] in ("--bind", "--ro-bind")]
    destinations = [op[2] for op in ops if op[0] in ("--bind", "--ro-bind", "--ro-bind-data")]
    for path in sources + destinations:
        assert path not in ("/", "/root", "/proc", "/run", "/sys", "/dev", DATA, RUNTIME), path
        assert not path.startswith(("/root/", "/proc/", "/run/", "/sys/", "/dev/", RUNTIME + "/")), path
    # writable binds are exactly the three live dirs
    assert [op[1] for op in ops if op[0] == "--bind"] == [live.workspace, live.home, live.tmp]
    # /proc and /dev are bwrap's own fresh mounts, never the host's
    assert [op for op in ops if "/proc" in op or "/dev" in op] == [("--proc", "/proc"), ("--dev", "/dev")]
    mount_ops = [op for op in ops if op[0] in MOUNT_OPS]
    assert mount_ops[-1] == ("--remount-ro", "/")
    assert mount_ops.count(("--remount-ro", "/")) == 1


def test_host_system_dirs_reads_directories_and_symlinks(tmp_path):
    (tmp_path / "usr" / "bin").mkdir(parents=True)
    (tmp_path / "bin").symlink_to("usr/bin")
    paths = [str(tmp_path / name) for name in ("usr", "bin", "lib32")]
    assert host_system_dirs(paths) == [SystemDir(paths[0]), SystemDir(paths[1], "usr/bin")]
