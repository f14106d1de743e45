"""Timestamps read from the wire (durable/timefmt.py): only the documented form, only real dates."""

import pytest

from durable.timefmt import iso_ms, parse_iso_ms


@pytest.mark.parametrize(
    "text,ms",
    [
        ("2026-12-01T09:00:00Z", 1796115600000),
        ("2026-12-01T09:00:00.5Z", 1796115600500),
        ("2026-12-01T09:00:00.123456Z", 1796115600123),
        ("2024-02-29T00:00:00Z", 1709164800000),
        ("2026-02-29T00:00:00Z", None),
        ("2026-02-31T00:00:00Z", None),
        ("2026-13-01T00:00:00Z", None),
        ("0000-01-01T00:00:00Z", None),
        ("2026-12-01T24:00:00Z", None),
        ("2026-12-01T09:60:00Z", None),
        ("2026-12-01 09:00:00Z", None),
        ("2026-12-01T09:00:00", None),
        ("２０２６-12-01T09:00:00Z", None),
        ("2026-12-01T09:00:00Z\n", None),
    ],
)
def test_wire_timestamps_parse_strictly(text, ms):
    assert parse_iso_ms(text) == ms


def test_what_is_written_reads_back():
    for ms in (0, 1, 999, 1796115600123):
        assert parse_iso_ms(iso_ms(ms)) == ms
