"""Per-tenant quotas: requests per second (a token bucket) and stored turns.

Both are kept per gateway replica, in memory: a shared counter would put a database
round trip on every request. So with N gateway replicas a tenant may reach N times its
request rate (set `requests_per_second` to the tenant's share of one replica, or route a
tenant to one replica), and the stored-turn count is refreshed from the turn store every
`refresh_seconds`, so replicas together may overshoot it by what they accept in that
interval. Both are documented in docs/security.md.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass

from hippo_core.errors import ResourceExhausted
from hippo_gateway import metrics


@dataclass(frozen=True)
class TenantQuota:
    """0 means unlimited."""

    requests_per_second: float = 0.0
    burst: int = 0  # bucket size; 0: max(1, requests_per_second)
    max_stored_turns: int = 0


class _Bucket:
    __slots__ = ("stamp", "tokens")

    def __init__(self, tokens: float, stamp: float) -> None:
        self.tokens, self.stamp = tokens, stamp


class Quotas:
    """Admits or refuses a tenant's requests and stored turns."""

    def __init__(
        self,
        quotas: Mapping[str, TenantQuota],
        default: TenantQuota,
        *,
        count_turns: Callable[[str], Awaitable[int]] | None = None,
        refresh_seconds: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._quotas, self._default = dict(quotas), default
        self._count = count_turns
        self._refresh = refresh_seconds
        self._clock = clock
        self._buckets: dict[str, _Bucket] = {}
        self._turns: dict[str, tuple[int, float]] = {}  # tenant -> (count, when read)

    def count_turns_with(self, count_turns: Callable[[str], Awaitable[int]]) -> None:
        """Where stored turns are counted (the turn store, reached after warm-up)."""
        self._count = count_turns

    def of(self, tenant: str) -> TenantQuota:
        return self._quotas.get(tenant, self._default)

    def admit(self, tenant: str) -> None:
        """One request of `tenant`, or ResourceExhausted with how long to wait."""
        quota = self.of(tenant)
        rate = quota.requests_per_second
        if rate <= 0:
            return
        size = float(quota.burst or max(1.0, rate))
        now = self._clock()
        bucket = self._buckets.get(tenant)
        if bucket is None:
            bucket = self._buckets[tenant] = _Bucket(size, now)
        bucket.tokens = min(size, bucket.tokens + (now - bucket.stamp) * rate)
        bucket.stamp = now
        if bucket.tokens >= 1.0:
            bucket.tokens -= 1.0
            return
        metrics.QUOTA_REFUSED.labels("requests_per_second").inc()
        wait = (1.0 - bucket.tokens) / rate
        raise ResourceExhausted(
            f"tenant {tenant!r} is over its request rate ({rate:g}/s, burst {size:g}); "
            f"retry in {wait:.3f} s",
            reason="RATE_LIMITED",
            retry_after=wait,
            quota=(f"tenant:{tenant}", f"requests_per_second={rate:g} burst={size:g}"),
        )

    async def admit_turns(self, tenant: str, new_turns: int) -> None:
        """Refuse a write that would take the tenant over its stored turns."""
        limit = self.of(tenant).max_stored_turns
        if limit <= 0 or self._count is None:
            return
        stored = await self._stored(tenant)
        if stored + new_turns > limit:
            metrics.QUOTA_REFUSED.labels("max_stored_turns").inc()
            # No RetryInfo: waiting frees nothing; forgetting or a higher quota does.
            raise ResourceExhausted(
                f"tenant {tenant!r} is over its quota of stored turns: {stored} stored + "
                f"{new_turns} new exceeds max_stored_turns={limit}; Forget old memories "
                "or ask for a higher quota",
                reason="QUOTA_EXCEEDED",
                retry_after=None,
                quota=(f"tenant:{tenant}", f"max_stored_turns={limit}"),
            )

    def stored(self, tenant: str, added: int) -> None:
        """Turns just written (or, negative, erased) by this replica."""
        if tenant in self._turns:
            count, when = self._turns[tenant]
            self._turns[tenant] = (max(0, count + added), when)

    async def _stored(self, tenant: str) -> int:
        assert self._count is not None
        cached = self._turns.get(tenant)
        now = self._clock()
        if cached is not None and now - cached[1] < self._refresh:
            return cached[0]
        count = await self._count(tenant)
        self._turns[tenant] = (count, now)
        return count
