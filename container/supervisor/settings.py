"""Supervisor settings: the CLI's choices plus a few operator overrides from the environment.

Limits default to protocol v1; an operator may only lower the file limits (FLAREBOX_MAX_FILE_*_BYTES). The heartbeat
interval, a service's first restart delay, the proxy's head timeout and a detached terminal's linger may be lowered
too, so tests can observe heartbeats, crash loops and timeouts without waiting for the protocol's values.
"""

import os
from dataclasses import dataclass

from protocol import limits


@dataclass(frozen=True)
class Settings:
    workdir: str = limits.DEFAULT_CWD
    max_file_read_bytes: int = limits.MAX_FILE_READ_BYTES
    max_file_write_bytes: int = limits.MAX_FILE_WRITE_BYTES
    heartbeat_seconds: float = limits.HEARTBEAT_SECONDS
    max_output_chars: int = limits.MAX_OUTPUT_CHARS
    kill_grace_seconds: float = limits.KILL_GRACE_SECONDS
    drain_idle_seconds: float = limits.DRAIN_IDLE_SECONDS
    drain_max_seconds: float = limits.DRAIN_MAX_SECONDS
    journal_max_requests: int = limits.JOURNAL_MAX_REQUESTS
    journal_keep_seconds: float = limits.JOURNAL_KEEP_SECONDS
    # Memory bound for kept journals (code points over all finished commands), so 256 journals of 2,000,000 code
    # points each cannot exhaust a small instance; the oldest finished journals go first.
    journal_budget_chars: int = 32_000_000
    service_log_chars: int = limits.SERVICE_LOG_CHARS
    service_backoff_first_seconds: float = limits.SERVICE_BACKOFF_FIRST_SECONDS
    service_backoff_max_seconds: float = limits.SERVICE_BACKOFF_MAX_SECONDS
    service_quick_exit_seconds: float = limits.SERVICE_QUICK_EXIT_SECONDS
    service_max_quick_exits: int = limits.SERVICE_MAX_QUICK_EXITS
    proxy_head_seconds: float = limits.PROXY_HEAD_SECONDS
    pty_linger_seconds: float = limits.PTY_LINGER_SECONDS


def _positive(environ: dict, name: str, default: float, cap: float | None = None) -> float:
    raw = environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        value = float(raw)
    except ValueError:
        raise SystemExit(f"{name} must be a number, got {raw!r}") from None
    if not value > 0:
        raise SystemExit(f"{name} must be > 0")
    return min(value, cap) if cap is not None else value


def settings_from_env(workdir: str, environ: dict | None = None) -> Settings:
    env = os.environ if environ is None else environ
    return Settings(
        workdir=workdir,
        max_file_read_bytes=int(
            _positive(env, "FLAREBOX_MAX_FILE_READ_BYTES", limits.MAX_FILE_READ_BYTES, limits.MAX_FILE_READ_BYTES)
        ),
        max_file_write_bytes=int(
            _positive(env, "FLAREBOX_MAX_FILE_WRITE_BYTES", limits.MAX_FILE_WRITE_BYTES, limits.MAX_FILE_WRITE_BYTES)
        ),
        heartbeat_seconds=_positive(
            env, "FLAREBOX_HEARTBEAT_SECONDS", limits.HEARTBEAT_SECONDS, limits.HEARTBEAT_SECONDS
        ),
        # lower only, like the heartbeat: tests see a crash loop end and a silent upstream time out in well under 1 s
        service_backoff_first_seconds=_positive(
            env,
            "FLAREBOX_SERVICE_BACKOFF_FIRST_SECONDS",
            limits.SERVICE_BACKOFF_FIRST_SECONDS,
            limits.SERVICE_BACKOFF_FIRST_SECONDS,
        ),
        proxy_head_seconds=_positive(
            env, "FLAREBOX_PROXY_HEAD_SECONDS", limits.PROXY_HEAD_SECONDS, limits.PROXY_HEAD_SECONDS
        ),
        pty_linger_seconds=_positive(
            env, "FLAREBOX_PTY_LINGER_SECONDS", limits.PTY_LINGER_SECONDS, limits.PTY_LINGER_SECONDS
        ),
    )
