"""Which backups to keep: a pure function of (backups, now), tested on its own (tests/unit/test_backup_retention.py).

Backups are the long-term copies, so their slots are coarse and reach back a year: the newest backup of each UTC
day of the last 7 days (today and the 6 before it), of each ISO week (Monday to Sunday, UTC) of the last 8 weeks
(this one and the 7 before it), of each UTC calendar month of the last 12 months (this one and the 11 before it) —
and always the newest backup overall, however old. Windows are counted in calendar slots back from the one `now`
falls in, and slots are aligned to the calendar (not to `now`), so a slot's keeper never changes as time passes:
it only ages out of the window. Unlike snapshot retention (durable/retention.py) the windows are calendar ones,
not "the N newest days having one": a backup store is written on a schedule, and a month without backups must
not stretch the year.

A backup from the future (a clock that went backwards) is in no day's window; the newest one stays whatever.
"""

import datetime as _dt
from collections.abc import Iterable

from durable.ports import BackupInfo

DAY_MS = 24 * 3600 * 1000
DAILY_SLOTS = 7
WEEKLY_SLOTS = 8
MONTHLY_SLOTS = 12

_EPOCH = _dt.datetime(1970, 1, 1, tzinfo=_dt.UTC)


def _day(ms: int) -> int:
    return ms // DAY_MS


def _iso_week(ms: int) -> int:
    """A number unique to the ISO week containing `ms`; consecutive weeks have consecutive numbers."""
    return (_day(ms) + 3) // 7  # 1970-01-01 was a Thursday: +3 moves week boundaries to Mondays


def _month(ms: int) -> int:
    """A number unique to the UTC calendar month containing `ms`; consecutive months have consecutive numbers."""
    when = _EPOCH + _dt.timedelta(milliseconds=ms)
    return when.year * 12 + when.month - 1


def _age_order(backup: BackupInfo) -> tuple[int, str]:
    """Newer sorts higher; the id breaks a tie, so the choice never depends on the input order."""
    return backup.created_at_ms, backup.id


def _newest_per_slot(backups: list[BackupInfo], slot, now_ms: int, count: int) -> set[str]:
    """The newest backup of each of the `count` slots ending with the one `now_ms` is in."""
    current = slot(now_ms)
    best: dict[int, BackupInfo] = {}
    for backup in backups:
        k = slot(backup.created_at_ms)
        if not current - count < k <= current:
            continue
        if k not in best or _age_order(backup) > _age_order(best[k]):
            best[k] = backup
    return {b.id for b in best.values()}


def keep_backups(backups: Iterable[BackupInfo], now_ms: int) -> set[str]:
    """The ids of the backups to keep."""
    items = list(backups)
    if not items:
        return set()
    kept = _newest_per_slot(items, _day, now_ms, DAILY_SLOTS)
    kept |= _newest_per_slot(items, _iso_week, now_ms, WEEKLY_SLOTS)
    kept |= _newest_per_slot(items, _month, now_ms, MONTHLY_SLOTS)
    kept.add(max(items, key=_age_order).id)  # never delete the newest, whatever the clock says
    return kept


def drop_backups(backups: Iterable[BackupInfo], now_ms: int) -> list[BackupInfo]:
    """The backups `keep_backups` does not keep, in the given order."""
    items = list(backups)
    kept = keep_backups(items, now_ms)
    return [b for b in items if b.id not in kept]
