#!/usr/bin/env python3
"""Live smoke test of a Flarebox deployment (Cloudflare or `flarebox serve`) through the protocol client.

    HERMES_CF_ENDPOINT=https://… HERMES_CF_TOKEN=… python scripts/smoke.py --live

It uses a fresh random namespace (never HERMES_CF_WORKSPACE), and checks: health; a persistent workspace; a stdin
round trip with Japanese, an emoji and `$(…)` (not expanded); exit 7; timeout → 124; a marker file written, the
workspace stopped (status not running), the marker read back after the restore (`container: restored`); finally
the workspace is force-removed. On Cloudflare this starts a container and is billed like normal use.
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def load_client():
    try:
        from flarebox_hermes import client
    except ImportError:  # not installed: load plugin/ from this checkout
        spec = importlib.util.spec_from_file_location(
            "flarebox_smoke_plugin", REPO / "plugin" / "__init__.py", submodule_search_locations=[str(REPO / "plugin")]
        )
        package = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = package
        spec.loader.exec_module(package)
        import importlib as _importlib

        client = _importlib.import_module(f"{spec.name}.client")
    return client


class Smoke:
    def __init__(self, client, ns: str, ws: str):
        self.client, self.ns, self.ws = client, ns, ws
        self.failures = 0

    def step(self, label: str, ok: bool, detail: str = "") -> None:
        print(f"{'ok  ' if ok else 'FAIL'} {label}{(': ' + detail) if detail else ''}", flush=True)
        self.failures += not ok

    def run(self, command: str, *, stdin: str | None = None, timeout: float = 120) -> tuple[str, dict, dict | None]:
        request = {"request_id": uuid.uuid4().hex, "command": command, "timeout": timeout, "stdin": stdin}
        output, started, end = [], None, {}
        for event in self.client.exec(self.ns, self.ws, request):
            if event["type"] == "output":
                output.append(event["data"])
            elif event["type"] == "started":
                started = event
            elif event["type"] in ("exit", "error"):
                end = event
        return "".join(output), end, started


def smoke(endpoint: str, token: str) -> int:
    fc = load_client()
    ns = "smoke-" + uuid.uuid4().hex[:12]
    ws = "live"
    with fc.Client(endpoint, token) as client:
        s = Smoke(client, ns, ws)
        health = client.health()
        s.step("health", health.get("ok") is True and health.get("protocol") == 1, f"version {health.get('version')}")
        try:
            status = client.put_workspace(ns, ws, {"persistent": True})
            s.step("configure persistent workspace", status["config"]["persistent"] is True, f"{ns}/{ws}")
            text = "日本語 🙂 $(echo not-expanded) `id`\n"
            out, end, _ = s.run("cat", stdin=text)
            s.step("stdin round trip", out == text and end.get("exit_code") == 0, repr(out))
            out, end, _ = s.run("echo bye; exit 7")
            s.step("exit 7", end.get("exit_code") == 7 and out == "bye\n")
            begun = time.monotonic()
            out, end, _ = s.run("sleep 10", timeout=0.5)
            s.step("timeout → 124", end.get("exit_code") == 124, f"{time.monotonic() - begun:.1f} s")
            marker = uuid.uuid4().hex
            out, end, _ = s.run(f"echo {marker} > /workspace/marker.txt && sync")
            s.step("write a marker", end.get("exit_code") == 0)
            client.stop(ns, ws)
            status = client.get_workspace(ns, ws)
            s.step("stop → not running", status["running"] is False, f"state {status['state']}")
            s.step("a snapshot was saved", status.get("last_snapshot") is not None)
            out, end, started = s.run("cat /workspace/marker.txt")
            s.step("marker back after restore", out.strip() == marker and end.get("exit_code") == 0)
            container = (started or {}).get("container")
            s.step("container: restored", container == "restored", str(container))
        except fc.FlareboxError as exc:
            s.step("no client error", False, str(exc))
        finally:
            try:
                client.delete_workspace(ns, ws)
                gone = False
                try:
                    client.get_workspace(ns, ws)
                except fc.ApiError as exc:
                    gone = exc.code == "workspace_not_found"
                s.step("force remove", gone)
            except fc.FlareboxError as exc:
                s.step("force remove", False, str(exc))
    print("RESULT", "PASS" if s.failures == 0 else f"FAIL ({s.failures} failed)")
    return 0 if s.failures == 0 else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--live", action="store_true", help="really run against HERMES_CF_ENDPOINT (may be billed)")
    args = parser.parse_args(argv)
    if not args.live:
        print("Pass --live to run against HERMES_CF_ENDPOINT with HERMES_CF_TOKEN (it starts a workspace).")
        return 2
    endpoint, token = os.environ.get("HERMES_CF_ENDPOINT"), os.environ.get("HERMES_CF_TOKEN")
    if not endpoint or not token:
        print("HERMES_CF_ENDPOINT and HERMES_CF_TOKEN must be set", file=sys.stderr)
        return 2
    return smoke(endpoint, token)


if __name__ == "__main__":
    raise SystemExit(main())
