"""Backup retention as a pure function: day/week/month slots and windows, boundaries, newest always kept."""

import datetime as dt

from hypothesis import given, settings
from hypothesis import strategies as st

from durable import backup_retention
from durable.ports import BackupInfo

MIN = 60_000
HOUR = 60 * MIN
DAY = 24 * HOUR
WEEK = 7 * DAY
# Monday 2026-11-23 00:00:00 UTC: a day and ISO-week boundary
MONDAY = int(dt.datetime(2026, 11, 23, tzinfo=dt.UTC).timestamp() * 1000)


def ms(*args) -> int:
    return int(dt.datetime(*args, tzinfo=dt.UTC).timestamp() * 1000)


def keep(pairs, now_ms):
    """The policy over (id, created_at_ms) pairs."""
    return backup_retention.keep_backups([BackupInfo(bid, 1, t, "0" * 64) for bid, t in pairs], now_ms)


def test_empty():
    assert keep([], MONDAY) == set()
    assert backup_retention.drop_backups([], MONDAY) == []


def test_a_single_backup_is_kept_however_old():
    assert keep([("old", 0)], MONDAY + 10 * 365 * DAY) == {"old"}


def test_newest_of_each_day_of_the_last_seven_days():
    now = MONDAY + 20 * WEEK + 3 * DAY + 12 * HOUR  # a Thursday noon
    # two backups on each of the last 10 days: 01:00 and 13:00 (today's 13:00 is in the future: skipped)
    today = now - 12 * HOUR
    pairs = []
    for d in range(10):
        pairs.append((f"d{d}a", today - d * DAY + HOUR))
        if d:
            pairs.append((f"d{d}b", today - d * DAY + 13 * HOUR))
    kept = keep(pairs, now)
    # today (only "a" exists) and the 6 days before: the later backup of each
    # 7+ days back is last week, whose newest (Sunday, d4b) is in the daily window anyway; all in one month
    assert kept == {"d0a"} | {f"d{d}b" for d in range(1, 7)}


def test_the_day_window_is_calendar_days_counted_from_today():
    now = MONDAY + 30 * WEEK + 6 * DAY + 23 * HOUR  # Sunday 23:00
    today = now - 23 * HOUR
    six_days_back = today - 6 * DAY  # Monday 00:00 of this ISO week: still in the daily window
    seven_days_back = today - 7 * DAY + 12 * HOUR  # last Sunday noon: out of the daily window
    pairs = [
        ("six", six_days_back),
        ("six-later", six_days_back + HOUR),
        ("seven", seven_days_back),
        ("seven-earlier", seven_days_back - HOUR),
        ("newest", now),
    ]
    kept = keep(pairs, now)
    assert "six-later" in kept and "six" not in kept
    # last week's newest stays through its week slot; the earlier one of that day does not
    assert "seven" in kept and "seven-earlier" not in kept


def test_day_boundary_belongs_to_the_next_day():
    now = MONDAY + 40 * WEEK + 2 * DAY + HOUR
    midnight = now - HOUR
    kept = keep([("before", midnight - 1), ("at", midnight)], now)
    assert kept == {"before", "at"}  # different days, both within 7


def test_newest_of_each_iso_week_of_the_last_eight_weeks():
    now = MONDAY + 50 * WEEK + 2 * DAY  # a Wednesday
    # one backup at Tuesday noon and one at Saturday noon of each of the 12 previous weeks
    pairs = []
    for w in range(1, 13):
        monday = MONDAY + (50 - w) * WEEK
        pairs += [(f"w{w}tue", monday + DAY + 12 * HOUR), (f"w{w}sat", monday + 5 * DAY + 12 * HOUR)]
    kept = keep(pairs, now)
    weekly = {f"w{w}sat" for w in range(1, 8)}  # this week has none; weeks 1-7 back complete the 8 slots
    assert weekly <= kept
    # beyond 8 weeks only month slots keep one: the newest of its month (a Tuesday where the month ended midweek)
    months = {}
    for bid, t in pairs:
        key = dt.datetime.fromtimestamp(t / 1000, dt.UTC).strftime("%Y-%m")
        if key not in months or t > months[key][1]:
            months[key] = (bid, t)
    assert kept == weekly | {bid for bid, _ in months.values()}


def test_iso_weeks_start_on_monday():
    now = MONDAY + 60 * WEEK + 3 * DAY
    monday = MONDAY + 57 * WEEK  # three weeks back: out of the daily window, in the weekly one
    pairs = [("sun", monday - 1), ("sun-earlier", monday - HOUR), ("mon", monday), ("mon2", monday + HOUR)]
    pairs.append(("newest", now))
    kept = keep(pairs, now)
    # Sunday 23:59:59.999 ends its week (kept as that week's newest); Monday starts the next week
    assert "sun" in kept and "sun-earlier" not in kept
    assert "mon2" in kept and "mon" not in kept


def test_newest_of_each_month_of_the_last_twelve_months():
    now = ms(2026, 11, 15)
    # one backup on the 3rd and one on the 20th of each month from 2025-01 to 2026-10
    pairs = []
    for year, month in [(2025, m) for m in range(1, 13)] + [(2026, m) for m in range(1, 11)]:
        pairs += [(f"{year}-{month:02}-03", ms(year, month, 3)), (f"{year}-{month:02}-20", ms(year, month, 20))]
    kept = keep(pairs, now)
    # this month (2026-11) has none: 2025-12 .. 2026-10 are the 11 other monthly slots
    monthly = {"2025-12-20"} | {f"2026-{m:02}-20" for m in range(1, 11)}
    assert monthly <= kept
    assert "2025-11-20" not in kept  # 12 months back: out of the window
    # the 8 weekly slots reach back to Monday 21 September: Saturday 3 October is its week's newest
    assert kept == monthly | {"2026-10-03"}


def test_month_boundaries_follow_the_calendar():
    now = ms(2026, 3, 31, 12)
    # Feb 2026 has 28 days: 28 Feb 23:59:59.999 is February, 1 Mar 00:00 is March
    pairs = [("feb-last", ms(2026, 3, 1) - 1), ("feb-early", ms(2026, 2, 1)), ("mar-first", ms(2026, 3, 1))]
    pairs += [("newest", now)]
    kept = keep(pairs, now)
    # Sunday 1 March ends the ISO week of 23 February, so it (not Saturday 28 February) is that week's newest
    assert kept == {"feb-last", "mar-first", "newest"}  # February's newest; that week's; March's
    # Sunday 1 February's week (26 January) is 9 weeks back: only its month could keep it, and February's newest
    # is the 28th


def test_months_across_a_year_boundary():
    now = ms(2027, 1, 10)
    pairs = [(f"m{m}", ms(2026, m, 15)) for m in range(1, 13)] + [("jan27", ms(2027, 1, 2))]
    kept = keep(pairs, now)
    # 2027-01 and the 11 months before it: 2026-02 .. 2026-12; 2026-01 is 12 months back
    assert {f"m{m}" for m in range(2, 13)} | {"jan27"} <= kept
    assert "m1" not in kept


def test_ties_break_by_id_not_input_order():
    now = MONDAY + 100 * WEEK
    t = now - 2 * HOUR
    pairs = [("b-a", t), ("b-b", t)]
    assert keep(pairs, now) == {"b-b"}
    assert keep(list(reversed(pairs)), now) == {"b-b"}


def test_newest_is_kept_even_with_a_clock_in_the_past():
    now = MONDAY
    pairs = [("old", now - 400 * DAY), ("future", now + 3 * DAY), ("future2", now + 5 * DAY)]
    kept = keep(pairs, now)
    assert "future2" in kept
    assert "future" not in kept  # in no window yet (a future day), and not the newest
    assert "old" not in kept


def test_drop_is_the_complement_in_input_order():
    now = MONDAY + 10 * WEEK
    infos = [BackupInfo(f"x{i}", 1, now - i * 3 * DAY, "0" * 64) for i in range(60)]
    dropped = backup_retention.drop_backups(infos, now)
    kept = backup_retention.keep_backups(infos, now)
    assert [b.id for b in dropped] == [b.id for b in infos if b.id not in kept]
    assert not kept & {b.id for b in dropped}


def test_a_year_of_daily_backups_keeps_about_27():
    now = MONDAY + 60 * WEEK
    pairs = [(f"d{i:03}", now - i * DAY - HOUR) for i in range(1, 366)]
    kept = keep(pairs, now)
    # 7 days (today has none: 6 of them) + 8 weeks + 12 months, overlapping
    assert 12 <= len(kept) <= 7 + 8 + 12 + 1
    assert "d001" in kept
    assert max(pairs, key=lambda p: p[1])[0] in kept


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=500 * DAY), min_size=1, max_size=80, unique=True),
    st.integers(min_value=0, max_value=520 * DAY),
)
def test_properties(offsets, now_offset):
    now = MONDAY + now_offset
    pairs = [(f"x{o:012d}", MONDAY + o) for o in offsets]
    kept = keep(pairs, now)
    ids = {bid for bid, _ in pairs}
    assert kept <= ids
    assert max(pairs, key=lambda p: p[1])[0] in kept  # never the newest deleted
    assert len(kept) <= 7 + 8 + 12 + 1  # bounded
    # stable: applying the policy again to what it kept keeps all of it
    assert keep([p for p in pairs if p[0] in kept], now) == kept
    # each kept backup (but the newest) is the newest of a slot in its window
    for bid, t in pairs:
        if bid not in kept or t == max(p[1] for p in pairs):
            continue
        day_ok = now // DAY - 7 < t // DAY <= now // DAY
        week_ok = (now // DAY + 3) // 7 - 8 < (t // DAY + 3) // 7 <= (now // DAY + 3) // 7
        a = dt.datetime.fromtimestamp(t / 1000, dt.UTC)
        b = dt.datetime.fromtimestamp(now / 1000, dt.UTC)
        month_ok = (b.year * 12 + b.month) - 12 < (a.year * 12 + a.month) <= (b.year * 12 + b.month)
        assert day_ok or week_ok or month_ok
    # anything dropped is older than, and in the same slot as, something kept — or out of every window
    for bid, t in pairs:
        if bid in kept:
            continue
        same_day_newer = any(t2 > t and t2 // DAY == t // DAY for b2, t2 in pairs if b2 in kept)
        out_of_day = not (now // DAY - 7 < t // DAY <= now // DAY)
        assert same_day_newer or out_of_day
