"""Per-request context shared by the server and client interceptors.

The server interceptor sets these at the start of every call; the client channel reads
them, so outbound calls carry the caller's request id and never outlive its deadline.
Plain contextvars: asyncio copies them into every task the handler spawns.
"""

from __future__ import annotations

import contextvars
import time

request_id: contextvars.ContextVar[str] = contextvars.ContextVar("request_id", default="")
# Absolute time.monotonic() by which the current inbound call must finish; None = no deadline.
deadline: contextvars.ContextVar[float | None] = contextvars.ContextVar("deadline", default=None)


def time_remaining() -> float | None:
    """Seconds left before the inbound call's deadline, or None when it has none."""
    due = deadline.get()
    return None if due is None else due - time.monotonic()
