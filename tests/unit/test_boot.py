"""The shared boot on its own (durable/boot.py), and the launches a reattach waits for (durable/launches.py)."""

import asyncio

import pytest
from workspace_doubles import ManualClock, settle

from durable.boot import BootOutcome, SharedBoot
from durable.launches import HAND_OVER_BUDGET_SECONDS, Launches
from durable.ports import SnapshotInfo
from durable.state import BootMode
from protocol.errors import ProtocolError
from protocol.events import status_event

pytestmark = pytest.mark.timeout(10)


class Recorder:
    def __init__(self):
        self.events = []

    async def __call__(self, event):
        self.events.append(event)


class GatedBoot:
    """A boot that reports `starting`, waits for the test, then finishes (or fails)."""

    def __init__(self, shared: SharedBoot, error: Exception | None = None):
        self.shared, self.error = shared, error
        self.gate = asyncio.Event()
        self.runs = 0

    async def __call__(self) -> BootOutcome:
        self.runs += 1
        await self.shared.emit(status_event("restoring", "restoring snapshot s1"))
        await self.gate.wait()
        if self.error is not None:
            raise self.error
        await self.shared.emit(status_event("ready"))
        return BootOutcome(BootMode.RESTORED, SnapshotInfo("s1", 10, 1))


async def test_concurrent_joiners_share_one_boot_and_a_late_one_sees_its_phase():
    shared = SharedBoot()
    boot = GatedBoot(shared)
    early, late = Recorder(), Recorder()
    shared.start(boot)
    first = asyncio.ensure_future(shared.join(early))
    await settle()
    assert shared.in_progress and early.events == [status_event("restoring", "restoring snapshot s1")]
    second = asyncio.ensure_future(shared.join(late))
    await settle()
    assert late.events == early.events  # joined after the phase was reported: replayed to it
    boot.gate.set()
    outcomes = await asyncio.gather(first, second)
    assert boot.runs == 1
    assert outcomes[0] is outcomes[1] and outcomes[0].container == "restored"
    assert early.events[-1] == late.events[-1] == status_event("ready")
    assert not shared.in_progress


async def test_a_failed_boot_reaches_every_joiner():
    shared = SharedBoot()
    boot = GatedBoot(shared, ProtocolError("snapshot_damaged"))
    shared.start(boot)
    joiners = [asyncio.ensure_future(shared.join(Recorder())) for _ in range(3)]
    await settle()
    boot.gate.set()
    results = await asyncio.gather(*joiners, return_exceptions=True)
    assert [getattr(r, "code", r) for r in results] == ["snapshot_damaged"] * 3
    assert boot.runs == 1 and not shared.in_progress


async def test_a_finished_boot_replays_no_phase_and_a_cancelled_joiner_leaves_it_running():
    shared = SharedBoot()
    boot = GatedBoot(shared)
    shared.start(boot)
    impatient = asyncio.ensure_future(shared.join())
    patient = asyncio.ensure_future(shared.join())
    await settle()
    impatient.cancel()
    await settle()
    assert shared.in_progress
    boot.gate.set()
    assert (await patient).container == "restored"
    listener = Recorder()
    await shared.join(listener)  # the outcome stays readable; its phase is gone
    assert listener.events == []


async def test_a_reattach_waits_for_the_hand_over_not_for_the_clock():
    clock, launches = ManualClock(), Launches()
    launches.begin("r1")
    waiting = asyncio.ensure_future(launches.wait_handed_over("r1", clock))
    await settle()
    assert not waiting.done()
    launches.hand_over("r1")
    await settle()
    assert waiting.done() and "r1" not in launches
    assert clock.sleepers == []  # the deadline's sleep is gone with it


async def test_a_reattach_gives_up_after_the_budget_and_clear_releases_every_waiter():
    clock, launches = ManualClock(), Launches()
    launches.begin("r1")
    launches.begin("r2")
    waiting = asyncio.ensure_future(launches.wait_handed_over("r1", clock))
    await clock.advance(HAND_OVER_BUDGET_SECONDS - 1)
    assert not waiting.done()
    await clock.advance(1)
    assert waiting.done() and "r1" in launches
    other = asyncio.ensure_future(launches.wait_handed_over("r2", clock))
    await settle()
    launches.clear()
    await settle()
    assert other.done() and "r1" not in launches and "r2" not in launches


async def test_a_cancel_is_remembered_until_the_hand_over():
    launches = Launches()
    launches.cancel("r1")  # not launching: nothing to remember
    launches.begin("r1")
    assert not launches.cancelled("r1")
    launches.cancel("r1")
    assert launches.cancelled("r1")
    launches.hand_over("r1")
    assert not launches.cancelled("r1")
    await launches.wait_handed_over("r1", ManualClock())  # returns at once
