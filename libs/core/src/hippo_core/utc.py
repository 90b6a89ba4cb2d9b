"""Microseconds since the epoch as a UTC datetime, exactly.

`datetime.fromtimestamp(time_us / 1e6)` goes through a float: 9999-12-31T23:59:59.999999
rounds up to year 10000 and raises, so a turn the API accepts (Timestamp allows years
1..9999) would break whatever formats its date (the lexical document, the prompt).
Integer arithmetic keeps every representable instant representable.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def utc(time_us: int) -> datetime:
    """The instant `time_us` microseconds after 1970-01-01T00:00:00Z (negative: before)."""
    return EPOCH + timedelta(microseconds=time_us)
