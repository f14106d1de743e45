"""The retention policy as a pure function: slot boundaries, windows, day/week limits, newest always kept."""

import datetime as dt

from hypothesis import given, settings
from hypothesis import strategies as st

from durable import retention
from durable.ports import SnapshotInfo

MIN = 60_000
HOUR = 60 * MIN
DAY = 24 * HOUR
# Monday 2026-11-23 00:00:00 UTC: aligned to every slot size used (5 min, hour, day, ISO week)
MONDAY = int(dt.datetime(2026, 11, 23, tzinfo=dt.UTC).timestamp() * 1000)


def keep(pairs, now_ms):
    """The policy over (id, created_at_ms) pairs: the tests speak in pairs for brevity."""
    return retention.keep([SnapshotInfo(sid, 0, t) for sid, t in pairs], now_ms)


def snaps(*times):
    return [(f"s{i}", t) for i, t in enumerate(times)]


def test_empty():
    assert keep([], MONDAY) == set()


def test_a_single_snapshot_is_kept_however_old():
    assert keep([("old", 0)], MONDAY) == {"old"}


def test_newest_in_each_five_minute_slot_within_two_hours():
    now = MONDAY + 10 * HOUR
    base = now - HOUR  # 60 min ago, on a slot boundary
    s = snaps(base, base + 1 * MIN, base + 4 * MIN + 59_999, base + 5 * MIN, base + 9 * MIN)
    # slot [base, base+5min): s0, s1, s2 -> s2 kept; slot [base+5min, ...): s3, s4 -> s4 kept
    kept = keep(s, now)
    assert {"s2", "s4"} <= kept
    assert "s0" not in kept and "s1" not in kept and "s3" not in kept


def test_the_slot_boundary_belongs_to_the_next_slot():
    now = MONDAY + 10 * HOUR
    base = now - HOUR
    kept = keep(snaps(base - 1, base), now)
    assert kept == {"s0", "s1"}  # different 5-minute slots (and hours: base is on an hour boundary)


def test_outside_two_hours_only_hourly_slots_remain():
    now = MONDAY + 10 * HOUR
    three_hours_ago = now - 3 * HOUR
    s = snaps(three_hours_ago, three_hours_ago + 10 * MIN, three_hours_ago + 20 * MIN, now - MIN)
    kept = keep(s, now)
    # same hour, older than 2 h: only the newest of that hour; s3 is the newest overall
    assert kept == {"s2", "s3"}


def test_two_hour_window_edge():
    now = MONDAY + 10 * HOUR
    just_inside = now - 2 * HOUR + 1
    just_outside = now - 2 * HOUR
    # both in the same hour slot (8:00-9:00), different 5-minute slots
    s = [("outside", just_outside), ("inside", just_inside + 5 * MIN), ("newest", now)]
    kept = keep(s, now)
    assert "inside" in kept and "newest" in kept
    # `outside` is older than 2 h, shares the hour with `inside` (newer): dropped
    assert "outside" not in kept


def test_hourly_within_a_day_then_daily():
    now = MONDAY + 3 * DAY + 12 * HOUR  # Thursday noon
    hourly = [(f"h{i}", now - i * HOUR - 30 * MIN) for i in range(3, 23)]
    day_old = [("d1a", now - 50 * HOUR), ("d1b", now - 49 * HOUR)]  # Tuesday 10:00 and 11:00
    kept = keep(hourly + day_old, now)
    assert {f"h{i}" for i in range(3, 23)} <= kept  # one per hour, all within 24 h
    assert "d1b" in kept and "d1a" not in kept  # beyond 24 h: one per day (the newest of that day)


def test_five_newest_days_then_weeks():
    now = MONDAY + 70 * DAY
    # one snapshot at noon on each of the last 30 days (all older than 24 h)
    s = [(f"d{i}", now - i * DAY - 12 * HOUR) for i in range(1, 31)]
    kept = keep(s, now)
    days = {f"d{i}" for i in range(1, 6)}
    assert days <= kept
    # weeks: the newest snapshot of each of the 5 newest ISO weeks having snapshots
    weeks = {}
    for sid, t in s:
        key = dt.datetime.fromtimestamp(t / 1000, dt.UTC).isocalendar()[:2]
        if key not in weeks or t > weeks[key][1]:
            weeks[key] = (sid, t)
    newest_weeks = {weeks[k][0] for k in sorted(weeks, reverse=True)[:5]}
    assert kept == days | newest_weeks
    assert len(kept) < len(s)


def test_days_count_distinct_days_with_snapshots_not_calendar_days():
    now = MONDAY + 100 * DAY
    # snapshots 10, 20, 30, 40, 50, 60 days ago: the five newest *days having snapshots* are kept
    s = [(f"g{i}", now - i * 10 * DAY) for i in range(1, 7)]
    kept = keep(s, now)
    assert {"g1", "g2", "g3", "g4", "g5"} <= kept
    assert "g6" not in kept  # sixth day and sixth week


def test_iso_weeks_start_on_monday():
    # five snapshots on Monday..Friday of a later week take the five "newest days"; older ones compete by week only
    later_week = [(f"n{i}", MONDAY + 14 * DAY + i * DAY) for i in range(5)]
    older = [("sun", MONDAY - 1), ("mon", MONDAY), ("mon2", MONDAY + HOUR)]  # Sunday 23:59:59.999, then Monday
    kept = keep(later_week + older, MONDAY + 400 * DAY)
    # Monday starts a new ISO week: Sunday night is the newest of its own week and stays; of the two in the
    # Monday week only the newer stays
    assert kept == {f"n{i}" for i in range(5)} | {"sun", "mon2"}


def test_newest_is_kept_even_with_a_clock_in_the_past():
    # snapshots "from the future" relative to now (a clock that went backwards)
    now = MONDAY
    s = [("a", now + HOUR), ("b", now + 2 * HOUR)]
    assert "b" in keep(s, now)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=60 * DAY), min_size=1, max_size=60, unique=True),
    st.integers(min_value=0, max_value=60 * DAY),
)
def test_properties(offsets, now_offset):
    now = MONDAY + now_offset
    s = [(f"x{o}", MONDAY + o) for o in offsets]
    kept = keep(s, now)
    ids = {sid for sid, _ in s}
    assert kept <= ids
    assert max(s, key=lambda p: p[1])[0] in kept  # never the newest deleted
    # bounded: 24 five-minute slots + 24 hours + 5 days + 5 weeks + the newest
    assert len(kept) <= 24 + 24 + 5 + 5 + 1
    # stable: applying the policy again to what it kept keeps all of it
    assert keep([p for p in s if p[0] in kept], now) == kept
