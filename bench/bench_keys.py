"""What a scoped key costs the edge, in process: turning `Authorization: Bearer fbk_…` into a principal (a lookup
in the directory's SQLite file by key id, a constant-time digest compare) versus the deployment token (one digest
compare), over a directory holding 1,000 keys. Goal: the key adds ≤ 0.3 ms at p50 (the same goal as the round
trip row in bench_standalone, which this one isolates from the sandbox's noise)."""

import asyncio
import tempfile
from pathlib import Path

from bench.framework import figure, percentile
from directory.directory import Directory
from durable.settings import Settings
from standalone.clock import AsyncioClock
from standalone.storage import SqliteStorage
from worker.edge import Edge

TOKEN = "bench-token-" + "k" * 40


class _NoWorkspaces:
    def get(self, namespace, workspace):
        raise AssertionError("not used")


def run(quick: bool = False) -> list[dict]:
    return asyncio.run(_run(200 if quick else 5000))


async def _run(repeat: int) -> list[dict]:
    with tempfile.TemporaryDirectory(prefix="fbx-bench-keys-") as tmp:
        storage = SqliteStorage(Path(tmp) / "directory.sqlite3")
        try:
            directory = Directory(storage, AsyncioClock(), Settings())
            edge = Edge(token=TOKEN, settings=Settings(), workspaces=_NoWorkspaces(), directory=directory, version="b")
            keys = []
            for i in range(1000):
                request = {"namespace": "ns", "workspace": f"w{i}", "scopes": ["exec"], "expires_in": None, "label": ""}
                keys.append((await directory.call("mint_key", {"request": request}))["key"])
            # the credential itself, as the edge takes it from the Authorization header (or the WebSocket subprotocol)
            admin_header, key_header = TOKEN, keys[500]
            loop = asyncio.get_running_loop()
            admin, keyed = [], []
            for _ in range(repeat):  # interleaved, so machine load hits both alike
                for header, samples in ((admin_header, admin), (key_header, keyed)):
                    start = loop.time()
                    await edge._principal(header)
                    samples.append(loop.time() - start)
        finally:
            storage.close()
    admin_p50, keyed_p50 = percentile(admin, 50) * 1e3, percentile(keyed, 50) * 1e3
    return [
        figure(
            "scoped key → principal p50 (1,000 keys)",
            keyed_p50,
            "ms",
            "deployment token → principal p50",
            admin_p50,
            note=f"adds {keyed_p50 - admin_p50:.3f} ms (goal ≤ 0.3 ms)",
        )
    ]
