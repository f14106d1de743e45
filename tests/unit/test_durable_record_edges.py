"""The persisted record where the older tests only matched a pattern: activity time moves, the transitions to
`lost` the workspace uses, and a ledger that stays bounded under cancels alone."""

import pytest
from workspace_doubles import rid

from durable.ledger import CANCEL, Ledger
from durable.state import IllegalTransition, Lifecycle, WorkspaceState
from durable.timefmt import iso_ms

CONFIG = {"image": "hermes", "instance": "lite", "persistent": True, "cwd": "/workspace"}


def status(state):
    return state.status_object("ns", "ws", running=False, busy=False, now_ms=0)


def test_touch_moves_the_last_activity_time_and_nothing_else(store):
    state = WorkspaceState(store)
    state.create(CONFIG, 1_000)
    assert status(state)["last_activity_at"] == iso_ms(1_000)
    state.touch(987_654_321)
    assert status(state)["last_activity_at"] == iso_ms(987_654_321)
    assert status(state)["created_at"] == iso_ms(1_000)
    assert status(WorkspaceState(store))["last_activity_at"] == iso_ms(987_654_321)  # persisted


@pytest.mark.parametrize(
    "path",
    [
        # a save that finds nothing to save from (the container and its disk are gone)
        ("starting", "running", "saving", "lost"),
        # a stopped workspace whose snapshot and disk are both gone when it boots
        ("starting", "running", "saving", "stopped", "lost"),
    ],
)
def test_saving_and_stopped_can_become_lost(store, path):
    state = WorkspaceState(store)
    state.create(CONFIG, 0)
    for new in path:
        state.set_state(Lifecycle(new))
    assert WorkspaceState(store).state is Lifecycle.LOST
    with pytest.raises(IllegalTransition):
        state.set_state(Lifecycle.STARTING)  # and lost is final


def test_a_flood_of_cancels_alone_keeps_the_ledger_bounded(store):
    ledger = Ledger(store, limit=5)
    for n in range(50):
        ledger.record_cancel(rid(n))
        assert len(ledger) <= 5
    assert len(ledger) == 5
    assert [ledger.lookup(rid(n)) for n in range(50)] == [None] * 45 + [CANCEL] * 5


def test_a_crash_noticed_while_running_can_restore_from_the_snapshot(store):
    state = WorkspaceState(store)
    state.create(CONFIG, 0)
    for new in ("starting", "running", "saving", "running", "restoring", "running"):
        state.set_state(Lifecycle(new))
    assert WorkspaceState(store).state is Lifecycle.RUNNING


def test_no_workspace_is_not_booted(store):
    state = WorkspaceState(store)
    assert state.booted is False and not state.persistent
    state.create(CONFIG, 0)
    assert state.booted is False
    state.mark_booted()
    assert WorkspaceState(store).booted is True


def test_activity_supersedes_a_pending_save_retry(store):
    from durable.schedule import IDLE, RETRY, Schedule

    schedule = Schedule(store)
    schedule.set_at(IDLE, 1_000)
    schedule.retry_save(1_000)  # a failed save: retry in 30 s instead of the idle deadline
    assert schedule.deadlines() == {RETRY: 31_000}
    schedule.push_idle(50_000)  # then a request: the workspace is busy again, the retry is dropped
    assert Schedule(store).deadlines() == {IDLE: 50_000}
    assert schedule.due(40_000) == set()


def test_a_save_retry_carries_a_pending_checkpoint_with_it(store):
    from durable.schedule import CHECKPOINT, IDLE, RETRY, Schedule

    schedule = Schedule(store)
    schedule.set_at(IDLE, 1_000)
    schedule.set_at(CHECKPOINT, 2_000)
    schedule.retry_save(1_000)
    assert schedule.deadlines() == {RETRY: 31_000, CHECKPOINT: 31_000}


def test_postponing_moves_only_the_earlier_deadlines(store):
    from durable.schedule import CHECKPOINT, IDLE, RETRY, Schedule

    schedule = Schedule(store)
    schedule.set_at(IDLE, 100)
    schedule.set_at(RETRY, 300)
    schedule.set_at(CHECKPOINT, 500)
    schedule.postpone_until(300)
    assert Schedule(store).deadlines() == {IDLE: 300, RETRY: 300, CHECKPOINT: 500}
