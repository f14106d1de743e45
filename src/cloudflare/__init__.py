"""Cloudflare adapters: the ports of `durable.ports` over Workers bindings (ctx.storage, ctx.container, JS streams).

Only this package and `entry.py` import `js`/`pyodide`; they run inside the Workers runtime (and, for tests, inside
the npm `pyodide` release that matches the Worker's compatibility_date, behind tests/cloudflare/harness.mjs).
They hold no decisions: every decision lives in `worker/` and `durable/`.
"""
