"""hippo_core.utc: every instant a protobuf Timestamp can carry converts exactly."""

from __future__ import annotations

from datetime import UTC, datetime

from hippo_core.utc import utc


def test_the_bounds_of_timestamp_convert_without_float_rounding() -> None:
    """fromtimestamp(t / 1e6) rounds 9999-12-31T23:59:59.999999 up to year 10000 and
    raises; the integer conversion keeps the last microsecond."""
    assert utc(253_402_300_799_999_999) == datetime(9999, 12, 31, 23, 59, 59, 999_999, UTC)
    assert utc(-62_135_596_800_000_000) == datetime(1, 1, 1, tzinfo=UTC)
    assert utc(0) == datetime(1970, 1, 1, tzinfo=UTC)
    assert utc(1_683_504_000_123_456) == datetime(2023, 5, 8, 0, 0, 0, 123_456, UTC)
