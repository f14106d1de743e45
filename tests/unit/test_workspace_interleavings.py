"""Random interleavings of requests, crashes and alarms (seeded, so reproducible): whatever the order, every exec
stream ends with exactly one terminal event, nothing fails internally, and a booted workspace never restarts empty."""

import asyncio
import logging
import random

import pytest
from test_workspace import Env, rid

pytestmark = pytest.mark.timeout(60)

OPS = ["exec", "exec", "hold", "release", "crash", "stop", "snapshot", "alarm", "cancel", "reattach", "get", "recreate"]


async def scenario(seed: int, caplog) -> None:
    rnd = random.Random(seed)
    env = Env()
    env.container.keep_disk_on_crash = rnd.random() < 0.5
    await env.put(persistent=rnd.random() < 0.8)
    streams, used = [], []
    generation_starts = [0]  # index into container.starts where each generation (delete + create) begins

    async def one(op: str, n: int) -> None:
        if op in ("exec", "hold"):
            resp = await env.start_exec("hold" if op == "hold" else "echo x", request_id=rid(n))
            if resp.status == 200:
                streams.append(resp)
                used.append(rid(n))
        elif op == "release":
            for ev in env.container.holds.values():
                ev.set()
        elif op == "crash":
            env.container.crash()
        elif op == "alarm":
            if env.alarm.at_ms is not None:
                await env.fire_alarm_at_deadline()
        elif op in ("cancel", "reattach") and used:
            target = rnd.choice(used)
            args = {"request_id": target} if op == "cancel" else {"request_id": target, "offset": 0}
            await env.call(op, args)
        elif op == "recreate":
            await env.call("delete")
            generation_starts.append(len(env.container.starts))
            await env.put(persistent=rnd.random() < 0.8)
        elif op in ("stop", "snapshot", "get"):
            await env.call(op)

    n = 0
    for _ in range(12):
        batch = []
        for _ in range(rnd.randint(1, 3)):
            n += 1
            batch.append(one(rnd.choice(OPS), n))
        # some requests wait on the clock (a reattach waiting for its exec's hand-over): let time pass meanwhile
        task = asyncio.ensure_future(asyncio.gather(*batch))
        for _ in range(1000):
            if task.done():
                break
            await env.clock.advance(0.1)
        assert task.done(), "requests still waiting after 100 s of virtual time: a deadlock"
        await task
        await env.clock.advance(rnd.choice([0, 0, 1, 30]))
    for ev in env.container.holds.values():
        ev.set()
    await env.clock.advance(120)
    await env.clock.drain()

    for resp in streams:
        events = resp.body.events()
        assert resp.body.closed
        terminal = [i for i, e in enumerate(events) if e["type"] in ("exit", "error")]
        assert terminal == [len(events) - 1], events
        assert len([e for e in events if e["type"] == "started"]) <= 1
        assert events[-1].get("code") != "internal_error", events
    # a workspace that booted never starts again without its files: one empty start per generation at most
    bounds = generation_starts + [len(env.container.starts)]
    for lo, hi in zip(bounds, bounds[1:], strict=False):
        assert sum(env.container.empty_starts[lo:hi]) <= 1, env.container.empty_starts
    errors = [r for r in caplog.records if r.levelno >= logging.ERROR and r.name.startswith("flarebox")]
    assert errors == [], [r.getMessage() for r in errors]


@pytest.mark.parametrize("seed", range(200))
async def test_random_interleavings(seed, caplog):
    await scenario(seed, caplog)
