"""The persisted record: state machine, ledger bounds, schedule and backoff, over real SQLite."""

import pytest
from workspace_doubles import MemoryStorage, RecordingAlarm, rid

from durable.ledger import CANCEL, CANCELLED_EARLY, EXEC, Ledger
from durable.ports import SnapshotInfo
from durable.schedule import CHECKPOINT, IDLE, RETRY, Schedule
from durable.state import STATES, TRANSITIONS, IllegalTransition, WorkspaceState
from durable.store import Store
from durable.timefmt import iso_ms
from protocol.errors import ProtocolError

CONFIG = {"image": "hermes", "instance": "lite", "persistent": True, "cwd": "/workspace"}


# --- state machine -----------------------------------------------------------------------------------------------


def test_a_new_record_is_created_and_not_booted(store):
    state = WorkspaceState(store)
    assert not state.exists and state.state is None
    state.create(CONFIG, 1_000)
    assert state.exists and state.state == "created" and not state.booted and state.config == CONFIG


def test_the_documented_lifecycle_path(store):
    state = WorkspaceState(store)
    state.create(CONFIG, 0)
    for new in ("starting", "running", "saving", "stopped", "restoring", "running", "saving", "running"):
        state.set_state(new)
        assert state.state == new
    # a crash noticed later: restart on the surviving disk, or lost
    state.set_state("starting")
    state.set_state("running")
    state.set_state("lost")
    assert WorkspaceState(store).state == "lost"  # persisted, read back by a new view


@pytest.mark.parametrize(
    "path",
    [
        ("running",),  # created cannot run without starting
        ("restoring",),  # nothing to restore before the first boot
        ("saving",),
        ("lost",),  # never booted: nothing was lost
        ("starting", "saving"),
        ("starting", "running", "created"),  # never back to never-booted
        ("starting", "running", "lost", "starting"),  # lost does not boot: only a restored backup rests it
        ("starting", "running", "lost", "restoring"),
        ("starting", "running", "stopped", "running"),  # stopped must boot first
    ],
)
def test_illegal_transitions_are_refused(store, path):
    state = WorkspaceState(store)
    state.create(CONFIG, 0)
    *ok, bad = path
    for new in ok:
        state.set_state(new)
    before = state.state
    with pytest.raises(IllegalTransition):
        state.set_state(bad)
    assert state.state == before


def test_every_state_is_known_and_deleted_is_never_stored():
    assert set(TRANSITIONS) | {"deleted"} == set(STATES)
    assert all(targets <= set(STATES) for targets in TRANSITIONS.values())
    assert not any("deleted" in targets for targets in TRANSITIONS.values())


def test_snapshots_newest_first_and_status_object(store):
    state = WorkspaceState(store)
    state.create(CONFIG, 1_700_000_000_123)
    state.add_snapshot(SnapshotInfo("b", 20, 2_000))
    state.add_snapshot(SnapshotInfo("a", 10, 1_000))
    state.add_snapshot(SnapshotInfo("c", 30, 3_000))
    assert [s.id for s in state.snapshots()] == ["c", "b", "a"]
    state.remove_snapshot("c")
    status = state.status_object("ns", "ws", running=False, busy=False, now_ms=5_000)
    last = {"id": "b", "created_at": "1970-01-01T00:00:02.000Z", "size": 20, "expires_at": None, "label": None}
    last["kept"] = False
    assert status["last_snapshot"] == last
    assert status["created_at"] == "2023-11-14T22:13:20.123Z"
    assert list(status) == [
        "namespace",
        "workspace",
        "state",
        "config",
        "running",
        "busy",
        "last_snapshot",
        "created_at",
        "last_activity_at",
        "booted",
    ]


def test_iso_timestamps():
    assert iso_ms(0) == "1970-01-01T00:00:00.000Z"
    assert iso_ms(1_764_407_702_007) == "2025-11-29T09:15:02.007Z"
    assert iso_ms(None) is None


def test_wipe_forgets_everything(store):
    state = WorkspaceState(store)
    state.create(CONFIG, 0)
    state.add_snapshot(SnapshotInfo("a", 1, 1))
    Ledger(store).record_exec(rid(1))
    store.wipe()
    assert not state.exists and state.snapshots() == [] and Ledger(store).lookup(rid(1)) is None


# --- ledger ------------------------------------------------------------------------------------------------------


def test_ledger_records_execs_and_early_cancels(store):
    ledger = Ledger(store)
    assert ledger.lookup(rid(1)) is None
    ledger.record_cancel(rid(1))
    assert ledger.lookup(rid(1)) == CANCEL
    # the exec that was cancelled early still uses its id, remembered as never run (reattach reports that)
    assert ledger.record_exec(rid(1)) == CANCELLED_EARLY
    assert ledger.lookup(rid(1)) == CANCELLED_EARLY
    ledger.record_cancel(rid(1))  # a later cancel does not turn a used id back into a pending one
    assert ledger.lookup(rid(1)) == CANCELLED_EARLY
    assert ledger.record_exec(rid(2)) == EXEC and ledger.lookup(rid(2)) == EXEC


def test_ledger_is_bounded_and_forgets_the_oldest(store):
    ledger = Ledger(store, limit=5)
    for n in range(12):
        ledger.record_exec(rid(n))
    assert len(ledger) == 5
    assert [ledger.lookup(rid(n)) for n in range(12)] == [None] * 7 + [EXEC] * 5


def test_ledger_bound_counts_cancels_too(store):
    ledger = Ledger(store, limit=3)
    ledger.record_cancel(rid(1))
    ledger.record_exec(rid(2))
    ledger.record_exec(rid(3))
    ledger.record_exec(rid(4))
    assert ledger.lookup(rid(1)) is None and len(ledger) == 3


def test_default_ledger_bound_is_the_protocol_limit(store):
    from protocol import limits

    ledger = Ledger(store)
    for n in range(limits.LEDGER_MAX_REQUESTS + 10):
        ledger.record_exec(rid(n))
    assert len(ledger) == limits.LEDGER_MAX_REQUESTS
    assert ledger.lookup(rid(9)) is None and ledger.lookup(rid(10)) == EXEC


# --- schedule ----------------------------------------------------------------------------------------------------


async def test_one_alarm_points_at_the_earliest_deadline(store):
    schedule, alarm = Schedule(store), RecordingAlarm()
    await schedule.arm(alarm)
    assert alarm.at_ms is None
    schedule.set_at(IDLE, 5_000)
    schedule.set_at(CHECKPOINT, 3_000)
    await schedule.arm(alarm)
    assert alarm.at_ms == 3_000
    assert schedule.due(2_999) == set() and schedule.due(3_000) == {CHECKPOINT}
    assert schedule.due(10_000) == {IDLE, CHECKPOINT}
    schedule.clear(CHECKPOINT)
    await schedule.arm(alarm)
    assert alarm.at_ms == 5_000
    assert Schedule(store).get(IDLE) == 5_000  # persisted
    schedule.clear_all()
    await schedule.arm(alarm)
    assert alarm.at_ms is None


def test_retry_backoff_doubles_to_a_cap_and_resets(store):
    schedule = Schedule(store)
    assert [schedule.next_retry_delay() for _ in range(8)] == [30, 60, 120, 240, 480, 900, 900, 900]
    schedule.reset_retry()
    assert schedule.next_retry_delay() == 30
    schedule.set_at(RETRY, 1)
    assert schedule.due(1) == {RETRY}


# --- the meta table's cache ----------------------------------------------------------------------------------------


class CountingStorage(MemoryStorage):
    """Counts the statements on the meta table; `fail_writes` makes every write to it raise."""

    def __init__(self):
        super().__init__()
        self.meta_statements = 0
        self.fail_writes = False

    def sql(self, query, *params):
        if " meta" in query and not query.startswith("CREATE"):
            self.meta_statements += 1
            if self.fail_writes and not query.startswith("SELECT"):
                raise ProtocolError("storage_full")
        return super().sql(query, *params)


def test_the_meta_table_is_read_once_and_an_unchanged_value_is_not_written_again():
    storage = CountingStorage()
    store = Store(storage)
    store.put("deadlines", {"idle": 5})
    store.put("deadlines", {"idle": 5})  # the same value: no statement
    assert store.get("deadlines") == {"idle": 5} and store.get("missing", 7) == 7
    store.delete("missing")  # not there: no statement
    assert storage.meta_statements == 2  # the first read of the table, one write
    store.get("deadlines")["idle"] = 9  # a caller changing what it got changes nothing stored
    assert store.get("deadlines") == {"idle": 5}
    assert Store(storage).get("deadlines") == {"idle": 5}  # and it is really in the table


def test_a_failed_write_leaves_the_cache_as_the_table_is():
    storage = CountingStorage()
    store = Store(storage)
    store.put("state", "running")
    storage.fail_writes = True
    with pytest.raises(ProtocolError):
        store.put("state", "saving")
    with pytest.raises(ProtocolError):
        store.delete("state")
    assert store.get("state") == "running" == Store(storage).get("state")


def test_wipe_forgets_the_cached_values(store):
    store.put("state", "running")
    store.wipe()
    assert store.get("state") is None


def test_has_tells_a_stored_value_from_none_without_decoding_it(store):
    assert not store.has("config")
    store.put("config", None)
    assert not store.has("config")  # a stored null is no value, as get() reads it
    store.put("config", CONFIG)
    assert store.has("config") and store.get("config") == CONFIG
    store.delete("config")
    assert not store.has("config")
