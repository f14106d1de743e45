"""python -m bench [--only NAME]... [--quick]: run benchmark modules, write bench/out/results.json, print a table,
and write the report (bench/report.py): bench/results.md and bench/plots/*.png for a run of every module, or
bench/out/results.md and bench/out/plots/ for a run limited by --only (the committed report stays whole)."""

import argparse
import datetime
import importlib
import json
import os
import platform
import sys
import traceback
from pathlib import Path

from bench import report as bench_report
from bench.framework import markdown_table, normalize

HERE = Path(__file__).resolve().parent


def discover() -> list[str]:
    return sorted(p.stem for p in HERE.glob("bench_*.py"))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    parser.add_argument(
        "--only",
        action="append",
        metavar="NAME",
        help="run only this module (e.g. supervisor or bench_supervisor); may repeat",
    )
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and smaller sizes")
    args = parser.parse_args(argv)
    modules = discover()
    if args.only:
        wanted = {name if name.startswith("bench_") else f"bench_{name}" for name in args.only}
        unknown = wanted - set(modules)
        if unknown:
            parser.error(f"no such benchmark: {', '.join(sorted(unknown))} (have: {', '.join(modules)})")
        modules = [m for m in modules if m in wanted]
    results, failures = [], []
    for name in modules:
        print(f"bench: running {name}{' (quick)' if args.quick else ''}", file=sys.stderr, flush=True)
        try:
            rows = importlib.import_module(f"bench.{name}").run(quick=args.quick)
        except Exception:
            traceback.print_exc()
            failures.append(name)
            continue
        for row in rows:
            results.append({"module": name, **normalize(row)})
    out = HERE / "out"
    out.mkdir(exist_ok=True)
    full_results = results
    results, _ = bench_report.split_samples(results)  # sample lists go to the plots, not results.json
    report = {
        "generated_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "machine": {"python": platform.python_version(), "platform": platform.platform(), "cpus": os.cpu_count()},
        "failed_modules": failures,
        "results": results,
    }
    (out / "results.json").write_text(json.dumps(report, indent=2) + "\n")
    print(markdown_table(results))
    written = bench_report.write(report, full_results, out if args.only else HERE)
    print(f"\nreport: {written.relative_to(HERE.parent)}", file=sys.stderr)
    if failures:
        print(f"\nfailed: {', '.join(failures)}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
