"""Flarebox benchmarks: `python -m bench [--only NAME] [--quick]`.

Every `bench/bench_*.py` module has `run(quick: bool) -> list[dict]`; each dict is one figure made with
`bench.framework.figure(...)`: a measured value, the baseline it is compared to (measured in the same run), and an
optional goal for the ratio value / baseline. Results go to bench/out/results.json and a markdown table on stdout.
"""
