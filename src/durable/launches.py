"""Exec requests the workspace accepted and has not yet handed to the supervisor (they wait for the boot).

A cancel arriving meanwhile is remembered and checked just before the hand-over; a reattach waits for the
hand-over (an event, not a poll), since until then the supervisor has never heard of the request.
"""

import asyncio
from dataclasses import dataclass, field

from durable.ports import Clock
from durable.supervisor_client import STARTUP_BUDGET_SECONDS

# a launching exec reaches the supervisor within its boot's budget: a reattach waits no longer for it
HAND_OVER_BUDGET_SECONDS = STARTUP_BUDGET_SECONDS + 5


@dataclass
class _Launch:
    cancelled: bool = False
    handed_over: asyncio.Event = field(default_factory=asyncio.Event)


class Launches:
    def __init__(self) -> None:
        self._pending: dict[str, _Launch] = {}

    def __contains__(self, request_id: str) -> bool:
        return request_id in self._pending

    def begin(self, request_id: str) -> None:
        self._pending[request_id] = _Launch()

    def cancel(self, request_id: str) -> None:
        launch = self._pending.get(request_id)
        if launch is not None:
            launch.cancelled = True

    def cancelled(self, request_id: str) -> bool:
        launch = self._pending.get(request_id)
        return launch is not None and launch.cancelled

    def hand_over(self, request_id: str) -> None:
        """The request reached the supervisor, or will never reach it: it is no longer launching."""
        launch = self._pending.pop(request_id, None)
        if launch is not None:
            launch.handed_over.set()

    def clear(self) -> None:
        for request_id in list(self._pending):
            self.hand_over(request_id)

    async def wait_handed_over(
        self, request_id: str, clock: Clock, budget_seconds: float = HAND_OVER_BUDGET_SECONDS
    ) -> None:
        """Return once `request_id` is no longer launching, or after `budget_seconds` of `clock` time."""
        launch = self._pending.get(request_id)
        if launch is None:
            return
        handed_over = asyncio.ensure_future(launch.handed_over.wait())
        deadline = asyncio.ensure_future(clock.sleep(budget_seconds))
        try:
            await asyncio.wait({handed_over, deadline}, return_when=asyncio.FIRST_COMPLETED)
        finally:
            handed_over.cancel()
            deadline.cancel()
