"""Which worker owns a workspace (standalone/placement.py): a pure, stable function of the name and the count."""

import hashlib
import subprocess
import sys
from collections import Counter

import pytest

from standalone.placement import MAX_WORKERS, owner, parse_workers


def test_one_worker_owns_everything():
    assert {owner("ns", f"w{i}", 1) for i in range(100)} == {0}


def test_the_owner_is_sha256_of_the_name_modulo_the_count():
    for ns, ws, n in (("ns", "a", 2), ("ns", "b", 3), ("load", "w00", 7), ("x", "y.z-1", 64)):
        expected = int.from_bytes(hashlib.sha256(f"{ns}/{ws}".encode()).digest()[:8], "big") % n
        assert owner(ns, ws, n) == expected


def test_known_placements_never_change():
    # a restart with the same count finds every workspace where it was: these are fixed, whatever the process
    assert [owner("ns", w, 2) for w in "abcd"] == [0, 0, 0, 1]
    assert owner("ns", "a", 7) == 6


def test_placement_is_the_same_in_another_process():
    # Python's hash() is salted per process; the placement must not be
    code = "from standalone.placement import owner; print([owner('ns', f'w{i}', 5) for i in range(50)])"
    outputs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    }
    assert outputs == {str([owner("ns", f"w{i}", 5) for i in range(50)]) + "\n"}


def test_every_index_is_in_range_and_used_about_evenly():
    counts = Counter(owner("ns", f"w{i}", 4) for i in range(4000))
    assert set(counts) == {0, 1, 2, 3}
    assert all(800 < c < 1200 for c in counts.values()), counts


def test_namespace_and_workspace_both_count():
    assert len({owner(f"ns{i}", "same", 8) for i in range(64)}) > 1
    assert owner("a", "b.c", 1000 % MAX_WORKERS or 1) == owner("a", "b.c", 1000 % MAX_WORKERS or 1)


def test_a_count_below_one_is_refused():
    with pytest.raises(ValueError):
        owner("ns", "w", 0)


@pytest.mark.parametrize(
    ("value", "expected"),
    [(None, 1), ("", 1), ("  ", 1), ("1", 1), (" 3 ", 3), (2, 2), ("64", 64), ("auto", 6), ("AUTO", 6), ("0", 6)],
)
def test_parse_workers(value, expected):
    assert parse_workers(value, cpus=6) == expected


def test_auto_is_one_per_core_within_the_bounds():
    assert parse_workers("auto", cpus=1) == 1
    assert parse_workers("auto", cpus=500) == MAX_WORKERS
    assert parse_workers("auto") >= 1


@pytest.mark.parametrize("value", ["-1", "65", "two", "1.5", "0x2", "2 workers", -3])
def test_bad_worker_counts_are_refused_with_a_readable_message(value):
    with pytest.raises(ValueError, match="whole number 1-64, 0 or 'auto'"):
        parse_workers(value)
