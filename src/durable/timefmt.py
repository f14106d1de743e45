"""Timestamps on the wire: ISO-8601 UTC with milliseconds and `Z`."""

import time


def iso_ms(ms: int | None) -> str | None:
    if ms is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"
