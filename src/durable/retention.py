"""Which snapshots to keep: a pure function of (snapshots, now), tested on its own.

Keeps the newest snapshot in each 5-minute slot of the last 2 hours, in each hourly slot of the last 24 hours,
in each of the 5 newest UTC days and in each of the 5 newest ISO weeks that have a snapshot — and always the
newest snapshot overall. Slots are aligned to the epoch (not to `now`), so a slot's keeper does not change as
time passes; it only ages out of the window.

An expired snapshot (`SnapshotInfo.expired`: Cloudflare deletes one 30 days after it was made or last restored) is
gone whatever the policy says: it is never kept and never counted — it takes no day's or week's place, and the
newest snapshot kept is the newest one still alive. So on Cloudflare the weekly slots reach back 30 days at most.

A kept snapshot (`{"keep": true}`, bounded by MAX_KEPT_SNAPSHOTS) is always kept until it expires, and takes no
slot: the slots are filled as if it were not there, so pinning one never pushes another out. A labelled snapshot is
kept for at least LABELLED_MS whatever its slot ("before-migration", then the idle save five minutes later must not
take its place), and competes for the daily and weekly slots like any other after that.
"""

from collections.abc import Iterable

from durable.ports import SnapshotInfo

MINUTE_MS = 60_000
HOUR_MS = 60 * MINUTE_MS
DAY_MS = 24 * HOUR_MS

FINE_SLOT_MS = 5 * MINUTE_MS
FINE_WINDOW_MS = 2 * HOUR_MS
HOURLY_WINDOW_MS = 24 * HOUR_MS
LABELLED_MS = 24 * HOUR_MS
DAILY_KEEP = 5
WEEKLY_KEEP = 5


def _iso_week(created_ms: int) -> int:
    """A number unique to the ISO week (Monday to Sunday, UTC) containing `created_ms`."""
    day = created_ms // DAY_MS
    return (day + 3) // 7  # 1970-01-01 was a Thursday: +3 moves week boundaries to Mondays


def _age_order(snap: SnapshotInfo) -> tuple[int, str]:
    """Newer sorts higher; the id breaks a tie, so the choice never depends on the input order."""
    return snap.created_at_ms, snap.id


def _newest_per(snapshots: list[SnapshotInfo], key) -> dict[int, SnapshotInfo]:
    best: dict[int, SnapshotInfo] = {}
    for snap in snapshots:
        k = key(snap.created_at_ms)
        if k is None:
            continue
        if k not in best or _age_order(snap) > _age_order(best[k]):
            best[k] = snap
    return best


def keep(snapshots: Iterable[SnapshotInfo], now_ms: int) -> set[str]:
    """The ids of the snapshots to keep (none of them expired at `now_ms`)."""
    alive = [s for s in snapshots if not s.expired(now_ms)]
    kept: set[str] = {s.id for s in alive if s.kept}
    kept.update(s.id for s in alive if s.label is not None and now_ms - s.created_at_ms < LABELLED_MS)
    snaps = [s for s in alive if not s.kept]
    if not snaps:
        return kept
    fine = _newest_per(snaps, lambda t: t // FINE_SLOT_MS if now_ms - t < FINE_WINDOW_MS else None)
    hourly = _newest_per(snaps, lambda t: t // HOUR_MS if now_ms - t < HOURLY_WINDOW_MS else None)
    daily = _newest_per(snaps, lambda t: t // DAY_MS)
    weekly = _newest_per(snaps, _iso_week)
    kept.update(s.id for s in fine.values())
    kept.update(s.id for s in hourly.values())
    kept.update(daily[k].id for k in sorted(daily, reverse=True)[:DAILY_KEEP])
    kept.update(weekly[k].id for k in sorted(weekly, reverse=True)[:WEEKLY_KEEP])
    kept.add(max(snaps, key=_age_order).id)  # never delete the newest live one, whatever the clock says
    return kept


def drop(snapshots: Iterable[SnapshotInfo], now_ms: int) -> list[SnapshotInfo]:
    """The snapshots `keep` does not keep (the expired ones among them), in the given order."""
    snaps = list(snapshots)
    kept = keep(snaps, now_ms)
    return [s for s in snaps if s.id not in kept]
