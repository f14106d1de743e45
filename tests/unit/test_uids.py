"""The server's host uid range (standalone/uids.py): choice, persistence and validation, the host-wide claim,
allocation that never reuses an id, and adopting a workspace's files to its uid."""

import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from standalone import uids
from standalone.sandbox_driver import MAX_RUNTIME_DIR, runtime_dir
from standalone.uids import RANGE_SIZE, UidRange, UidRangeError, UnsafeDirError, adopt_tree

root_only = pytest.mark.skipif(os.geteuid() != 0, reason="chown needs root")


@pytest.fixture
def data(tmp_path) -> Path:
    path = tmp_path / "data"
    path.mkdir()
    return path


@pytest.fixture
def claims(tmp_path) -> Path:
    return tmp_path / "run" / "uid-ranges"


@pytest.fixture
def make_range(data, claims):
    made: list[UidRange] = []

    def make(data_dir: Path = data) -> UidRange:
        made.append(UidRange(data_dir, claims))
        return made[-1]

    yield make
    for uid_range in made:
        uid_range.close()


def workspace(data: Path, name: str) -> Path:
    path = data / "workspaces" / "ns" / name
    path.mkdir(parents=True)
    return path


# --- the range -------------------------------------------------------------------------------------------------


def test_first_start_chooses_an_aligned_base_high_above_system_ids_and_keeps_it(data, make_range):
    first = make_range()
    assert first.base % RANGE_SIZE == 0 and 2**28 <= first.base and first.base + RANGE_SIZE <= 2**31
    assert (data / "uid-range").read_text().strip() == str(first.base)
    assert (data / "uid-range").stat().st_mode & 0o777 == 0o644
    first.close()
    assert make_range().base == first.base  # a restart keeps the range


def test_bases_are_random(tmp_path, claims):
    bases = set()
    for i in range(8):
        (tmp_path / str(i)).mkdir()
        uid_range = UidRange(tmp_path / str(i), claims)
        bases.add(uid_range.base)
        uid_range.close()
    assert len(bases) > 1


@pytest.mark.parametrize("content", ["", "banana", str(2**28 + 5), str(2**27), str(2**31), "-1048576"])
def test_a_corrupt_range_file_is_a_clear_error(data, make_range, content):
    (data / "uid-range").write_text(content)
    with pytest.raises(UidRangeError, match="uid-range.*fix or remove it"):
        make_range()


def test_claim_dirs_are_private_and_a_planted_symlink_is_refused(tmp_path, make_range, claims):
    make_range()
    assert claims.stat().st_mode & 0o777 == 0o700 and claims.parent.stat().st_mode & 0o777 == 0o755
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    planted = tmp_path / "planted" / "uid-ranges"
    planted.parent.mkdir()
    planted.symlink_to(elsewhere)
    (tmp_path / "other").mkdir()
    with pytest.raises(UnsafeDirError, match="not a plain directory"):
        UidRange(tmp_path / "other", planted)
    assert list(elsewhere.iterdir()) == []


# --- the runtime dir ------------------------------------------------------------------------------------------


def test_runtime_dir_is_data_run_private_and_never_a_planted_symlink(tmp_path):
    short = tmp_path / "d"
    short.mkdir()
    if len(str(short / "run")) > MAX_RUNTIME_DIR:
        pytest.skip("the temp dir's path is too long")
    (short / "run").mkdir(mode=0o777)
    assert runtime_dir(short) == short / "run" and (short / "run").stat().st_mode & 0o777 == 0o700
    planted = tmp_path / "p"
    planted.mkdir()
    (planted / "run").symlink_to(tmp_path)
    with pytest.raises(UnsafeDirError):
        runtime_dir(planted)


def test_runtime_dir_for_a_long_data_dir_is_fresh_and_private(tmp_path):
    long = tmp_path / ("x" * MAX_RUNTIME_DIR)
    first, second = runtime_dir(long), runtime_dir(long)
    try:
        assert first != second and first.name.startswith("flarebox-run-")
        assert first.stat().st_mode & 0o777 == 0o700 and first.stat().st_uid == os.geteuid()
    finally:
        first.rmdir()
        second.rmdir()


# --- the claim -------------------------------------------------------------------------------------------------

HOLD = textwrap.dedent(
    """
    import sys
    from pathlib import Path
    from standalone.uids import UidRange
    held = UidRange(Path(sys.argv[1]), Path(sys.argv[2]))
    print(held.base, flush=True)
    sys.stdin.read()
    """
)


def test_a_range_held_by_another_server_is_refused_with_the_holder_and_a_way_out(tmp_path, claims, make_range):
    holder_data = tmp_path / "holder"
    holder_data.mkdir()
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(holder_data), str(claims)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
    )
    try:
        base = int(holder.stdout.readline())
        copy = tmp_path / "copy"  # e.g. a data dir copied from the running server's
        copy.mkdir()
        shutil.copy(holder_data / "uid-range", copy / "uid-range")
        with pytest.raises(UidRangeError) as caught:
            make_range(copy)
        message = str(caught.value)
        assert f"uid range {base}-" in message and str(holder_data) in message
        assert str(copy / "uid-range") in message and "stop it" in message
    finally:
        holder.stdin.close()
        holder.wait(10)
    assert make_range(copy).base == base  # the kernel dropped the claim with its holder


def test_two_claims_in_one_process_collide_too_and_close_releases(data, make_range):
    first = make_range()
    with pytest.raises(UidRangeError, match="another flarebox server"):
        make_range()
    first.close()
    assert make_range().base == first.base


def test_a_fresh_server_skips_a_claimed_base(tmp_path, claims, monkeypatch):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    taken = UidRange(tmp_path / "a", claims)
    picks = iter([taken.base, taken.base + RANGE_SIZE if taken.base + RANGE_SIZE < 2**31 else 2**28])
    monkeypatch.setattr(uids, "random_base", lambda: next(picks))
    fresh = UidRange(tmp_path / "b", claims)
    try:
        assert fresh.base != taken.base
        assert (tmp_path / "b" / "uid-range").read_text().strip() == str(fresh.base)
    finally:
        fresh.close()
        taken.close()


# --- allocation ------------------------------------------------------------------------------------------------


def test_allocation_skips_index_0_grows_and_never_reuses_after_a_workspace_is_removed(data, make_range):
    uid_range = make_range()
    a = uid_range.uid_for(workspace(data, "a"))
    assert a == uid_range.base + 1  # index 0 is reserved
    assert uid_range.uid_for(data / "workspaces" / "ns" / "a") == a  # kept in the workspace dir
    assert (data / "workspaces" / "ns" / "a" / "uid").read_text().strip() == str(a)
    b = uid_range.uid_for(workspace(data, "b"))
    assert b == a + 1
    shutil.rmtree(data / "workspaces" / "ns" / "a")  # deleted ...
    uid_range.close()
    again = make_range()  # ... across a restart too
    assert again.uid_for(workspace(data, "a")) == b + 1  # ... and re-created: a new uid
    assert (data / "uid-next").read_text().strip() == str(b + 2 - again.base)


def test_a_stored_uid_outside_the_range_is_replaced(data, make_range):
    uid_range = make_range()
    ws = workspace(data, "old")
    (ws / "uid").write_text("64000\n")
    assert uid_range.uid_for(ws) == uid_range.base + 1


def test_the_end_of_the_range_is_a_clear_error(data, make_range):
    uid_range = make_range()
    (data / "uid-next").write_text(f"{RANGE_SIZE - 1}\n")
    assert uid_range.allocate() == uid_range.base + RANGE_SIZE - 1
    with pytest.raises(UidRangeError, match="are used"):
        uid_range.allocate()


@pytest.mark.parametrize("content", ["0", "zz", str(RANGE_SIZE + 1)])
def test_a_corrupt_counter_is_a_clear_error(data, make_range, content):
    uid_range = make_range()
    (data / "uid-next").write_text(content)
    with pytest.raises(UidRangeError, match="uid-next"):
        uid_range.allocate()


# --- adopting files --------------------------------------------------------------------------------------------

UID = 2**28 + 7


def owner(path: Path) -> tuple[int, int]:
    st = os.lstat(path)
    return st.st_uid, st.st_gid


@root_only
def test_adopt_tree_gives_everything_to_the_uid_and_never_follows_a_symlink(tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret").write_text("x")
    os.chown(outside / "secret", 0, 0)
    root = tmp_path / "root"
    for sub in ("workspace/d/e", "home", "tmp"):
        (root / sub).mkdir(parents=True)
    (root / "workspace" / "d" / "f").write_text("f")
    (root / "home" / "h").write_text("h")
    (root / "workspace" / "out").symlink_to(outside)
    (root / "home" / "secret").symlink_to(outside / "secret")
    mixed = {"workspace": 64000, "workspace/d": 65534, "workspace/d/f": 64000, "home/h": 0, "tmp": 1234}
    for sub, uid in mixed.items():
        os.lchown(root / sub, uid, uid)

    adopt_tree(root, UID, UID)

    entries = [Path(d) / n for d, ds, fs in os.walk(root) for n in ds + fs]
    assert len(entries) == 9
    assert all(owner(p) == (UID, UID) for p in entries), {str(p): owner(p) for p in entries}
    assert owner(outside) == (0, 0) and owner(outside / "secret") == (0, 0)  # the symlinks' targets are untouched
    assert owner(root) == (0, 0)


@root_only
def test_adopt_tree_does_not_walk_an_adopted_tree(tmp_path, monkeypatch):
    root = tmp_path / "root"
    for sub in uids.LIVE_DIRS:
        (root / sub).mkdir(parents=True)
        os.chown(root / sub, UID, UID)
    (root / "workspace" / "f").write_text("f")  # not the uid's, yet: proof that nothing was walked

    def no_walk(*args, **kwargs):
        raise AssertionError("walked an adopted tree")

    monkeypatch.setattr(uids.os, "walk", no_walk)
    adopt_tree(root, UID, UID)
    assert owner(root / "workspace" / "f") == (0, 0)


@root_only
def test_an_interrupted_adoption_is_finished_next_time(tmp_path):
    root = tmp_path / "root"
    for sub in uids.LIVE_DIRS:
        (root / sub).mkdir(parents=True)
        os.chown(root / sub, 64000, 64000)
    (root / "tmp" / "f").write_text("f")
    os.chown(root / "workspace", UID, UID)  # crashed after the first top dir
    adopt_tree(root, UID, UID)
    assert owner(root / "tmp" / "f") == (UID, UID) and owner(root / "tmp") == (UID, UID)


def test_worker_processes_sharing_the_range_never_hand_out_one_id_twice(data, make_range):
    """`flarebox serve --workers N`: the parent holds the claim and forked workers allocate from it at once; the
    flock on uid-next.lock keeps every id unique."""
    shared = make_range()
    per_worker = 150
    readers = []
    pids = []
    for _ in range(3):
        read_fd, write_fd = os.pipe()
        pid = os.fork()
        if pid == 0:  # a worker
            code = 1
            try:
                os.close(read_fd)
                got = [shared.allocate() for _ in range(per_worker)]
                os.write(write_fd, ",".join(map(str, got)).encode())
                code = 0
            finally:
                os._exit(code)
        os.close(write_fd)
        readers.append(read_fd)
        pids.append(pid)
    handed: list[int] = []
    for read_fd in readers:
        chunks = []
        while chunk := os.read(read_fd, 65536):
            chunks.append(chunk)
        os.close(read_fd)
        handed += [int(x) for x in b"".join(chunks).decode().split(",")]
    for pid in pids:
        assert os.waitpid(pid, 0)[1] == 0
    assert len(handed) == 3 * per_worker == len(set(handed))
    assert all(shared.contains(uid) for uid in handed)
    assert (data / "uid-next").read_text().strip() == str(3 * per_worker + 1)
