"""Capped, jittered exponential backoff: every retry loop in Hippo waits by this one rule."""

from __future__ import annotations


def delay(failures: int, initial: float, maximum: float, jitter: float) -> float:
    """Seconds to wait after `failures` (>= 1) failures in a row: initial x 2^(n-1),
    capped at `maximum`, times `jitter` (e.g. 0.8..1.2, so retries spread out), capped again."""
    grown: float = initial * 2.0 ** (failures - 1)
    return min(maximum, min(maximum, grown) * jitter)
