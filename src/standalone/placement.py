"""Which worker process owns a workspace (`flarebox serve --workers N`), like Cloudflare placing each Durable Object
in one place: every request for a workspace, whichever worker accepted it, is served by its owner, so everything
about the workspace — its object and lock, its boot, its alarm, its SQLite file, its sandbox — lives in one process.

Placement is a pure function of the name and N: sha256 of "namespace/workspace" (never Python's hash(), which is
salted per process), so every worker agrees and a restart with the same N places every workspace where it was.

No runtime imports: stdlib only.
"""

import hashlib
import os

WORKERS_ENV = "FLAREBOX_WORKERS"
MAX_WORKERS = 64


def owner(namespace: str, workspace: str, workers: int) -> int:
    """The index (0 … workers-1) of the worker that owns namespace/workspace."""
    if workers < 1:
        raise ValueError(f"workers must be at least 1, not {workers}")
    if workers == 1:
        return 0
    digest = hashlib.sha256(f"{namespace}/{workspace}".encode("utf-8", "surrogatepass")).digest()
    return int.from_bytes(digest[:8], "big") % workers


def parse_workers(value: str | int | None, cpus: int | None = None) -> int:
    """How many worker processes `value` asks for: a whole number 1…MAX_WORKERS, or 0 / "auto" for one per core.
    None or "" is the default, 1 (one process, as before). ValueError with a readable message otherwise."""
    if value is None or (isinstance(value, str) and not value.strip()):
        return 1
    text = str(value).strip().lower()
    if text in ("auto", "0"):
        return max(1, min(MAX_WORKERS, cpus if cpus is not None else (os.cpu_count() or 1)))
    try:
        count = int(text, 10)
    except ValueError:
        raise ValueError(f"workers must be a whole number 1-{MAX_WORKERS}, 0 or 'auto', not {value!r}") from None
    if not 1 <= count <= MAX_WORKERS:
        raise ValueError(f"workers must be a whole number 1-{MAX_WORKERS}, 0 or 'auto', not {value!r}")
    return count
