"""The supervisor's commands by request id, cancels that arrived before their exec, and journal retention.

Finished commands are kept for JOURNAL_KEEP_SECONDS after their end, at most JOURNAL_MAX_REQUESTS of them and at
most journal_budget_chars of output in all (the oldest go first); running commands are never dropped. Early cancels
are bounded by count and age the same way.
"""

import time
from collections import OrderedDict

from flarebox_supervisor.identity import Identity
from flarebox_supervisor.runner import Command
from flarebox_supervisor.settings import Settings
from protocol.errors import ProtocolError
from protocol.validate import ExecRequest


class Registry:
    def __init__(self, settings: Settings, identity: Identity):
        self.settings = settings
        self.identity = identity
        self._commands: OrderedDict[str, Command] = OrderedDict()
        self._pending: OrderedDict[str, float] = OrderedDict()  # request id → when its cancel arrived

    def start(self, request: ExecRequest, cwd: str) -> Command:
        self.prune()
        request_id = request.request_id
        if request_id in self._pending:
            raise ProtocolError("command_cancelled")
        if request_id in self._commands:
            raise ProtocolError("duplicate_request")
        command = Command(request, cwd, self.settings, self.identity)
        command.start()
        self._commands[request_id] = command
        return command

    def get(self, request_id: str) -> Command | None:
        self.prune()
        return self._commands.get(request_id)

    def recent(self) -> list[Command]:
        """Every command still held (running, or finished and not yet pruned), newest first."""
        self.prune()
        return list(reversed(self._commands.values()))

    def cancel(self, request_id: str) -> str:
        self.prune()
        command = self._commands.get(request_id)
        if command is not None:
            return command.cancel()
        self._pending[request_id] = time.monotonic()
        self._pending.move_to_end(request_id)
        while len(self._pending) > self.settings.journal_max_requests:
            self._pending.popitem(last=False)
        return "pending"

    def running(self) -> int:
        return sum(1 for c in self._commands.values() if c.alive)

    def kill_all(self) -> None:
        for command in self._commands.values():
            command.kill()

    def prune(self) -> None:
        now = time.monotonic()
        keep = self.settings.journal_keep_seconds
        ended = [(rid, c) for rid, c in self._commands.items() if c.journal.ended_at is not None]
        excess = len(self._commands) - self.settings.journal_max_requests
        stored = sum(c.journal.size for c in self._commands.values())
        for rid, command in ended:  # insertion order ≈ oldest first
            too_old = now - command.journal.ended_at > keep
            if excess > 0 or too_old or stored > self.settings.journal_budget_chars:
                del self._commands[rid]
                excess -= 1
                stored -= command.journal.size
        for rid, at in list(self._pending.items()):
            if now - at > keep:
                del self._pending[rid]
