"""The load test drives the benchmark's load generator (bench/loadgen.py) in a reduced form: one generator, two
sizes. The repo root is put on sys.path so `bench` imports however pytest is started."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
