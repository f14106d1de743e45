"""Journal retention: bounded by count, age and total size; running commands are never dropped.

Runs the registry in-process (with real commands) so the bounds can be made small.
"""

import asyncio
import secrets
import tempfile

import pytest

from flarebox_supervisor.identity import resolve_identity
from flarebox_supervisor.registry import Registry
from flarebox_supervisor.settings import Settings
from protocol.validate import parse_exec_request

from .harness import SANDBOX_USER

pytestmark = pytest.mark.timeout(60)


def _registry(**bounds) -> Registry:
    return Registry(Settings(workdir=tempfile.gettempdir(), **bounds), resolve_identity(SANDBOX_USER))


async def _run(registry: Registry, command: str) -> str:
    request_id = secrets.token_hex(16)
    started = registry.start(parse_exec_request({"request_id": request_id, "command": command}), "/")
    while started.journal.terminal is None:
        await started.journal.changed().wait()
    return request_id


async def test_oldest_finished_journals_go_first_by_count():
    registry = _registry(journal_max_requests=3)
    ids = [await _run(registry, f"echo {i}") for i in range(5)]
    registry.prune()
    assert [registry.get(i) is not None for i in ids] == [False, False, True, True, True]


async def test_budget_and_age_bounds():
    registry = _registry(journal_budget_chars=25, journal_keep_seconds=0.5)
    ids = [await _run(registry, "printf '%010d' 0") for _ in range(4)]  # 10 code points each
    registry.prune()
    assert [registry.get(i) is not None for i in ids] == [False, False, True, True]
    await asyncio.sleep(0.6)
    assert registry.get(ids[-1]) is None


async def test_running_commands_are_never_dropped():
    registry = _registry(journal_max_requests=1, journal_keep_seconds=0.01)
    request_id = secrets.token_hex(16)
    running = registry.start(parse_exec_request({"request_id": request_id, "command": "sleep 30"}), "/")
    try:
        for _ in range(3):
            await _run(registry, "true")
        await asyncio.sleep(0.05)
        assert registry.get(request_id) is running
    finally:
        registry.cancel(request_id)
        while running.journal.terminal is None:
            await running.journal.changed().wait()
    assert running.journal.terminal["reason"] == "cancelled"


async def test_the_command_that_ended_last_is_kept_whichever_started_first():
    """Retention counts from a command's end: one that started first but ran longest is the newest journal (the
    one a caller is most likely to reattach to), so a count bound drops the ones that ended before it."""
    registry = _registry(journal_max_requests=2)
    long_id = secrets.token_hex(16)
    long = registry.start(parse_exec_request({"request_id": long_id, "command": "sleep 0.3"}), "/")
    quick = [await _run(registry, "true") for _ in range(2)]
    while long.journal.terminal is None:
        await long.journal.changed().wait()
    registry.prune()
    assert registry.get(long_id) is long
    assert [registry.get(i) is not None for i in quick] == [False, True]


async def test_a_long_history_keeps_exactly_the_newest_within_every_bound():
    registry = _registry(journal_max_requests=5, journal_budget_chars=35)
    ids = [await _run(registry, "printf '%010d' 0") for _ in range(12)]  # 10 code points each
    assert [registry.get(i) is not None for i in ids] == [False] * 9 + [True] * 3
    assert [c.request.request_id for c in registry.recent()] == ids[:-4:-1]
