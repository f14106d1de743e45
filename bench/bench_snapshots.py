"""Snapshot store vs the bare pipeline it wraps, on the same mixed workspace.

Data: many small text files (source-tree-like, compressible) plus a few large random binaries (incompressible),
200 MB in total (20 MB with --quick). Baselines, measured in the same run on the same data:
  save:    tar -C dir -cf - . | zstd -T0 -3 -q > file
  restore: zstd -d -q -c file | tar -C dir -xf -
The store adds: sha256 of the compressed stream (in a thread, while writing), fsync, manifest, the listed-incremental
bookkeeping a sandbox's save keeps (GNU tar's snapshot file), and on restore the checksum check of every link, the
atomic swap and the stat walk that makes the restored tree the base of its next save. Figures (issue 13 goals):
  full save                 ≤ 1.0× the bare save (a sandbox's first save: a level-0 listed-incremental archive)
  restore                   ≤ 1.0× the bare restore (restore + the stat walk, as a sandbox start does it)
  incremental save          ≤ 0.1× the bare full save of the same tree, after 1% of the files changed
  restore, newest of 10     ≤ 1.0× the bare restore of the same tree (a chain of a full save and 9 increments)
  storage of 10 snapshots   ≤ 1.5× one full snapshot (1% of the files changed between each)
"""

import os
import random
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path

from bench.framework import figure
from standalone.snapshots import SnapshotStore

MB = 1_000_000
GOAL = 1.0  # the goal: no slower than the bare pipeline, checksums, fsync, manifest and swap included
INCREMENT_GOAL = 0.1
STORAGE_GOAL = 1.5
CHAIN = 10


_WORDS = [f"word{i}" for i in range(2000)] + ["def", "return", "import", "class", "self", "{", "}", "(", ")"]


def _text(rng: random.Random, size: int) -> bytes:
    """Source-like text of about `size` bytes: lines of words drawn from a small vocabulary."""
    line, out, length = [], [], 0
    while length < size:
        word = rng.choice(_WORDS)
        line.append(word)
        length += len(word) + 1
        if len(line) > 12:
            out.append(" ".join(line))
            line = []
    return ("\n".join(out) + "\n").encode()


def make_workspace(root: Path, total_bytes: int, seed: int = 7) -> tuple[int, int]:
    """Write ~40% small text files and ~60% random binaries. Returns (files, bytes)."""
    rng = random.Random(seed)
    text_budget, files, written = int(total_bytes * 0.4), 0, 0
    while written < text_budget:
        folder = root / "workspace" / f"pkg{files // 200}" / f"mod{(files // 20) % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        data = _text(rng, rng.randint(200, 16000))
        (folder / f"file{files}.py").write_bytes(data)
        files += 1
        written += len(data)
    binaries = root / "workspace" / "data"
    binaries.mkdir(parents=True, exist_ok=True)
    remaining = total_bytes - written
    count = 5
    for i in range(count):
        size = remaining // count
        with open(binaries / f"blob{i}.bin", "wb") as f:
            left = size
            while left:
                chunk = min(left, 4 * 1024 * 1024)
                f.write(os.urandom(chunk))
                left -= chunk
        files += 1
        written += size
    (root / "home").mkdir(exist_ok=True)
    (root / "tmp").mkdir(exist_ok=True)
    return files, written


def change_files(root: Path, share: float, rng: random.Random) -> tuple[int, int]:
    """Rewrite `share` of the regular files (by count, chosen at random) with new bytes of the same size. Returns
    (files, bytes) changed."""
    paths = sorted(p for p in (root / "workspace").rglob("*") if p.is_file())
    chosen = rng.sample(paths, max(1, round(len(paths) * share)))
    written = 0
    for path in chosen:
        size = path.stat().st_size
        data = rng.randbytes(size) if path.suffix == ".bin" else _text(rng, size)  # as compressible as before
        path.write_bytes(data)
        written += len(data)
    return len(chosen), written


def _timed(func, repeats: int, setup=None) -> list[float]:
    times = []
    for _ in range(repeats):
        if setup is not None:
            setup()
        os.sync()  # start each round with no dirty pages from the previous one
        start = time.perf_counter()
        func()
        times.append(time.perf_counter() - start)
    return times


def _locations(quick: bool, total: int) -> list[tuple[str, Path]]:
    """tmpfs (the store's own overhead, without the disk's noise) and, in full runs, the temp dir's disk too
    (where the store's fsync is a real cost the baseline does not pay)."""
    found = []
    shm = Path("/dev/shm")  # noqa: S108 - a tmpfs we only create a private temp dir in
    if shm.is_dir() and shutil.disk_usage(shm).free > 4 * total:
        found.append(("tmpfs", shm))
    if not quick or not found:
        found.append(("disk", Path(tempfile.gettempdir())))
    return found


def _measure(where: str, parent: Path, total: int, repeats: int) -> list[dict]:
    base = Path(tempfile.mkdtemp(prefix="fbx-bench-snap-", dir=parent))
    rng = random.Random(13)
    try:
        source = base / "live"
        source.mkdir()
        files, size = make_workspace(source, total)
        time.sleep(0.05)  # a tick of the kernel's file-timestamp clock: the tree is older than the first save
        store = SnapshotStore(base / "store")
        baseline_archive = base / "baseline.tar.zst"
        created = []

        def baseline_save():
            cmd = f"tar -C {source} -cf - . | zstd -T0 -3 -q > {baseline_archive}"
            subprocess.run(cmd, shell=True, check=True)  # noqa: S602 - fixed paths we created

        def store_save():  # a sandbox's first save: a full one, which starts a chain
            shutil.rmtree(base / "full-base", ignore_errors=True)
            created.append(store.create("bench", "ws", source, base_dir=base / "full-base"))

        def clear_targets():
            for name in ("baseline-restore", "store-restore"):
                shutil.rmtree(base / name, ignore_errors=True)
            (base / "baseline-restore").mkdir()

        def baseline_restore():
            cmd = f"zstd -d -q -c {baseline_archive} | tar -C {base / 'baseline-restore'} -xf -"
            subprocess.run(cmd, shell=True, check=True)  # noqa: S602 - fixed paths we created

        def store_restore(workspace: str, snapshot_id: str):
            def restore():
                store.restore("bench", workspace, snapshot_id, base / "store-restore")
                store.track("bench", workspace, snapshot_id, base / "store-restore", base / "restore-base")

            return restore

        # interleaved, so drift (page cache, writeback, other load) hits both sides alike
        save_base, save_store, restore_base, restore_store = [], [], [], []
        for _ in range(repeats):
            save_base += _timed(baseline_save, 1)
            save_store += _timed(store_save, 1)
        full = created[-1]
        for _ in range(repeats):
            restore_base += _timed(baseline_restore, 1, clear_targets)
            restore_store += _timed(store_restore("ws", full.id), 1, clear_targets)

        # incremental saves: each after 1% of the files changed, against a bare full save of the same tree
        inc_base, inc_store, increments, changed = [], [], [], []
        store.create("bench", "inc", source, base_dir=base / "inc-base")
        for _ in range(repeats):
            changed.append(change_files(source, 0.01, rng))
            inc_base += _timed(baseline_save, 1)
            inc_store += _timed(
                lambda: increments.append(store.create("bench", "inc", source, base_dir=base / "inc-base")), 1
            )

        # a chain of CHAIN snapshots, 1% of the files changed between each: its storage, and its newest's restore
        chain = [store.create("bench", "chain", source, base_dir=base / "chain-base")]
        chain_changed = 0
        for _ in range(CHAIN - 1):
            chain_changed += change_files(source, 0.01, rng)[1]
            chain.append(store.create("bench", "chain", source, base_dir=base / "chain-base"))
        links = store.chain("bench", "chain", chain[-1].id)
        baseline_save()  # the bare archive of the same (final) tree, for the restore baseline
        chain_base, chain_store = [], []
        for _ in range(repeats):
            chain_base += _timed(baseline_restore, 1, clear_targets)
            chain_store += _timed(store_restore("chain", chain[-1].id), 1, clear_targets)
        chain_bytes = sum(s.size for s in chain)
        track_seconds = _timed(lambda: store.track("bench", "ws", full.id, source, base / "track-base"), 3)
    finally:
        shutil.rmtree(base, ignore_errors=True)

    label = f"{size / MB:.0f} MB ({where})"
    note = f"{files} files, {size / MB:.0f} MB → {full.size / MB:.0f} MB archive, on {where}, median of {repeats}"
    results = []
    for name, ours, theirs, baseline_name, extra in (
        ("snapshot full save", save_store, save_base, "tar -cf - | zstd -T0 -3", ""),
        (
            "snapshot restore",
            restore_store,
            restore_base,
            "zstd -d | tar -x",
            f"; includes the stat walk making it a base ({statistics.median(track_seconds):.3f} s)",
        ),
    ):
        value, reference = statistics.median(ours), statistics.median(theirs)
        results.append(figure(f"{name}, {label}", value, "s", baseline_name, reference, goal=GOAL, note=note + extra))
    files_changed, bytes_changed = changed[-1]
    results.append(
        figure(
            f"incremental save after 1% of the files changed, {label}",
            statistics.median(inc_store),
            "s",
            "tar -cf - | zstd -T0 -3 (full, same tree)",
            statistics.median(inc_base),
            goal=INCREMENT_GOAL,
            note=f"{files_changed} files ({bytes_changed / MB:.1f} MB) changed before each save; increments of "
            f"{statistics.median([i.size for i in increments]) / MB:.2f} MB (median); {note}",
        )
    )
    results.append(
        figure(
            f"restore of the newest of {CHAIN} chained snapshots, {label}",
            statistics.median(chain_store),
            "s",
            "zstd -d | tar -x (full archive of the same tree)",
            statistics.median(chain_base),
            goal=GOAL,
            note=f"{len(links)} archives extracted, each sha256-checked, plus the stat walk; {note}",
        )
    )
    results.append(
        figure(
            f"storage of {CHAIN} snapshots, 1% of the files changed between each, {label}",
            chain_bytes / MB,
            "MB",
            "one full snapshot",
            chain[0].size / MB,
            goal=STORAGE_GOAL,
            note=f"a full save and {CHAIN - 1} increments ({chain_changed / MB:.1f} MB of files rewritten in all: the "
            f"1% are drawn from every file, big binaries included); {note}",
        )
    )
    return results


def run(quick: bool = False) -> list[dict]:
    total = (20 if quick else 200) * MB
    repeats = 3 if quick else 5
    results = []
    for where, parent in _locations(quick, total):
        results += _measure(where, parent, total, repeats)
    return results
