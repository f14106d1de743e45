"""Snapshot store vs the bare pipeline it wraps, on the same mixed workspace.

Data: many small text files (source-tree-like, compressible) plus a few large random binaries (incompressible),
200 MB in total (20 MB with --quick). Baselines, measured in the same run on the same data:
  save:    tar -C dir -cf - . | zstd -T0 -3 -q > file
  restore: zstd -d -q -c file | tar -C dir -xf -
The store adds: sha256 of the compressed stream (in Python, while writing), fsync, manifest, and on restore the
checksum check plus the atomic swap. Goal: ratio <= 1.0 plus a small overhead.
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


def make_workspace(root: Path, total_bytes: int, seed: int = 7) -> tuple[int, int]:
    """Write ~40% small text files and ~60% random binaries. Returns (files, bytes)."""
    rng = random.Random(seed)
    words = [f"word{i}" for i in range(2000)] + ["def", "return", "import", "class", "self", "{", "}", "(", ")"]
    text_budget, files, written = int(total_bytes * 0.4), 0, 0
    while written < text_budget:
        folder = root / "workspace" / f"pkg{files // 200}" / f"mod{(files // 20) % 10}"
        folder.mkdir(parents=True, exist_ok=True)
        size = rng.randint(200, 16000)
        line = []
        out = []
        length = 0
        while length < size:
            word = rng.choice(words)
            line.append(word)
            length += len(word) + 1
            if len(line) > 12:
                out.append(" ".join(line))
                line = []
        data = ("\n".join(out) + "\n").encode()
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
    try:
        source = base / "live"
        source.mkdir()
        files, size = make_workspace(source, total)
        store = SnapshotStore(base / "store")
        baseline_archive = base / "baseline.tar.zst"
        created = []

        def baseline_save():
            cmd = f"tar -C {source} -cf - . | zstd -T0 -3 -q > {baseline_archive}"
            subprocess.run(cmd, shell=True, check=True)  # noqa: S602 - fixed paths we created

        def store_save():
            created.append(store.create("bench", "ws", source))

        def clear_targets():
            for name in ("baseline-restore", "store-restore"):
                shutil.rmtree(base / name, ignore_errors=True)
            (base / "baseline-restore").mkdir()

        def baseline_restore():
            cmd = f"zstd -d -q -c {baseline_archive} | tar -C {base / 'baseline-restore'} -xf -"
            subprocess.run(cmd, shell=True, check=True)  # noqa: S602 - fixed paths we created

        def store_restore():
            store.restore("bench", "ws", created[-1].id, base / "store-restore")

        # interleaved, so drift (page cache, writeback, other load) hits both sides alike
        save_base, save_store, restore_base, restore_store = [], [], [], []
        for _ in range(repeats):
            save_base += _timed(baseline_save, 1)
            save_store += _timed(store_save, 1)
        for _ in range(repeats):
            restore_base += _timed(baseline_restore, 1, clear_targets)
            restore_store += _timed(store_restore, 1, clear_targets)
        archive_size = created[-1].size
    finally:
        shutil.rmtree(base, ignore_errors=True)

    note = f"{files} files, {size / MB:.0f} MB → {archive_size / MB:.0f} MB archive, on {where}, median of {repeats}"
    results = []
    for name, ours, theirs, baseline_name in (
        ("snapshot save", save_store, save_base, "tar -cf - | zstd -T0 -3"),
        ("snapshot restore", restore_store, restore_base, "zstd -d | tar -x"),
    ):
        value, reference = statistics.median(ours), statistics.median(theirs)
        results.append(
            figure(f"{name}, {size / MB:.0f} MB ({where})", value, "s", baseline_name, reference, goal=GOAL, note=note)
        )
    return results


def run(quick: bool = False) -> list[dict]:
    total = (20 if quick else 200) * MB
    repeats = 3 if quick else 5
    results = []
    for where, parent in _locations(quick, total):
        results += _measure(where, parent, total, repeats)
    return results
