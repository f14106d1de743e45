"""The Worker's Python cold start under Pyodide (issue 15): the import of src/entry.py (and everything it imports at
module level) in a fresh Pyodide booted as the Cloudflare test harness boots it (tests/cloudflare/pyodide_boot.mjs),
against the import of the Python Workers SDK's `workers` module alone in the same kind of fresh Pyodide, the two
interleaved. Then the Worker's first requests after the import (GET /v1/health and an audited exec, over Durable
Object stubs that answer at once) against the same requests once warm. Median of several fresh interpreters (one
Node process each: tests/cloudflare/cold_start.mjs). Report only: the issue sets no goal for it.

The import row's note lists what the entry loads beyond the SDK and, of that, the modules none of whose Python
functions ran during the requests (a profile of the requests; a module used only for its constants, classes or C
functions shows there too, so it is a list to read, not a verdict)."""

import json
import os
import statistics
import subprocess
from pathlib import Path

from bench.framework import figure

REPO = Path(__file__).resolve().parents[1]
NODE = REPO / "node_modules" / ".bin" / "node"
PROBE = REPO / "tests" / "cloudflare" / "cold_start.mjs"
# The project's own packages, as the Worker bundle ships them
OURS = ("entry", "cloudflare", "worker", "durable", "directory", "protocol")


def _probe(*args: str) -> dict:
    proc = subprocess.run(
        [str(NODE), "--no-warnings", str(PROBE), *args],
        cwd=REPO,
        env={**os.environ, "HARNESS_ROOT": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"cold_start.mjs {' '.join(args)} failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _ours(name: str) -> bool:
    return name.split(".", 1)[0] in OURS


def run(quick: bool = False) -> list[dict]:
    if not NODE.exists():
        raise RuntimeError("node_modules is missing: run `scripts/setup.sh dev` (npm ci)")
    subprocess.run([str(REPO / "scripts" / "vendor_workers_sdk.sh")], check=True, cwd=REPO, capture_output=True)
    repeat = 3 if quick else 7
    sdk, entry = [], []
    for i in range(repeat):  # interleaved, alternating which goes first, so machine load hits both alike
        pair = [lambda: sdk.append(_probe("workers")), lambda: entry.append(_probe("entry", "requests"))]
        for step in pair if i % 2 == 0 else reversed(pair):
            step()
    bad = [r["statuses"] for r in entry if any(s != 200 for s in r["statuses"])]
    if bad:
        raise RuntimeError(f"the Worker's requests did not answer 200: {bad}")

    sdk_ms = [r["import_ms"] for r in sdk]
    entry_ms = [r["import_ms"] for r in entry]
    first_ms = [r["first_ms"] for r in entry]
    warm_ms = [r["warm_ms"] for r in entry]
    last = entry[-1]
    beyond = sorted(set(last["loaded"]) - set(sdk[-1]["loaded"]))
    idle = [m for m in beyond if m not in set(last["ran"])]
    idle_ours = [m for m in idle if _ours(m)]
    idle_other = [m for m in idle if not _ours(m)]
    import_note = (
        f"{len(last['loaded'])} modules at cold start, {len(beyond)} beyond the SDK's "
        f"({sum(map(_ours, beyond))} of ours); of those, no Python function ran during the requests in: "
        f"{', '.join(idle_ours) or 'none'} (ours); {', '.join(idle_other) or 'none'} (stdlib); "
        f"the requests imported {', '.join(last['request_loaded']) or 'nothing more'}; "
        f"Pyodide boot median {statistics.median(r['boot_ms'] for r in entry + sdk):.0f} ms (not counted)"
    )
    first, warm = statistics.median(first_ms), statistics.median(warm_ms)
    return [
        figure(
            "Worker entry import, fresh Pyodide (median)",
            statistics.median(entry_ms),
            "ms",
            "import of the SDK's `workers` alone, fresh Pyodide",
            statistics.median(sdk_ms),
            note=import_note,
        )
        | {"samples": entry_ms, "baseline_samples": sdk_ms, "plot": "cold-start", "samples_label": "entry"},
        figure(
            "Worker's first requests after the import (health + exec, median)",
            first,
            "ms",
            "the same requests again, warm",
            warm,
            note=f"the first requests cost {first - warm:.1f} ms more than warm ones",
        )
        | {"samples": first_ms, "baseline_samples": warm_ms, "plot": "cold-start", "samples_label": "first"},
    ]
