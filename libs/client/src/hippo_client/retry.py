"""When to try a call again, and after how long. Pure: the clients do the sleeping.

Retried: UNAVAILABLE (a dependency down, the gateway starting or draining) and
RESOURCE_EXHAUSTED that carries RetryInfo (overload or the request rate: waiting helps).
RESOURCE_EXHAUSTED without RetryInfo is not retried: the gateway sends none when waiting
frees nothing (the stored-turn quota). Only idempotent calls are retried at all; the
clients decide which (see `calls.py`).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass

from hippo_client.errors import HippoError


@dataclass(frozen=True)
class RetryPolicy:
    """Capped exponential backoff with jitter, bounded in attempts and by the deadline.

    Attempt n (1-based) that fails waits `min(max_backoff, initial_backoff *
    multiplier ** (n - 1))` scaled by a random factor in [1 - jitter, 1], or the
    server's RetryInfo delay if longer (plus up to `jitter` of it, so clients told the
    same delay do not return in step). No retry once `max_attempts` calls were made, or
    when the wait would not leave `min_attempt_seconds` of the call's deadline.
    `RetryPolicy(max_attempts=1)` turns retries off."""

    max_attempts: int = 4
    initial_backoff: float = 0.1
    max_backoff: float = 5.0
    multiplier: float = 2.0
    jitter: float = 0.2
    min_attempt_seconds: float = 0.05
    codes: frozenset[str] = frozenset({"UNAVAILABLE", "RESOURCE_EXHAUSTED"})

    def __post_init__(self) -> None:
        if self.max_attempts < 1:
            raise ValueError("max_attempts must be at least 1")
        if not 0 <= self.jitter <= 1:
            raise ValueError("jitter must be in [0, 1]")

    def retryable(self, error: HippoError) -> bool:
        if error.code not in self.codes:
            return False
        return error.code != "RESOURCE_EXHAUSTED" or error.retry_after is not None

    def delay(
        self,
        attempt: int,
        error: HippoError,
        remaining: float,
        rng: random.Random | None = None,
    ) -> float | None:
        """Seconds to wait before attempt `attempt + 1`, or None: give up and raise
        `error`. `remaining` is what is left of the call's deadline, in seconds."""
        if attempt >= self.max_attempts or not self.retryable(error):
            return None
        draw = (rng or random).random()
        backoff = min(self.max_backoff, self.initial_backoff * self.multiplier ** (attempt - 1))
        wait = backoff * (1 - self.jitter * draw)
        if error.retry_after is not None:
            wait = max(wait, error.retry_after * (1 + self.jitter * draw))
        if wait + self.min_attempt_seconds > remaining:
            return None
        return wait


class Attempts:
    """The attempts of one call under one deadline: `remaining()` is the timeout to give
    the next attempt, `backoff(error)` the wait before it, or raises `error` when the call
    must not (not idempotent) or need not (policy, deadline) be tried again."""

    def __init__(self, policy: RetryPolicy, timeout: float, idempotent: bool) -> None:
        self._policy = policy
        self._deadline = time.monotonic() + timeout
        self._idempotent = idempotent
        self._made = 1

    def remaining(self) -> float:
        return max(0.001, self._deadline - time.monotonic())

    def backoff(self, error: HippoError) -> float:
        if not self._idempotent:
            raise error from None
        wait = self._policy.delay(self._made, error, self._deadline - time.monotonic())
        if wait is None:
            raise error from None
        self._made += 1
        return wait
