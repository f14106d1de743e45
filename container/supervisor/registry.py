"""The supervisor's commands by request id, cancels that arrived before their exec, and journal retention.

Finished commands are kept for JOURNAL_KEEP_SECONDS after their end, at most JOURNAL_MAX_REQUESTS of them and at
most journal_budget_chars of output in all (the oldest go first); running commands are never dropped. Early cancels
are bounded by count and age the same way.

Pruning runs before every exec, so it costs what changed, not what is kept: finished commands are kept in the order
they ended (the oldest first, so a look stops at the first one that stays) with the total of their output, and only
the commands still running are looked at. (Scanning all 256 kept journals before every exec was a fifth of the
supervisor's CPU per exec.)
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
        self._commands: dict[str, Command] = {}
        self._running: dict[str, Command] = {}  # started, not yet seen finished
        self._ended: OrderedDict[str, Command] = OrderedDict()  # finished, in the order they ended
        self._ended_chars = 0  # output held by the finished ones (a finished journal no longer grows)
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
        self._running[request_id] = command
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
        settings = self.settings
        keep = settings.journal_keep_seconds
        ended = [c for c in self._running.values() if c.journal.ended_at is not None]
        # each one found here ended after every one found by an earlier prune: sorted, the order stays by end time
        for command in sorted(ended, key=lambda c: c.journal.ended_at):
            request_id = command.request.request_id
            del self._running[request_id]
            self._ended[request_id] = command
            self._ended_chars += command.journal.size
        excess = len(self._commands) - settings.journal_max_requests
        stored = self._ended_chars + sum(c.journal.size for c in self._running.values())
        while self._ended:
            request_id, command = next(iter(self._ended.items()))
            journal = command.journal
            if not (excess > 0 or now - journal.ended_at > keep or stored > settings.journal_budget_chars):
                break  # the oldest stays: so do all the younger ones
            del self._ended[request_id]
            del self._commands[request_id]
            self._ended_chars -= journal.size
            stored -= journal.size
            excess -= 1
        while self._pending:  # by arrival: the oldest first
            request_id, at = next(iter(self._pending.items()))
            if now - at <= keep:
                break
            del self._pending[request_id]
