"""Load and soak on a real `flarebox serve` (bench/loadgen.py), loopback only.

  mix    50 concurrent clients for 60 s on 20 workspaces (exec, file write, file read checked by sha256, status):
         requests served, errors (goal 0), throughput vs one client alone, the server's CPU per request (its own
         efficiency, apart from the load generator's), and p50/p95/p99 latency per operation kind vs the same
         operation from one client on the idle server (measured first, same run).
  soak   every one of the 20 workspaces snapshotted by the idle alarm and restored 3 times, contents verified each
         time: errors (goal 0), restore-and-exec latency vs a warm exec, idle stop time.
--quick: 10 clients, 15 s, 5 workspaces; soak 5 workspaces × 2 cycles.
"""

import statistics

from bench import loadgen
from bench.framework import figure, percentile

IDLE_SECONDS = 2  # the soak's idle deadline: small, so cycles are quick


def _ms(samples: list[float]) -> list[float]:
    return [s * 1000 for s in samples]


def _errors_row(name: str, tally: loadgen.Tally, note: str) -> dict:
    if tally.errors:
        kind, why = tally.errors[0]
        note += f"; first error ({kind}): {why[:160]}"
    row = figure(name, len(tally.errors), "errors", "goal", 0, note=note)
    row.update(goal_text="0", met=not tally.errors, ratio=None)
    return row


def run(quick: bool = False) -> list[dict]:
    clients, workspaces, seconds = (10, 5, 15) if quick else (50, 20, 60)
    soak_workspaces, cycles = (5, 2) if quick else (20, 3)
    rows: list[dict] = []

    server = loadgen.Server(idle_seconds=3600)
    try:
        names = loadgen.setup(server, workspaces)
        loadgen.baseline(server, names[0], 2)  # boots names[0]: its start is not a request's cost
        cpu0 = server.cpu_seconds()
        alone = loadgen.baseline(server, names[0], 10 if quick else 40)
        cpu1 = server.cpu_seconds()
        loaded = loadgen.mix(server, names, clients, seconds)
        cpu2 = server.cpu_seconds()
    finally:
        server.stop()
    served = loaded.served
    label = f"{clients} clients, {workspaces} workspaces, {seconds} s"
    rows.append(_errors_row(f"load: errors ({label})", loaded, f"{served} requests served"))
    one_client_rate = 1 / statistics.fmean(s for v in alone.samples.values() for s in v)
    rows.append(
        figure(
            f"load: throughput ({label})",
            served / seconds,
            "req/s",
            "one client alone, same mix",
            one_client_rate,
            goal=1.0,
            better="higher",
            note=f"{served} requests in {seconds} s; the {clients} client threads share the machine's "
            "2 cores (and one GIL) with the server and the sandboxes",
        )
    )
    # the server's own efficiency, free of the load generator's: CPU it spends per request, loaded vs alone
    rows.append(
        figure(
            f"load: server CPU per request ({clients} clients)",
            (cpu2 - cpu1) * 1000 / served,
            "ms",
            "one client alone",
            (cpu1 - cpu0) * 1000 / alone.served,
            goal=1.5,
            note="user + system time of the flarebox serve process (sandboxes excluded; the loaded "
            "figure includes booting the other workspaces)",
        )
    )
    for kind in loadgen.KINDS:
        ours, base = _ms(loaded.samples[kind]), _ms(alone.samples[kind])
        if not ours or not base:
            continue
        for p in (50, 95, 99):
            row = figure(
                f"load: {kind} p{p} ({clients} clients)",
                percentile(ours, p),
                "ms",
                f"{kind} p{p}, one client alone",
                percentile(base, p),
                note=f"{len(ours)} requests" if p == 50 else "",
            )
            if p == 50:  # one distribution plot per kind: loaded vs alone
                row.update(
                    samples=ours,
                    baseline_samples=base,
                    plot="load-latency",
                    plot_title=f"{kind}: {clients} concurrent clients vs one client alone",
                    samples_label=f"{clients} clients",
                )
            rows.append(row)

    server = loadgen.Server(idle_seconds=IDLE_SECONDS)
    try:
        names = loadgen.setup(server, soak_workspaces)
        warm = loadgen.baseline(server, names[0], 10 if quick else 30)
        soaked = loadgen.soak(server, names, cycles, IDLE_SECONDS)
    finally:
        server.stop()
    restores = soaked.samples["restore"]
    rows.append(
        _errors_row(
            f"soak: errors ({soak_workspaces} workspaces × {cycles} idle snapshot/restore cycles)",
            soaked,
            f"{len(restores)} restores verified (sha256 of every file of every cycle)",
        )
    )
    if restores:
        warm_exec = _ms(warm.samples["exec"])
        row = figure(
            "soak: restore + exec p50",
            percentile(_ms(restores), 50),
            "ms",
            "warm exec p50",
            percentile(warm_exec, 50),
            note=f"{soak_workspaces} workspaces restoring at once",
        )
        row.update(
            samples=_ms(restores),
            baseline_samples=warm_exec,
            plot="soak",
            samples_label="after an idle stop",
            plot_title="first exec after an idle stop (restore + exec) vs a warm exec",
        )
        rows.append(row)
        rows.append(
            figure(
                "soak: restore + exec p95",
                percentile(_ms(restores), 95),
                "ms",
                "warm exec p95",
                percentile(warm_exec, 95),
            )
        )
    if soaked.samples["idle_stop"]:
        stops = _ms(soaked.samples["idle_stop"])
        rows.append(
            figure(
                "soak: last activity → stopped (idle snapshot + stop) p50",
                percentile(stops, 50),
                "ms",
                "IDLE_SECONDS",
                IDLE_SECONDS * 1000,
                note="includes the idle deadline itself",
            )
        )
    return rows
