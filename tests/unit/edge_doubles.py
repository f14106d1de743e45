"""Small in-test doubles for the edge's ports (test doubles, not runtimes: the real adapters are tested
end-to-end by the standalone and Cloudflare suites)."""

import json

from directory.directory import Directory
from durable import operations
from durable.ports import Response
from durable.settings import Settings
from protocol.errors import ProtocolError
from standalone.storage import SqliteStorage
from worker.request import EdgeRequest

TOKEN = "t" * 40


class Body:
    """A request body that records whether anything read it."""

    def __init__(self, data: bytes = b"", *, forbidden: bool = False):
        self.data = data
        self.forbidden = forbidden
        self.read_called = False
        self.stream = object()  # opaque, only identity matters

    async def read(self, limit: int) -> bytes:
        self.read_called = True
        if self.forbidden:
            raise AssertionError("the body must not be read")
        if len(self.data) > limit:
            raise ProtocolError("payload_too_large")
        return self.data


class Stub:
    def __init__(self, workspaces, ns, ws):
        self.workspaces, self.ns, self.ws = workspaces, ns, ws

    async def call(self, op, args, body=None):
        # recorded as they cross a Durable Object stub: the arguments' JSON
        self.workspaces.calls.append((self.ns, self.ws, op, operations.to_json(args), body))
        if self.workspaces.raise_exc is not None:
            raise self.workspaces.raise_exc
        return self.workspaces.response


class Workspaces:
    def __init__(self):
        self.calls = []
        self.response = Response(200, b"ok")
        self.raise_exc = None

    def get(self, namespace, workspace):
        return Stub(self, namespace, workspace)


class ByOperation(Workspaces):
    """Answers by operation: `answers[op]`, else the default response."""

    def __init__(self, answers):
        super().__init__()
        self.answers = answers

    def get(self, namespace, workspace):
        double = self

        class Stub:
            async def call(self, op, args, body=None):
                double.calls.append((namespace, workspace, op, None, body))
                answer = double.answers.get(op, double.response)
                if isinstance(answer, Exception):
                    raise answer
                return answer

        return Stub()


def auth(token: str = TOKEN) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def send(edge, method, path, query="", headers=None, body=None):
    return await edge.handle(EdgeRequest(method, path, query, {**auth(), **(headers or {})}, body or Body()))


def error(resp):
    return resp.status, json.loads(resp.body)["error"]["code"]


class FixedClock:
    def __init__(self, ms: int = 1_800_000_000_000):
        self.ms = ms

    def now_ms(self) -> int:
        return self.ms


def directory_object(settings: Settings | None = None, clock: FixedClock | None = None) -> Directory:
    """The real directory object over an in-memory SQLite database."""
    return Directory(SqliteStorage(":memory:"), clock or FixedClock(), settings or Settings())
