"""Every workspace runs as its own host uid (a root server), and the runtime directory cannot be planted: against
real `flarebox serve` processes."""

import hashlib
import os
import shutil
from pathlib import Path

import pytest
from e2e import put_workspace, remove_temp_dir, run_ok, short_temp_dir, started, ws_url

pytestmark = [
    pytest.mark.timeout(240),
    pytest.mark.skipif(not shutil.which("bwrap"), reason="needs bubblewrap"),
    pytest.mark.skipif(os.geteuid() != 0, reason="per-workspace host uids need a root server"),
]

OLD_SHARED_UID = 64000  # what every sandbox ran as before


def host_uid(server, client, ns: str, ws: str) -> int:
    """The host uid (= gid) the workspace's sandbox runs as: the host owner of a file it makes (its own uid_map
    cannot tell: --disable-userns nests it in a second user namespace, whose parent is bwrap's)."""
    run_ok(client, ns, ws, "touch /tmp/uid-probe")
    st = live(server, ns, ws, "tmp", "uid-probe").stat()
    assert st.st_uid == st.st_gid
    return st.st_uid


def live(server, ns: str, ws: str, *rest: str) -> Path:
    return server.data_dir.joinpath("workspaces", ns, ws, "root", *rest)


def owners(top: Path) -> set[tuple[int, int]]:
    found = {(os.lstat(top).st_uid, os.lstat(top).st_gid)}
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            st = os.lstat(os.path.join(dirpath, name))
            found.add((st.st_uid, st.st_gid))
    return found


def chown_tree(top: Path, uid: int) -> None:
    """Make a tree look like one from before per-workspace uids."""
    os.lchown(top, uid, uid)
    for dirpath, dirnames, filenames in os.walk(top):
        for name in dirnames + filenames:
            os.lchown(os.path.join(dirpath, name), uid, uid)


def test_each_workspace_has_its_own_host_uid_owning_its_files(secure_server):
    with secure_server.client() as client:
        uids = {}
        for ws in ("alpha", "beta"):
            assert put_workspace(client, "uids", ws).status_code == 201
            uids[ws] = host_uid(secure_server, client, "uids", ws)
            run_ok(client, "uids", ws, "mkdir -p /workspace/d && echo mine > /workspace/d/f && echo h > ~/h")
        assert uids["alpha"] != uids["beta"]
        for ws, uid in uids.items():
            assert 2**28 <= uid < 2**31 and uid != OLD_SHARED_UID
            assert owners(live(secure_server, "uids", ws, "workspace")) == {(uid, uid)}
            assert (live(secure_server, "uids", ws, "home", "h").stat().st_uid) == uid


def test_a_deleted_and_recreated_workspace_gets_a_new_uid(secure_server):
    with secure_server.client() as client:
        assert put_workspace(client, "uids", "again").status_code == 201
        first = host_uid(secure_server, client, "uids", "again")
        assert client.delete(ws_url("uids", "again"), params={"confirm": "true"}).status_code == 200
        assert put_workspace(client, "uids", "again").status_code == 201
        second = host_uid(secure_server, client, "uids", "again")
        assert second != first
        run_ok(client, "uids", "again", "touch /workspace/new")
        assert live(secure_server, "uids", "again", "workspace", "new").stat().st_uid == second


def test_a_snapshot_from_before_restores_writable(secure_server):
    with secure_server.client() as client:
        assert put_workspace(client, "uids", "old").status_code == 201
        uid = host_uid(secure_server, client, "uids", "old")
        assert uid != OLD_SHARED_UID
        run_ok(client, "uids", "old", "mkdir -p /workspace/d/e && echo v1 > /workspace/d/f && echo h > ~/h")
        # the snapshot the stop saves holds the old shared owner, like one taken before this change
        chown_tree(live(secure_server, "uids", "old", "workspace"), OLD_SHARED_UID)
        chown_tree(live(secure_server, "uids", "old", "home"), OLD_SHARED_UID)
        assert client.post(ws_url("uids", "old", "stop")).status_code == 200
        assert not live(secure_server, "uids", "old").exists()

        command = "echo v2 >> /workspace/d/f && touch /workspace/d/e/g ~/h && cat /workspace/d/f"
        out, events = run_ok(client, "uids", "old", command)
        assert started(events)["container"] == "restored" and out == "v1\nv2\n"
        assert owners(live(secure_server, "uids", "old", "workspace")) == {(uid, uid)}
        assert owners(live(secure_server, "uids", "old", "home")) == {(uid, uid)}


def test_a_workspace_from_before_is_adopted_at_its_next_start(start_server):
    server = start_server()
    with server.client() as client:
        assert put_workspace(client, "uids", "legacy").status_code == 201
        run_ok(client, "uids", "legacy", "mkdir -p /workspace/d && echo v1 > /workspace/d/f")
    server.stop()
    # as left by a server before this change: the shared owner, and no uid of its own
    for sub in ("workspace", "home", "tmp"):
        chown_tree(live(server, "uids", "legacy", sub), OLD_SHARED_UID)
    (server.data_dir / "workspaces" / "uids" / "legacy" / "uid").unlink()

    again = start_server(data_dir=server.data_dir)
    with again.client() as client:
        out, events = run_ok(client, "uids", "legacy", "echo v2 >> /workspace/d/f && cat /workspace/d/f")
        assert started(events)["container"] == "restarted" and out == "v1\nv2\n"
        uid = host_uid(again, client, "uids", "legacy")
        assert uid != OLD_SHARED_UID
        assert owners(live(again, "uids", "legacy", "workspace")) == {(uid, uid)}


@pytest.fixture
def short_dir():
    path = short_temp_dir()
    yield path
    remove_temp_dir(path)


def test_a_planted_runtime_dir_for_a_long_data_dir_is_not_used(start_server, short_dir):
    tmp = short_dir / "tmp"  # the server's TMPDIR, short enough for socket paths
    tmp.mkdir()
    tmp.chmod(0o1777)
    data = short_dir / ("long-" + "d" * 80) / "data"
    assert len(str(data / "run")) > 70
    attacker = short_dir / "attacker"  # a directory a local user wants root to chown and bind
    attacker.mkdir()
    (attacker / "keep").write_text("mine")
    os.chown(attacker, 4242, 4242)
    attacker.chmod(0o755)
    before = os.lstat(attacker)
    # the old fallback's predictable name, planted before the server starts
    digest = hashlib.sha256(str(data).encode()).hexdigest()[:12]
    (tmp / f"flarebox-run-{digest}").symlink_to(attacker)

    server = start_server(env={"TMPDIR": str(tmp)}, data_dir=data)
    with server.client() as client:
        assert put_workspace(client, "uids", "long").status_code == 201
        assert run_ok(client, "uids", "long", "echo ok")[0] == "ok\n"
        (private,) = [p for p in tmp.iterdir() if not p.is_symlink()]  # its own, unpredictable runtime dir
        assert private.name.startswith("flarebox-run-") and private.stat().st_mode & 0o777 == 0o700
    server.stop()

    after = os.lstat(attacker)
    assert os.listdir(attacker) == ["keep"]
    assert (after.st_uid, after.st_gid, after.st_mode) == (4242, 4242, before.st_mode)
    assert [p.name for p in tmp.iterdir()] == [f"flarebox-run-{digest}"]  # its own was removed at shutdown
