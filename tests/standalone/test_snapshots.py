"""The snapshot store with real tar and zstd: round trips, integrity, failure atomicity, crash leftovers."""

import json
import os

import pytest
import sandbox_fixtures as fx
from sandbox_fixtures import make_mixed_tree, tree_digest

from protocol.errors import ProtocolError
from standalone.snapshots import SnapshotStore, new_snapshot_id

pytestmark = pytest.mark.timeout(120)
short_tmp, small_tmpfs = fx.short_tmp, fx.small_tmpfs  # fixtures, shared with test_sandbox.py
ROOT_ONLY = pytest.mark.skipif(os.geteuid() != 0, reason="owner preservation needs root")


@ROOT_ONLY
def test_round_trip_preserves_contents_modes_owners_links_and_empty_dirs(tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    make_mixed_tree(live)
    before = tree_digest(live)
    store = SnapshotStore(tmp_path / "store")

    info = store.create("ns", "ws", live)
    assert info.size > 0
    assert store.list("ns", "ws") == [info]

    target = tmp_path / "restored"
    store.restore("ns", "ws", info.id, target)
    after = tree_digest(target)
    assert after == before
    assert after["workspace/src/main.py"][2:4] == (64123, 64124)
    assert after["workspace/link-to-main"][2:4] == (64125, 64126)
    assert after["workspace/empty/nested"][0] == "dir"
    assert after["tmp"][1] == 0o1777


def test_restore_replaces_the_previous_target_entirely(tmp_path):
    live = tmp_path / "live"
    (live / "workspace").mkdir(parents=True)
    (live / "workspace" / "kept.txt").write_text("v1")
    store = SnapshotStore(tmp_path / "store")
    info = store.create("ns", "ws", live)

    (live / "workspace" / "kept.txt").write_text("v2")
    (live / "workspace" / "newer.txt").write_text("after the snapshot")
    store.restore("ns", "ws", info.id, live)
    assert (live / "workspace" / "kept.txt").read_text() == "v1"
    assert not (live / "workspace" / "newer.txt").exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []


def test_manifest_records_size_and_sha256_of_the_archive(tmp_path):
    import hashlib

    live = tmp_path / "live"
    live.mkdir()
    (live / "f").write_text("x" * 10000)
    store = SnapshotStore(tmp_path / "store")
    info = store.create("ns", "ws", live)
    ws_dir = tmp_path / "store" / "ns" / "ws"
    manifest = json.loads((ws_dir / f"{info.id}.json").read_text())
    archive = (ws_dir / f"{info.id}.tar.zst").read_bytes()
    assert manifest == {
        "id": info.id,
        "created_at_ms": info.created_at_ms,
        "size": len(archive),
        "sha256": hashlib.sha256(archive).hexdigest(),
        "format": "tar+zstd",
        "parent": None,  # a full save
        "level": 0,
        "deleted": False,
        "deletes": False,  # (an increment's: whether its restore must apply its directory listings)
    }
    assert archive[:4] == b"\x28\xb5\x2f\xfd"  # zstd frame magic
    assert store.verify("ns", "ws", info.id) == info


def test_damaged_archive_is_refused_and_target_untouched(tmp_path):
    live = tmp_path / "live"
    (live / "workspace").mkdir(parents=True)
    (live / "workspace" / "a.txt").write_text("snapshot content " * 1000)
    store = SnapshotStore(tmp_path / "store")
    info = store.create("ns", "ws", live)
    (live / "workspace" / "a.txt").write_text("current content")
    (live / "workspace" / "only-now").write_text("unsaved")
    before = tree_digest(live)

    archive = tmp_path / "store" / "ns" / "ws" / f"{info.id}.tar.zst"
    data = bytearray(archive.read_bytes())
    data[len(data) // 2] ^= 0x01
    archive.write_bytes(bytes(data))

    with pytest.raises(ProtocolError) as err:
        store.verify("ns", "ws", info.id)
    assert err.value.code == "snapshot_damaged"
    with pytest.raises(ProtocolError) as err:
        store.restore("ns", "ws", info.id, live)
    assert err.value.code == "snapshot_damaged"
    assert info.id in err.value.message
    assert tree_digest(live) == before
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-")] == []


def test_truncated_archive_and_missing_snapshot_are_damaged(tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    (live / "f").write_bytes(os.urandom(50_000))
    store = SnapshotStore(tmp_path / "store")
    info = store.create("ns", "ws", live)
    archive = tmp_path / "store" / "ns" / "ws" / f"{info.id}.tar.zst"
    archive.write_bytes(archive.read_bytes()[:-100])
    for snapshot_id in (info.id, new_snapshot_id()):
        with pytest.raises(ProtocolError) as err:
            store.restore("ns", "ws", snapshot_id, tmp_path / "target")
        assert err.value.code == "snapshot_damaged"
    assert not (tmp_path / "target").exists()


def test_full_disk_fails_cleanly_and_lists_nothing(tmp_path, small_tmpfs):
    live = tmp_path / "live"
    live.mkdir()
    (live / "big.bin").write_bytes(os.urandom(8 * 1024 * 1024))  # incompressible, twice the tmpfs
    store = SnapshotStore(small_tmpfs)
    small = tmp_path / "small-live"
    small.mkdir()
    (small / "note.txt").write_text("fits")
    ok = store.create("ns", "ws", small)

    with pytest.raises(ProtocolError) as err:
        store.create("ns", "ws", live)
    assert err.value.code == "snapshot_failed"
    assert "No space left on device" in err.value.message
    assert store.list("ns", "ws") == [ok]
    leftovers = sorted(p.name for p in (small_tmpfs / "ns" / "ws").iterdir())
    assert leftovers == [f"{ok.id}.json", f"{ok.id}.tar.zst"]
    store.verify("ns", "ws", ok.id)


def test_crash_leftovers_are_ignored_then_cleaned(tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    (live / "f").write_text("x")
    store = SnapshotStore(tmp_path / "store")
    info = store.create("ns", "ws", live)
    ws_dir = tmp_path / "store" / "ns" / "ws"
    orphan = new_snapshot_id()
    (ws_dir / f".tmp-{orphan}.tar.zst").write_bytes(b"half")
    (ws_dir / f"{orphan}.tar.zst").write_bytes(b"renamed but never committed")
    (ws_dir / f".tmp-{orphan}.json").write_text("{")

    assert store.list("ns", "ws") == [info]
    SnapshotStore(tmp_path / "store")  # startup cleans
    assert sorted(p.name for p in ws_dir.iterdir()) == [f"{info.id}.json", f"{info.id}.tar.zst"]


def test_list_is_newest_first_and_delete_removes_both_files(tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    store = SnapshotStore(tmp_path / "store")
    ids = []
    for i in range(3):
        (live / "n").write_text(str(i))
        ids.append(store.create("ns", "ws", live).id)
    listed = [s.id for s in store.list("ns", "ws")]
    assert sorted(listed, reverse=True) == listed and set(listed) == set(ids)
    store.delete("ns", "ws", ids[1])
    assert {s.id for s in store.list("ns", "ws")} == {ids[0], ids[2]}
    assert not any(ids[1] in p.name for p in (tmp_path / "store" / "ns" / "ws").iterdir())
    assert store.list("ns", "other") == []


def test_names_and_ids_cannot_escape_the_store(tmp_path):
    store = SnapshotStore(tmp_path / "store")
    with pytest.raises(ProtocolError):
        store.list("..", "ws")
    with pytest.raises(ValueError):
        store.delete("ns", "ws", "../../etc/passwd")


def test_unusable_store_directory_is_snapshot_failed_not_a_crash(tmp_path):
    """A file where the workspace's snapshot directory belongs: the save fails cleanly with snapshot_failed."""
    store = SnapshotStore(tmp_path / "store")
    source = tmp_path / "live"
    (source / "workspace").mkdir(parents=True)
    (source / "workspace" / "a.txt").write_text("keep me")
    blocker = tmp_path / "store" / "ns" / "ws"
    blocker.parent.mkdir(parents=True, exist_ok=True)
    blocker.write_text("not a directory")
    with pytest.raises(ProtocolError) as info:
        store.create("ns", "ws", source)
    assert info.value.code == "snapshot_failed"
    assert (source / "workspace" / "a.txt").read_text() == "keep me"


def test_a_save_whose_commit_fsync_fails_is_undone_whole_and_the_previous_one_stays(tmp_path, monkeypatch):
    """The manifest's rename is the commit; the fsync of its directory after it can still fail. The save is then
    reported failed, so it must not stay listed either: listed with its archive removed, it would be a snapshot that
    can never be restored (and the newest one, so the next boot would try it)."""
    live = tmp_path / "live"
    (live / "workspace").mkdir(parents=True)
    (live / "workspace" / "a.txt").write_text("first")
    store = SnapshotStore(tmp_path / "store")
    ok = store.create("ns", "ws", live)
    (live / "workspace" / "a.txt").write_text("second")
    committed = store._write_manifest

    def commit_then_fail(ws_dir, manifest):
        committed(ws_dir, manifest)
        raise OSError(5, "Input/output error")  # as fsync_dir would, after the rename

    monkeypatch.setattr(store, "_write_manifest", commit_then_fail)
    with pytest.raises(ProtocolError) as err:
        store.create("ns", "ws", live)
    assert err.value.code == "snapshot_failed"
    monkeypatch.undo()
    assert store.list("ns", "ws") == [ok]
    assert sorted(p.name for p in (tmp_path / "store" / "ns" / "ws").iterdir()) == [
        f"{ok.id}.json",
        f"{ok.id}.tar.zst",
    ]
    target = tmp_path / "restored"
    store.restore("ns", "ws", ok.id, target)
    assert (target / "workspace" / "a.txt").read_text() == "first"
