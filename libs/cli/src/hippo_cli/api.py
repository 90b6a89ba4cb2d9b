"""Calling the gateway from the CLI: the key in metadata, a deadline, readable errors."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, TypeVar

import click
import grpc
from google.rpc import error_details_pb2, status_pb2

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_cli.settings import CliSettings
from hippo_core import client

T = TypeVar("T")

MODES = {
    "hybrid": memory_pb2.RECALL_MODE_HYBRID,
    "lexical": memory_pb2.RECALL_MODE_LEXICAL,
    "semantic": memory_pb2.RECALL_MODE_SEMANTIC,
}
ROLES = {
    "user": memory_pb2.ROLE_USER,
    "assistant": memory_pb2.ROLE_ASSISTANT,
    "system": memory_pb2.ROLE_SYSTEM,
    "tool": memory_pb2.ROLE_TOOL,
}
ROLE_NAMES = {v: k for k, v in ROLES.items()}


def metadata(settings: CliSettings) -> tuple[tuple[str, str], ...]:
    return (("x-api-key", settings.api_key),)


@asynccontextmanager
async def gateway(settings: CliSettings) -> AsyncIterator[memory_pb2_grpc.MemoryServiceStub]:
    async with client.channel(settings.gateway_addr, tls_settings=settings.tls) as channel:
        yield memory_pb2_grpc.MemoryServiceStub(channel)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro`; a failed call prints `error: CODE: message` and exits with status 2."""
    try:
        return asyncio.run(coro)
    except grpc.aio.AioRpcError as exc:
        click.echo(f"error: {exc.code().name}: {exc.details()}", err=True)
        sys.exit(2)


def status_details(exc: grpc.aio.AioRpcError) -> list[Any]:
    """The google.rpc error details (RetryInfo, QuotaFailure, ErrorInfo...) a failed call
    carried in its `grpc-status-details-bin` trailer, unpacked; [] when it carried none."""
    raw = next(
        (v for k, v in (exc.trailing_metadata() or ()) if k == "grpc-status-details-bin"), None
    )
    if not isinstance(raw, bytes):
        return []
    status = status_pb2.Status()
    try:
        status.ParseFromString(raw)
    except Exception:  # a peer that is not Hippo may put anything there; it is only advice
        return []
    out: list[Any] = []
    for detail in status.details:
        for kind in (error_details_pb2.RetryInfo, error_details_pb2.QuotaFailure):
            if detail.Is(kind.DESCRIPTOR):
                message = kind()
                detail.Unpack(message)
                out.append(message)
    return out


def retry_after(exc: grpc.aio.AioRpcError) -> float | None:
    """Seconds the server asked the caller to wait (google.rpc.RetryInfo), or None."""
    for detail in status_details(exc):
        if isinstance(detail, error_details_pb2.RetryInfo):
            return float(detail.retry_delay.ToNanoseconds()) / 1e9
    return None


def iso(ts: Any) -> str:
    """A protobuf Timestamp as 'YYYY-MM-DD HH:MM' (UTC)."""
    return datetime.fromtimestamp(ts.ToMicroseconds() / 1e6, UTC).strftime("%Y-%m-%d %H:%M")


def hit_json(hit: memory_pb2.Hit) -> dict[str, Any]:
    m = hit.memory
    return {
        "memory_id": m.memory_id,
        "client_id": m.client_id,
        "session_id": m.scope.session_id,
        "role": ROLE_NAMES.get(m.role, "unspecified"),
        "text": m.text,
        "time": datetime.fromtimestamp(m.time.ToMicroseconds() / 1e6, UTC).isoformat(),
        "fused_score": hit.fused_score,
        "lexical_rank": hit.lexical_rank,
        "semantic_rank": hit.semantic_rank,
        "lexical_score": hit.lexical_score,
        "semantic_score": hit.semantic_score,
    }
