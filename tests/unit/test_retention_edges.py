"""Retention at the edges the property tests never reach: just inside/outside the 2-hour and 24-hour windows, and
snapshots sharing one timestamp (the keeper is then the one with the greatest id, whatever the input order)."""

import datetime as dt
import itertools
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from durable import retention
from durable.ports import SnapshotInfo

MIN = 60_000
HOUR = 60 * MIN
DAY = 24 * HOUR
MONDAY = int(dt.datetime(2026, 11, 23, tzinfo=dt.UTC).timestamp() * 1000)  # aligned to every slot size


def keep(pairs, now_ms):
    return retention.keep([SnapshotInfo(sid, 0, t) for sid, t in pairs], now_ms)


def test_between_one_and_two_hours_old_the_five_minute_rule_still_keeps_one_per_slot():
    now = MONDAY + 10 * HOUR
    # 08:10 and 08:20 share the 08:00 hour; both are 100 and 90 minutes old: inside the 2-hour fine window
    s = [("m10", now - 110 * MIN), ("m20", now - 100 * MIN), ("newest", now)]
    # m10 is kept by the 5-minute rule alone (the hour keeper is m20, the day keeper is newest)
    assert keep(s, now) == {"m10", "m20", "newest"}


def test_a_snapshot_just_under_24_hours_old_keeps_its_hourly_slot():
    now = MONDAY + 3 * DAY + 13 * HOUR  # Thursday 13:00
    s = [("inside", now - DAY + 1), ("later_that_day", now - DAY + 7 * HOUR), ("newest", now)]
    # `inside` (Wednesday 13:00:00.001) is the newest of its hour, within 24 h; Wednesday's day keeper is later
    assert keep(s, now) == {"inside", "later_that_day", "newest"}


def test_a_snapshot_exactly_24_hours_old_is_out_of_the_hourly_window():
    now = MONDAY + 3 * DAY + 13 * HOUR  # Thursday 13:00
    s = [("edge", now - DAY), ("later_that_day", now - DAY + 7 * HOUR), ("newest", now)]
    # `edge` (Wednesday 13:00:00.000) is the newest of its hour but exactly 24 h old: only the daily rule applies,
    # and Wednesday's keeper is later_that_day
    assert keep(s, now) == {"later_that_day", "newest"}


def test_a_snapshot_25_hours_old_is_out_of_the_hourly_window():
    now = MONDAY + 3 * DAY + 13 * HOUR
    s = [("old", now - DAY - HOUR + 1), ("later_that_day", now - DAY + 7 * HOUR), ("newest", now)]
    assert keep(s, now) == {"later_that_day", "newest"}


@pytest.mark.parametrize("age", [5 * MIN, 5 * HOUR, 3 * DAY, 20 * DAY])
def test_equal_timestamps_keep_the_greatest_id_in_any_input_order(age):
    now = MONDAY + 10 * HOUR
    t = now - age
    pairs = [("snap-a", t), ("snap-c", t), ("snap-b", t), ("newest", now)]
    for order in itertools.permutations(pairs):
        assert keep(order, now) == {"snap-c", "newest"}, order


def test_equal_newest_timestamps_keep_the_greatest_id():
    now = MONDAY + 10 * HOUR
    for order in itertools.permutations([("x1", now), ("x3", now), ("x2", now)]):
        assert keep(order, now) == {"x3"}
        # the newest is kept even with the clock far in the past (only the "newest overall" rule applies)
        assert keep(order, now - 30 * DAY) == {"x3"}
    dropped = retention.drop([SnapshotInfo(i, 0, now) for i in ("x2", "x3", "x1")], now)
    assert [s.id for s in dropped] == ["x2", "x1"]  # the given order


# --- expired snapshots (Cloudflare deletes one 30 days after it was made or last restored) -------------------------


def info(sid, t, expires=None):
    return SnapshotInfo(sid, 0, t, expires)


def test_an_expired_snapshot_is_never_kept_not_even_the_newest():
    now = MONDAY + 40 * DAY
    snaps = [info("gone", now - HOUR, expires=now), info("live", now - 2 * HOUR, expires=now + 1)]
    assert retention.keep(snaps, now) == {"live"}  # the newest live one is "the newest" now
    assert [s.id for s in retention.drop(snaps, now)] == ["gone"]


def test_an_expired_snapshot_takes_no_days_place():
    now = MONDAY + 100 * DAY
    # one snapshot on each of 6 days, the newest day's expired: the 5 newest *live* days keep the sixth one
    snaps = [info(f"d{i}", now - i * DAY, expires=now - 1 if i == 1 else None) for i in range(1, 7)]
    assert retention.keep(snaps, now) == {"d2", "d3", "d4", "d5", "d6"}


def test_an_expired_snapshot_takes_no_weeks_place():
    now = MONDAY + 200 * DAY
    weekly = [info(f"w{i}", MONDAY + (100 - 7 * i) * DAY) for i in range(11)]  # 11 weeks, one snapshot each
    # the 5 newest days and weeks are w0..w4; with w0..w2 expired, w3..w7 take their places
    snaps = [replace(s, expires_at_ms=now) if s.id in ("w0", "w1", "w2") else s for s in weekly]
    assert retention.keep(snaps, now) == {f"w{i}" for i in range(3, 8)}


def test_when_every_snapshot_expired_none_is_kept():
    now = MONDAY
    snaps = [info("a", now - DAY, expires=now - 1), info("b", now - HOUR, expires=now)]
    assert retention.keep(snaps, now) == set()
    assert [s.id for s in retention.drop(snaps, now)] == ["a", "b"]


def test_a_snapshot_is_alive_until_its_expiry_exactly():
    assert not info("a", 0, expires=10).expired(9)
    assert info("a", 0, expires=10).expired(10)
    assert not info("a", 0).expired(10**15)  # no expiry: never


@settings(max_examples=200, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(0, 60 * DAY), st.one_of(st.none(), st.integers(0, 90 * DAY))),
        min_size=1,
        max_size=40,
        unique_by=lambda p: p[0],
    ),
    st.integers(0, 60 * DAY),
)
def test_expired_snapshots_change_nothing_but_themselves(pairs, now_offset):
    now = MONDAY + now_offset
    snaps = [info(f"x{t}", MONDAY + t, None if e is None else MONDAY + e) for t, e in pairs]
    live = [s for s in snaps if not s.expired(now)]
    kept = retention.keep(snaps, now)
    assert kept == retention.keep(live, now)  # as if the expired ones had never been
    assert not any(s.expired(now) for s in snaps if s.id in kept)
