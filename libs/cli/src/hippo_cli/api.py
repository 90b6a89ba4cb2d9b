"""Calling the gateway from the CLI: the key in metadata, a deadline, readable errors."""

from __future__ import annotations

import asyncio
import sys
from collections.abc import AsyncIterator, Coroutine
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from typing import Any, NoReturn, TypeVar

import click
import grpc
from google.protobuf import timestamp_pb2
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


# Exit codes (`hippo --help` lists them): 1 a check failed (health, audit verify), 2 the
# command line or an input file is wrong (click's own code for usage errors), 3 a service
# refused or failed the call.
SERVER_ERROR = 3
UNAVAILABLE_HINT = (
    "hint: no service answered at that address; start the cluster with `make run` (or "
    "`hippo up`), or point --gateway (HIPPO_CLI_GATEWAY_ADDR) at a running gateway"
)


def fail(exc: grpc.aio.AioRpcError) -> NoReturn:
    """Print `error: CODE: message` (and a hint when nothing answered); exit 3."""
    click.echo(f"error: {exc.code().name}: {exc.details()}", err=True)
    if exc.code() == grpc.StatusCode.UNAVAILABLE:
        click.echo(UNAVAILABLE_HINT, err=True)
    sys.exit(SERVER_ERROR)


def run(coro: Coroutine[Any, Any, T]) -> T:
    """Run `coro`; a failed call prints `error: CODE: message` and exits with status 3."""
    try:
        return asyncio.run(coro)
    except grpc.aio.AioRpcError as exc:
        fail(exc)


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


def memory_json(m: memory_pb2.MemoryRecord) -> dict[str, Any]:
    return {
        "memory_id": m.memory_id,
        "user_id": m.scope.user_id,
        "session_id": m.scope.session_id,
        "role": ROLE_NAMES.get(m.role, "unspecified"),
        "text": m.text,
        "time": datetime.fromtimestamp(m.time.ToMicroseconds() / 1e6, UTC).isoformat(),
        "client_id": m.client_id,
        "metadata": dict(m.metadata),
    }


def when(value: str | None, option: str) -> timestamp_pb2.Timestamp | None:
    """An ISO 8601 date or time option (a naive one is UTC) as a Timestamp."""
    if value is None:
        return None
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise click.BadParameter(
            f"{value!r} is not an ISO 8601 date or time (e.g. 2024-06-01 or "
            "2024-06-01T12:00:00+02:00)",
            param_hint=option,
        ) from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    out = timestamp_pb2.Timestamp()
    out.FromDatetime(moment.astimezone(UTC))
    return out


def time_range(since: str | None, until: str | None) -> memory_pb2.TimeRange | None:
    start, end = when(since, "--since"), when(until, "--until")
    if start is None and end is None:
        return None
    out = memory_pb2.TimeRange()
    if start is not None:
        out.start.CopyFrom(start)
    if end is not None:
        out.end.CopyFrom(end)
    return out


def pairs(values: tuple[str, ...], option: str) -> dict[str, str]:
    """`key=value` options as a dict (a value may hold '=')."""
    out: dict[str, str] = {}
    for value in values:
        key, sep, rest = value.partition("=")
        if not sep or not key:
            raise click.BadParameter(f"{value!r} is not key=value", param_hint=option)
        out[key] = rest
    return out


ROLE_CHOICE = click.Choice(sorted(ROLES))
