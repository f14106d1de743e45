"""Shared pieces of the benchmark runner: the figure record, timing helpers, percentiles, the markdown table."""

import statistics
import time
from collections.abc import Callable


def figure(
    name: str,
    value: float,
    unit: str,
    baseline: str,
    baseline_value: float,
    goal: float | None = None,
    better: str = "lower",
    note: str = "",
) -> dict:
    """One measured figure. ratio = value / baseline_value; the goal bounds the ratio from above when lower is
    better (latency, time) and from below when higher is better (throughput)."""
    if better not in ("lower", "higher"):
        raise ValueError("better is 'lower' or 'higher'")
    ratio = value / baseline_value if baseline_value else None
    if goal is None or ratio is None:
        met = None
    else:
        met = ratio <= goal if better == "lower" else ratio >= goal
    return {
        "name": name,
        "value": value,
        "unit": unit,
        "baseline": baseline,
        "baseline_value": baseline_value,
        "ratio": ratio,
        "goal": goal,
        "better": better,
        "met": met,
        "note": note,
    }


def normalize(row: dict) -> dict:
    """Accept rows not made with figure(): {"baseline_name": str, "baseline": number} is read as the baseline's
    name and value; a missing ratio/goal/met is filled in."""
    row = dict(row)
    if "baseline_name" in row:
        row["baseline_value"] = row.pop("baseline")
        row["baseline"] = row.pop("baseline_name")
    made = figure(
        row["name"],
        row["value"],
        row.get("unit", ""),
        row.get("baseline", "—"),
        row.get("baseline_value"),
        row.get("goal"),
        row.get("better", "lower"),
        row.get("note", ""),
    )
    return {**row, **{k: v for k, v in made.items() if k not in row or row[k] is None}}


def percentile(samples: list[float], p: float) -> float:
    ordered = sorted(samples)
    if len(ordered) == 1:
        return ordered[0]
    return statistics.quantiles(ordered, n=100, method="inclusive")[int(p) - 1]


def timed(fn: Callable[[], object], repeat: int, warmup: int = 0) -> list[float]:
    """Wall-clock seconds of each call."""
    for _ in range(warmup):
        fn()
    samples = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - start)
    return samples


def timed_pair(
    ours: Callable[[], object], baseline: Callable[[], object], repeat: int, warmup: int = 0
) -> tuple[list[float], list[float]]:
    """Time two alternatives interleaved (A, B, A, B, …) so that load changing during the run hits both alike."""
    for _ in range(warmup):
        ours()
        baseline()
    a, b = [], []
    for _ in range(repeat):
        for fn, samples in ((ours, a), (baseline, b)):
            start = time.perf_counter()
            fn()
            samples.append(time.perf_counter() - start)
    return a, b


def fmt(value) -> str:
    if value is None:
        return "—"
    if isinstance(value, float):
        return f"{value:.3g}" if abs(value) < 1000 else f"{value:,.0f}"
    return str(value)


def markdown_table(results: list[dict]) -> str:
    lines = [
        "| name | value | unit | baseline | baseline value | ratio | goal | met? |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in results:
        r = {k: v.replace("|", "\\|") if isinstance(v, str) else v for k, v in r.items()}
        goal = "—" if r["goal"] is None else ("≤ " if r["better"] == "lower" else "≥ ") + f"{r['goal']}×"
        met = {True: "yes", False: "**no**", None: "—"}[r["met"]]
        ratio = "—" if r["ratio"] is None else f"{r['ratio']:.2f}×"
        lines.append(
            f"| {r['name']} | {fmt(r['value'])} | {r['unit']} | {r['baseline']} | "
            f"{fmt(r['baseline_value'])} | {ratio} | {goal} | {met} |"
        )
    return "\n".join(lines)
