"""Incremental snapshots (GNU tar listed-incremental chains) with real tar and zstd on real files: small increments,
exact chain restores (deletions, renames, modes, symlinks, hostile names), bounded chains, deletes of links others
need, damaged links, forks, crashes mid-save, and trees that try to make tar read or write outside them."""

import errno
import hashlib
import json
import os
import random
import stat
import subprocess
import time
from pathlib import Path

import pytest
from high_fds import move_past_select_limits, room_past_select_limits  # noqa: F401 - a fixture

from protocol.errors import ProtocolError
from standalone import snapshots
from standalone.snapshots import SnapshotStore, normalize_snar, parse_snar

pytestmark = pytest.mark.timeout(180)


def listing(root: Path) -> dict[str, tuple]:
    """Everything a restore must reproduce, per relative path: type, mode, owner, size, mtime (whole seconds, as
    tar keeps it) and sha256 of files, link targets, fifos; and which files are hard links of each other."""
    out: dict[str, tuple] = {}
    inodes: dict[int, str] = {}
    for dirpath, dirnames, filenames in os.walk(root):
        for name in dirnames + filenames:
            path = Path(dirpath) / name
            rel = os.fsdecode(path.relative_to(root))
            st = path.lstat()
            owner = (stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid)
            if stat.S_ISLNK(st.st_mode):
                out[rel] = ("link", os.readlink(path), st.st_uid, st.st_gid)
            elif stat.S_ISDIR(st.st_mode):
                out[rel] = ("dir", *owner)
            elif stat.S_ISFIFO(st.st_mode):
                out[rel] = ("fifo", *owner)
            else:
                first = inodes.setdefault(st.st_ino, rel) if st.st_nlink > 1 else rel
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                out[rel] = ("file", *owner, st.st_size, int(st.st_mtime), digest, first if first != rel else None)
    return out


def write(path: Path, data: bytes | str, mtime: float | None = None) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data.encode() if isinstance(data, str) else data)
    if mtime is not None:
        os.utime(path, (mtime, mtime))


def settle() -> None:
    """Let the kernel's coarse timestamp clock tick: files changed in the tick a save starts in are saved again by
    the next increment."""
    time.sleep(0.05)


def tree(root: Path, files: int = 200, seed: int = 1) -> None:
    rng = random.Random(seed)
    for i in range(files):
        write(root / "workspace" / f"pkg{i % 7}" / f"sub{i % 3}" / f"f{i}.py", f"print({i})\n" * rng.randint(1, 400))
    write(root / "workspace" / "data" / "blob.bin", rng.randbytes(400_000))
    (root / "home").mkdir(exist_ok=True)
    (root / "tmp").mkdir(exist_ok=True)


@pytest.fixture
def env(tmp_path):
    live = tmp_path / "live"
    live.mkdir()
    return live, SnapshotStore(tmp_path / "store"), tmp_path / "base"


def restored(store: SnapshotStore, snapshot_id: str, where: Path, ns: str = "ns", ws: str = "ws") -> dict:
    store.restore(ns, ws, snapshot_id, where)
    return listing(where)


def manifest(store: SnapshotStore, snapshot_id: str, ns: str = "ns", ws: str = "ws") -> dict:
    return json.loads((store.root / ns / ws / f"{snapshot_id}.json").read_text())


def test_an_increment_after_a_one_percent_change_is_small_and_restores_exactly(env, tmp_path):
    live, store, base = env
    tree(live)
    settle()
    full = store.create("ns", "ws", live, base_dir=base)
    assert store.live_base("ns", "ws", base) == full.id
    for i in range(2):  # 1% of the files
        write(live / "workspace" / f"pkg{i}" / "sub0" / f"f{i}.py", "changed\n")
    want = listing(live)
    inc = store.create("ns", "ws", live, base_dir=base)

    assert inc.size < full.size * 0.05, (inc.size, full.size)
    assert manifest(store, inc.id)["parent"] == full.id and manifest(store, inc.id)["level"] == 1
    assert manifest(store, inc.id)["format"] == "tar+zstd+incremental"
    assert manifest(store, full.id)["parent"] is None and manifest(store, full.id)["level"] == 0
    assert store.chain("ns", "ws", inc.id) == [full.id, inc.id]
    assert store.live_base("ns", "ws", base) == inc.id
    assert sorted(p.name for p in base.iterdir()) == [f"{inc.id}.snar"]  # only the newest base is kept
    assert restored(store, inc.id, tmp_path / "out") == want
    store.verify("ns", "ws", inc.id)


def mutations(live: Path) -> list:
    """Changes that break naive incremental schemes, one save after each."""
    w = live / "workspace"

    def old_mtime_content_change():  # same size, mtime set back: only the ctime tells
        write(w / "pkg0" / "sub0" / "f0.py", b"X" * (w / "pkg0" / "sub0" / "f0.py").stat().st_size, mtime=1e9)

    def deletions():
        (w / "pkg1" / "sub1" / "f1.py").unlink()
        subprocess.run(["rm", "-rf", str(w / "pkg2")], check=True)

    def renames():
        (w / "pkg3" / "sub0" / "f3.py").rename(w / "pkg3" / "renamed.py")
        (w / "pkg4").rename(w / "pkg4-moved")

    def rename_directory_over_a_removed_one():  # `rm -r x && mv d x`: tar's own rename replay fails on this
        subprocess.run(["rm", "-rf", str(w / "pkg5")], check=True)
        (w / "pkg6").rename(w / "pkg5")

    def modes_and_owners():
        os.chmod(w / "pkg3" / "renamed.py", 0o751)
        os.chmod(w / "pkg0", 0o700)
        if os.geteuid() == 0:
            os.lchown(w / "pkg0" / "sub1" / "f7.py", 4242, 4343)

    def symlinks():
        (w / "link").symlink_to("pkg0/sub0/f0.py")
        (w / "dangling").symlink_to("/nowhere")
        (w / "dirlink").symlink_to("pkg0")

    def symlink_changes():
        (w / "link").unlink()
        (w / "link").symlink_to("pkg3/renamed.py")
        (w / "dirlink").unlink()
        (w / "dirlink").mkdir()  # a symlink becomes a real directory with files
        write(w / "dirlink" / "inside.txt", "real")
        (w / "pkg5" / "sub0").rename(w / "pkg5" / "sub0-old")
        (w / "pkg5" / "sub0").symlink_to("sub0-old")  # a directory becomes a symlink

    def type_swaps_hardlinks_empty_dirs_fifos():
        (w / "pkg3" / "renamed.py").unlink()
        (w / "pkg3" / "renamed.py").mkdir()
        (w / "empty" / "nested").mkdir(parents=True)
        os.link(w / "pkg0" / "sub0" / "f0.py", w / "hardlink.py")
        os.mkfifo(w / "fifo")
        write(live / "home" / ".bashrc", "export A=1\n")

    def truncate_and_grow():
        (w / "data" / "blob.bin").write_bytes(b"")
        write(w / "data" / "new.bin", os.urandom(70_000))

    def revert_names():  # a name comes back after its deletion, as a different type
        write(w / "pkg2", "now a file")
        (w / "fifo").unlink()
        (w / "empty").rename(w / "was-empty")

    return [
        old_mtime_content_change,
        deletions,
        renames,
        rename_directory_over_a_removed_one,
        modes_and_owners,
        symlinks,
        symlink_changes,
        type_swaps_hardlinks_empty_dirs_fifos,
        truncate_and_grow,
        revert_names,
    ]


def test_every_link_of_a_chain_restores_its_own_state_exactly(env, tmp_path):
    live, store, base = env
    tree(live)
    settle()
    saved = [(store.create("ns", "ws", live, base_dir=base).id, listing(live))]
    for change in mutations(live):
        change()
        saved.append((store.create("ns", "ws", live, base_dir=base).id, listing(live)))
    assert [manifest(store, i)["level"] for i, _ in saved] == list(range(len(saved)))  # one chain
    # which increments lose something their parent had (deletions, renames, a type between directory and not):
    # only those are restored with tar -G
    assert [manifest(store, i)["deletes"] for i, _ in saved] == [
        False,  # the full save
        False,  # old_mtime_content_change
        True,  # deletions
        True,  # renames
        True,  # rename_directory_over_a_removed_one
        False,  # modes_and_owners
        False,  # symlinks (only added)
        True,  # symlink_changes (a symlink became a directory, a directory a symlink)
        True,  # type_swaps_hardlinks_empty_dirs_fifos (a file became a directory)
        False,  # truncate_and_grow
        True,  # revert_names
    ]
    for n, (snapshot_id, want) in enumerate(saved):
        got = restored(store, snapshot_id, tmp_path / "out")
        assert got == want, f"snapshot {n} ({snapshot_id})"


def record_tars(monkeypatch) -> list[list[str]]:
    """The tar command lines the snapshot store starts from now on (they still run)."""
    tars: list[list[str]] = []
    real_popen = subprocess.Popen

    def popen(cmd, *args, **kwargs):
        if cmd[0] == "tar":
            tars.append(cmd)
        return real_popen(cmd, *args, **kwargs)

    monkeypatch.setattr(snapshots.subprocess, "Popen", popen)
    return tars


def test_links_that_delete_nothing_are_extracted_without_their_listings_and_restore_exactly(env, tmp_path, monkeypatch):
    """A chain whose increments only add and replace (a directory's mode and mtime, a file becoming an absolute
    symlink and back, one name of a hard-linked pair replaced) is extracted without tar -G, one tar per link, and
    every link's state comes back exactly (one tar over the whole chain would bring back the symlink tar deferred
    in the full base, in place of the file the next link put there)."""
    live, store, base = env
    tree(live, files=30)
    w = live / "workspace"
    os.link(w / "pkg0" / "sub0" / "f0.py", w / "pkg0" / "twin.py")
    (w / "abs").symlink_to("/etc/hostname")
    settle()
    saved = [(store.create("ns", "ws", live, base_dir=base).id, listing(live))]

    def step1():
        os.chmod(w / "pkg1", 0o750)
        os.utime(w / "pkg1", (1e9, 1e9))
        (w / "pkg2" / "sub2" / "f2.py").unlink()
        (w / "pkg2" / "sub2" / "f2.py").symlink_to("/nowhere/at/all")  # deferred by tar: an absolute target
        (w / "abs").unlink()
        write(w / "abs", "a file now")
        write(w / "new.txt", "added")

    def step2():
        os.chmod(w / "pkg1", 0o711)
        (w / "pkg2" / "sub2" / "f2.py").unlink()
        write(w / "pkg2" / "sub2" / "f2.py", "a file again")
        replacement = w / "pkg0" / "replacement"
        write(replacement, "new inode for one name of the pair")
        replacement.rename(w / "pkg0" / "sub0" / "f0.py")  # twin.py keeps the old contents
        write(w / "pkg1" / "later" / "deep.txt", "in a new directory")

    for step in (step1, step2):
        settle()
        step()
        saved.append((store.create("ns", "ws", live, base_dir=base).id, listing(live)))
    assert [manifest(store, i)["deletes"] for i, _ in saved] == [False, False, False]

    tars = record_tars(monkeypatch)
    for snapshot_id, want in saved:
        tars.clear()
        assert restored(store, snapshot_id, tmp_path / "out") == want
        assert len(tars) == len(store.chain("ns", "ws", snapshot_id))
        assert not any(arg.startswith("--listed-incremental") for cmd in tars for arg in cmd)


def test_an_increment_that_deletes_gets_a_tar_of_its_own(env, tmp_path, monkeypatch):
    live, store, base = env
    tree(live)
    settle()  # (else the next increment saves the whole tree again, and the one after is full)
    first = store.create("ns", "ws", live, base_dir=base)
    write(live / "workspace" / "added.txt", "x")
    second = store.create("ns", "ws", live, base_dir=base)
    (live / "workspace" / "pkg0" / "sub0" / "f0.py").unlink()
    third = store.create("ns", "ws", live, base_dir=base)
    write(live / "workspace" / "again.txt", "y")
    fourth = store.create("ns", "ws", live, base_dir=base)
    want = listing(live)
    assert [manifest(store, s.id)["level"] for s in (first, second, third, fourth)] == [0, 1, 2, 3]
    assert [manifest(store, s.id)["deletes"] for s in (first, second, third, fourth)] == [False, False, True, False]
    tars = record_tars(monkeypatch)
    assert restored(store, fourth.id, tmp_path / "out") == want
    assert ["--listed-incremental=/dev/null" in cmd for cmd in tars] == [False, False, True, False]


def test_a_manifest_without_the_deletes_field_is_restored_with_its_listings(env, tmp_path):
    """Snapshots saved before the field existed: every increment applies its directory listings, as before."""
    live, store, base = env
    tree(live, files=30)
    store.create("ns", "ws", live, base_dir=base)
    (live / "workspace" / "pkg0" / "sub0" / "f0.py").unlink()
    inc = store.create("ns", "ws", live, base_dir=base)
    path = store.root / "ns" / "ws" / f"{inc.id}.json"
    old = {k: v for k, v in json.loads(path.read_text()).items() if k != "deletes"}
    path.write_text(json.dumps(old))
    assert restored(store, inc.id, tmp_path / "out") == listing(live)


def test_snar_deletes_compares_every_directory_listing():
    def snar(*dirs):
        body = b"1\x002\x00"
        for ino, (name, entries) in enumerate(dirs):
            body += b"0\x001\x002\x003\x00%d\x00" % ino + name + b"\x00"
            body += b"".join(e + b"\x00" for e in entries) + b"\x00\x00"
        return parse_snar(b"GNU tar-1.34-2\n" + body)

    parent = snar((b".", [b"Dd", b"Yf"]), (b"./d", [b"Ng"]))
    assert not snapshots.snar_deletes(parent, parent)
    assert not snapshots.snar_deletes(parent, snar((b".", [b"Dd", b"Nf", b"Ynew"]), (b"./d", [b"Yg", b"Dsub"])))
    assert snapshots.snar_deletes(parent, snar((b".", [b"Dd"]), (b"./d", [b"Ng"])))  # f gone
    assert snapshots.snar_deletes(parent, snar((b".", [b"Dd", b"Df"]), (b"./d", [b"Ng"])))  # f now a directory
    assert snapshots.snar_deletes(parent, snar((b".", [b"Yd", b"Yf"])))  # d now a file, its listing gone
    assert snapshots.snar_deletes(parent, snar((b".", [b"Dd", b"Yf"]), (b"./d", [b"Ng", b"Rrenamed"])))
    assert snapshots.snar_deletes(snar((b".", [b"Dd", b"Yf"]), (b"./d", [b"Tx"])), parent)  # flags tar's renames use
    assert not snapshots.snar_deletes(snar((b".", [b"Yf", b"Dd"])), snar((b".", [b"Dd", b"Nf"])))  # any order


def test_the_archive_is_queued_for_writeback_before_its_fsync(env, monkeypatch):
    """The fsync at the end waits only for what is not on its way to the disk yet: every byte was handed to
    writeback as it was hashed (in steps, when zstd is slower than the hash)."""
    live, store, base = env
    tree(live, files=30)
    write(live / "workspace" / "big.bin", os.urandom(20 << 20))
    calls = []
    real_writeback = snapshots._start_writeback
    monkeypatch.setattr(snapshots, "_start_writeback", lambda fd, offset, length: calls.append((offset, length)))
    real_fsync = os.fsync
    monkeypatch.setattr(snapshots.os, "fsync", lambda fd: (calls.append("fsync"), real_fsync(fd)))
    info = store.create("ns", "ws", live, base_dir=base)
    ranges = calls[: calls.index("fsync")]  # the archive's own fsync is the first
    assert ranges and ranges[0][0] == 0
    assert all(a + n == b for (a, n), (b, _) in zip(ranges, ranges[1:], strict=False))
    assert ranges[-1][0] + ranges[-1][1] == info.size
    store.verify("ns", "ws", info.id)
    fd = os.open(os.devnull, os.O_WRONLY)
    real_writeback(fd, 0, 1)  # harmless where it does not apply
    os.close(fd)


def test_restore_then_change_then_save_is_an_increment_of_the_restored_snapshot(env, tmp_path):
    live, store, base = env
    tree(live)
    first = store.create("ns", "ws", live, base_dir=base)
    state_first = listing(live)
    write(live / "workspace" / "later.txt", "after the first save")
    second = store.create("ns", "ws", live, base_dir=base)

    # roll back to the first: the base is forgotten before the tree is replaced, then tracked again
    store.forget(base)
    assert store.live_base("ns", "ws", base) is None
    store.restore("ns", "ws", first.id, live)
    settle()  # (the restored files are new inodes, just made)
    store.track("ns", "ws", first.id, live, base)
    assert store.live_base("ns", "ws", base) == first.id
    assert listing(live) == state_first

    write(live / "workspace" / "pkg1" / "sub1" / "f1.py", "diverged\n")
    (live / "workspace" / "pkg2" / "sub2" / "f2.py").unlink()
    want = listing(live)
    third = store.create("ns", "ws", live, base_dir=base)
    assert manifest(store, third.id)["parent"] == first.id  # a sibling of `second`, not its child
    assert third.size < first.size * 0.05  # the stat walk made the restored files count as unchanged
    assert restored(store, third.id, tmp_path / "a") == want
    assert "later.txt" in str(restored(store, second.id, tmp_path / "b"))
    assert "workspace/later.txt" not in restored(store, third.id, tmp_path / "c")


def test_the_base_survives_a_new_store_instance(env, tmp_path):
    """A server restart on a surviving disk: the next save is still an increment."""
    live, store, base = env
    tree(live)
    first = store.create("ns", "ws", live, base_dir=base)
    write(live / "workspace" / "x.txt", "x")
    again = SnapshotStore(store.root)
    inc = again.create("ns", "ws", live, base_dir=base)
    assert manifest(again, inc.id)["parent"] == first.id


def test_a_save_without_a_usable_base_is_full(env):
    live, store, base = env
    tree(live)
    first = store.create("ns", "ws", live, base_dir=base)
    store.delete("ns", "ws", first.id)  # no dependents: gone at once, and with it the base
    second = store.create("ns", "ws", live, base_dir=base)
    assert manifest(store, second.id)["parent"] is None
    (base / f"{second.id}.snar").rename(base / "s-0000000000001-abcdef.snar")  # names no snapshot
    assert store.live_base("ns", "ws", base) is None
    third = store.create("ns", "ws", live)  # no base_dir: plain full
    assert manifest(store, third.id)["parent"] is None


def test_a_torn_base_makes_the_next_save_full_not_failed(env, tmp_path):
    """A crash may leave the base's snar (written without fsync) torn: it is ignored."""
    live, store, base = env
    tree(live)
    first = store.create("ns", "ws", live, base_dir=base)
    snar = base / f"{first.id}.snar"
    snar.write_bytes(snar.read_bytes()[: snar.stat().st_size // 2])
    assert store.live_base("ns", "ws", base) is None
    second = store.create("ns", "ws", live, base_dir=base)
    assert manifest(store, second.id)["parent"] is None
    assert store.live_base("ns", "ws", base) == second.id
    assert restored(store, second.id, tmp_path / "out") == listing(live)


def test_an_increment_whose_snar_tar_left_unreadable_restores_with_its_listings(env, monkeypatch, tmp_path):
    """The new snar is what tells whether an increment deletes anything: one that does not parse cannot say, so
    the increment is marked as deleting (restored with -G, always right) and the next save is full."""
    live, store, base = env
    tree(live, files=30)
    store.create("ns", "ws", live, base_dir=base)
    real = SnapshotStore._write_archive

    def tearing(self, source, target, snar_args):
        out = real(self, source, target, snar_args)
        snar = Path(snar_args[0].partition("=")[2])
        snar.write_bytes(snar.read_bytes()[:-3])
        return out

    monkeypatch.setattr(SnapshotStore, "_write_archive", tearing)
    (live / "workspace" / "pkg0" / "sub0" / "f0.py").unlink()
    inc = store.create("ns", "ws", live, base_dir=base)
    assert manifest(store, inc.id)["parent"] is not None and manifest(store, inc.id)["deletes"] is True
    assert store.live_base("ns", "ws", base) is None
    assert restored(store, inc.id, tmp_path / "out") == listing(live)


def test_a_chain_at_its_bound_starts_a_new_full_save(env, monkeypatch, tmp_path):
    live, store, base = env
    tree(live)
    settle()
    monkeypatch.setattr(snapshots, "MAX_CHAIN", 3)
    ids = []
    for i in range(5):
        write(live / "workspace" / f"n{i}.txt", str(i))
        ids.append(store.create("ns", "ws", live, base_dir=base).id)
    assert [manifest(store, i)["level"] for i in ids] == [0, 1, 2, 0, 1]
    assert manifest(store, ids[3])["parent"] is None

    # increments adding up to more than half of the base's size also end the chain
    monkeypatch.setattr(snapshots, "MAX_CHAIN", 32)
    write(live / "workspace" / "big.bin", os.urandom(3_000_000))
    big = store.create("ns", "ws", live, base_dir=base)
    assert manifest(store, big.id)["level"] == 2
    write(live / "workspace" / "tiny.txt", "t")
    after = store.create("ns", "ws", live, base_dir=base)
    assert manifest(store, after.id)["level"] == 0
    assert restored(store, after.id, tmp_path / "out") == listing(live)


def test_deleting_a_link_others_need_unlists_it_and_keeps_them_restorable(env, tmp_path):
    live, store, base = env
    tree(live)
    settle()
    ids, states = [], []
    for i in range(3):
        write(live / "workspace" / f"step{i}.txt", str(i))
        ids.append(store.create("ns", "ws", live, base_dir=base).id)
        states.append(listing(live))
    ws_dir = store.root / "ns" / "ws"

    store.delete("ns", "ws", ids[1])  # the middle link
    assert [s.id for s in store.list("ns", "ws")] == [ids[2], ids[0]]
    assert (ws_dir / f"{ids[1]}.tar.zst").exists() and manifest(store, ids[1])["deleted"] is True
    assert restored(store, ids[2], tmp_path / "a") == states[2]
    with pytest.raises(ProtocolError) as err:
        store.restore("ns", "ws", ids[1], tmp_path / "b")  # unlisted means unlisted
    assert err.value.code == "snapshot_damaged"
    store.verify("ns", "ws", ids[2])

    store.delete("ns", "ws", ids[0])  # the base: still needed by ids[2]
    assert [s.id for s in store.list("ns", "ws")] == [ids[2]]
    assert restored(store, ids[2], tmp_path / "c") == states[2]
    SnapshotStore(store.root)  # a startup's collection keeps what is needed
    assert restored(store, ids[2], tmp_path / "d") == states[2]

    store.delete("ns", "ws", ids[2])  # the last listed one: the whole chain goes
    assert sorted(p.name for p in ws_dir.iterdir()) == []


def test_startup_collects_unlisted_links_nobody_needs(env):
    live, store, base = env
    tree(live)
    first = store.create("ns", "ws", live, base_dir=base)
    second = store.create("ns", "ws", live, base_dir=base)
    ws_dir = store.root / "ns" / "ws"
    # as a crash between the two steps of a delete would leave it: both unlisted, the archives still there
    for snapshot_id in (first.id, second.id):
        data = manifest(store, snapshot_id)
        (ws_dir / f"{snapshot_id}.json").write_text(json.dumps({**data, "deleted": True}))
    assert store.list("ns", "ws") == []
    SnapshotStore(store.root)
    assert list(ws_dir.iterdir()) == []


def damage(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def test_a_damaged_link_is_snapshot_damaged_and_the_target_untouched(env, tmp_path):
    live, store, base = env
    tree(live)
    first = store.create("ns", "ws", live, base_dir=base)
    write(live / "workspace" / "x.txt", "x")
    second = store.create("ns", "ws", live, base_dir=base)
    write(live / "workspace" / "y.txt", "unsaved")
    before = listing(live)
    damage(store.root / "ns" / "ws" / f"{first.id}.tar.zst")

    for call in (lambda: store.verify("ns", "ws", second.id), lambda: store.restore("ns", "ws", second.id, live)):
        with pytest.raises(ProtocolError) as err:
            call()
        assert err.value.code == "snapshot_damaged"
        assert second.id in err.value.message and first.id in err.value.message
    assert listing(live) == before
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".tmp-")]

    (store.root / "ns" / "ws" / f"{first.id}.tar.zst").unlink()  # a lost link
    with pytest.raises(ProtocolError) as err:
        store.restore("ns", "ws", second.id, live)
    assert err.value.code == "snapshot_damaged" and first.id in err.value.message
    assert listing(live) == before


def test_a_failed_save_keeps_the_previous_base_and_snapshots(env, monkeypatch):
    live, store, base = env
    tree(live)
    first = store.create("ns", "ws", live, base_dir=base)
    snar_before = (base / f"{first.id}.snar").read_bytes()

    def broken(*args):
        raise snapshots._PipelineError("tar failed (2): simulated")

    monkeypatch.setattr(store, "_write_archive", broken)
    with pytest.raises(ProtocolError) as err:
        store.create("ns", "ws", live, base_dir=base)
    assert err.value.code == "snapshot_failed"
    assert [s.id for s in store.list("ns", "ws")] == [first.id]
    assert sorted(p.name for p in base.iterdir()) == [f"{first.id}.snar"]
    assert (base / f"{first.id}.snar").read_bytes() == snar_before
    monkeypatch.undo()
    assert manifest(store, store.create("ns", "ws", live, base_dir=base).id)["parent"] == first.id


@pytest.mark.parametrize("cross_device", [False, True])
def test_a_clone_outlives_its_source(env, tmp_path, monkeypatch, cross_device):
    live, store, base = env
    tree(live)
    first = store.create("ns", "ws", live, base_dir=base)
    write(live / "workspace" / "x.txt", "x")
    second = store.create("ns", "ws", live, base_dir=base)
    want = listing(live)
    if cross_device:

        def no_link(src, dst):
            raise OSError(errno.EXDEV, os.strerror(errno.EXDEV))

        monkeypatch.setattr(os, "link", no_link)

    info = store.clone("ns", "ws", second.id, "ns", "fork")
    monkeypatch.undo()
    assert info.id == second.id and info.size == second.size
    assert [s.id for s in store.list("ns", "fork")] == [second.id]  # the base link is there, unlisted
    src = store.root / "ns" / "ws" / f"{first.id}.tar.zst"
    dst = store.root / "ns" / "fork" / f"{first.id}.tar.zst"
    assert (src.stat().st_ino == dst.stat().st_ino) is not cross_device
    assert store.clone("ns", "ws", second.id, "ns", "fork") == info  # again: nothing changes

    for snapshot_id in (first.id, second.id):
        store.delete("ns", "ws", snapshot_id)
    assert list((store.root / "ns" / "ws").iterdir()) == []
    store.verify("ns", "fork", second.id)
    assert restored(store, second.id, tmp_path / "out", ws="fork") == want


def test_clone_of_an_unknown_or_unlisted_snapshot_is_not_found(env):
    live, store, base = env
    tree(live)
    first = store.create("ns", "ws", live, base_dir=base)
    store.create("ns", "ws", live, base_dir=base)
    store.delete("ns", "ws", first.id)  # unlisted, kept for its dependent
    for snapshot_id in (first.id, snapshots.new_snapshot_id()):
        with pytest.raises(ProtocolError) as err:
            store.clone("ns", "ws", snapshot_id, "ns", "fork")
        assert err.value.code == "snapshot_not_found"
    assert store.list("ns", "fork") == []


def test_a_hostile_tree_saves_and_restores_exactly_and_nothing_outside_is_touched(env, tmp_path):
    """Symlink loops, symlinks to /etc, to a fifo and to a directory outside the tree, names with newlines and
    control characters, very long names; then the outside-pointing symlink becomes a directory full of files."""
    live, store, base = env
    tree(live, files=10)
    outside = tmp_path / "outside"
    outside.mkdir()
    marker = os.urandom(32).hex()
    write(outside / "secret.txt", marker)
    os.mkfifo(outside / "fifo")  # tar would block for ever if it opened this through a symlink
    w = live / "workspace"
    (w / "loop-a").symlink_to("loop-b")
    (w / "loop-b").symlink_to("loop-a")
    (w / "self").symlink_to(".")
    (w / "etc").symlink_to("/etc")
    (w / "to-outside").symlink_to(outside)
    (w / "to-fifo").symlink_to(outside / "fifo")
    (w / "up").symlink_to("../../../../../../")
    write(w / "new\nline\n.txt", "newline")
    write(w / "tab\tand\x01ctl and \\ backslash", "ctl")
    write(w / ("L" * 255), "long name")
    deep = w
    for i in range(12):  # a path of some 2700 bytes: far past tar's own header fields
        deep = deep / (f"{i:02d}" * 110)
    deep.mkdir(parents=True)
    write(deep / ("Z" * 200), "deep")
    saved = [(store.create("ns", "ws", live, base_dir=base).id, listing(live))]

    (w / "to-outside").unlink()
    (w / "to-outside").mkdir()  # at the next restore, the symlink of the previous link must not lead outside
    write(w / "to-outside" / "secret.txt", "overwritten?")
    write(w / "to-outside" / "new.txt", "new")
    (w / "etc").unlink()
    (w / "etc").mkdir()
    write(w / "etc" / "passwd", "not the host's")
    write(w / "new\nline\n.txt", "changed")
    (w / "self").unlink()
    saved.append((store.create("ns", "ws", live, base_dir=base).id, listing(live)))
    (w / "to-outside").rename(w / "moved")
    (w / "to-outside").symlink_to(outside)  # and back to a symlink
    saved.append((store.create("ns", "ws", live, base_dir=base).id, listing(live)))

    etc_passwd = Path("/etc/passwd").read_bytes()
    for snapshot_id, want in saved:
        assert restored(store, snapshot_id, tmp_path / "out") == want
    assert sorted(p.name for p in outside.iterdir()) == ["fifo", "secret.txt"]
    assert (outside / "secret.txt").read_text() == marker
    assert Path("/etc/passwd").read_bytes() == etc_passwd
    for snapshot_id, _ in saved:  # the outside files' contents were never read into any archive
        archive = store.root / "ns" / "ws" / f"{snapshot_id}.tar.zst"
        plain = subprocess.run(["zstd", "-d", "-q", "-c", str(archive)], capture_output=True, check=True).stdout
        assert marker.encode() not in plain
        assert b"root:x:0:0" not in plain


def test_normalize_snar_zeroes_devices_and_moves_the_dump_time_back():
    name = b"./work\nspace"
    data = b"GNU tar-1.34-2\n100\x00500\x00" + b"0\x0099\x007\x0065024\x0042\x00" + name + b"\x00Yf\x00Dd\x00\x00\x00"
    data += b"1\x0098\x000\x0065024\x0043\x00.\x00\x00\x00"
    out = normalize_snar(parse_snar(data), not_after_ns=100 * 10**9 + 500 - 600)
    assert out == (
        b"GNU tar-1.34-2\n99\x00999999900\x00"
        + b"0\x0099\x007\x000\x0042\x00"
        + name
        + b"\x00Yf\x00Dd\x00\x00\x00"
        + b"1\x0098\x000\x000\x0043\x00.\x00\x00\x00"
    )
    assert normalize_snar(parse_snar(data), 200 * 10**9)[15:23] == b"100\x00500\x00"  # never later than tar's own
    head = b"GNU tar-1.34-2\n1\x002\x00"
    for bad in (
        b"",
        b"GNU tar-1.34-1\n1\x002\x00",
        data[:-3],
        head + b"x\x00",
        head + b"0\x00\x007\x0065024\x0042\x00.\x00\x00\x00",  # a directory record with an empty number
        head + b"0\x0099\x007\x006502x\x0042\x00.\x00\x00\x00",  # one that is not a number
        head + b"0\x0099\x007\x0065024\x0042\x00.\x00Yf\x00",  # one that never ends
    ):
        with pytest.raises(ValueError):
            parse_snar(bad)


def test_a_kernel_without_pidfds_still_saves_and_restores(env, monkeypatch, tmp_path):
    """The archive's hash waits on zstd's exit through a pidfd; without one it polls, with the same result."""
    live, store, base = env
    tree(live, files=30)
    monkeypatch.setattr(snapshots, "_exit_fd", lambda pid: None)
    full = store.create("ns", "ws", live, base_dir=base)
    (live / "workspace" / "pkg0" / "sub0" / "f1.py").write_text("changed\n")
    inc = store.create("ns", "ws", live, base_dir=base)
    assert manifest(store, inc.id)["parent"] == full.id
    assert restored(store, inc.id, tmp_path / "out") == listing(live)


@pytest.mark.usefixtures("room_past_select_limits")
def test_the_hash_waits_on_zstd_through_a_descriptor_past_select_limits(env, monkeypatch, tmp_path):
    """A server with many workspaces holds descriptors numbered past 1024, where select() refuses one."""
    live, store, base = env
    tree(live, files=30)
    real = snapshots._exit_fd

    def numbered_high(pid):
        fd = real(pid)
        if fd is None:
            pytest.skip("no pidfds on this kernel")
        return move_past_select_limits(fd)

    monkeypatch.setattr(snapshots, "_exit_fd", numbered_high)
    saved = store.create("ns", "ws", live, base_dir=base)
    assert restored(store, saved.id, tmp_path / "out") == listing(live)
