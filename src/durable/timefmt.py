"""Timestamps on the wire: ISO-8601 UTC with milliseconds and `Z`."""

import re
import time


def iso_ms(ms: int | None) -> str | None:
    if ms is None:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ms // 1000)) + f".{ms % 1000:03d}Z"


_ISO = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2})T([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.([0-9]{1,6}))?Z")


def parse_iso_ms(text: str) -> int | None:
    """Milliseconds since the epoch of a timestamp in the wire's form (fractions optional), or None."""
    import calendar  # here: few requests parse a time, and it costs the Worker's cold start ~20 ms in Pyodide

    m = _ISO.fullmatch(text)
    if m is None:
        return None
    year, month, day, hour, minute, second = (int(g) for g in m.groups()[:6])
    if year < 1 or not (1 <= month <= 12 and 1 <= day <= calendar.monthrange(year, month)[1]):
        return None  # no 31 February rolling over into March
    if hour > 23 or minute > 59 or second > 59:
        return None
    seconds = calendar.timegm((year, month, day, hour, minute, second, 0, 0, 0))
    return seconds * 1000 + int((m.group(7) or "0").ljust(3, "0")[:3])
