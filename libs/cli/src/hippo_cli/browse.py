"""`hippo list`, `hippo get`, `hippo sessions`, `hippo users`: read what is stored;
`hippo meta`: change a memory's metadata."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import click

from hippo.memory.v1 import memory_pb2
from hippo_cli import api
from hippo_cli.settings import CliSettings


def _short(text: str, width: int = 70) -> str:
    text = " ".join(text.split())
    return text if len(text) <= width else text[: width - 1] + "…"


async def _pages(
    settings: CliSettings, method: str, request: Any, field: str
) -> AsyncIterator[Any]:
    """Every item of a paged listing, page by page (each call with its own deadline)."""
    async with api.gateway(settings) as stub:
        call = getattr(stub, method)
        while True:
            reply = await call(
                request, metadata=api.metadata(settings), timeout=settings.timeout_seconds
            )
            for item in getattr(reply, field):
                yield item
            if not reply.next_page_token:
                return
            request.page_token = reply.next_page_token


async def _collect(items: AsyncIterator[Any], limit: int = 0) -> list[Any]:
    out = []
    async for item in items:
        out.append(item)
        if limit and len(out) >= limit:
            break
    return out


@click.command("list")
@click.option("--user", required=True, help="Whose memories.")
@click.option("--session", default="", help="Only this session.")
@click.option("--since", help="Only memories at or after this time (ISO 8601; naive = UTC).")
@click.option("--until", help="Only memories before this time (ISO 8601; naive = UTC).")
@click.option("--role", "roles", type=api.ROLE_CHOICE, multiple=True, help="Only these roles.")
@click.option(
    "--meta",
    "meta",
    multiple=True,
    metavar="KEY=VALUE",
    help="Only memories with this metadata (declared filter keys; repeatable: all).",
)
@click.option("--oldest-first", is_flag=True, help="Oldest first (default: newest first).")
@click.option("--limit", type=click.IntRange(min=0), default=0, help="At most this many (0: all).")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per memory.")
@click.pass_obj
def list_memories(
    settings: CliSettings,
    user: str,
    session: str,
    since: str | None,
    until: str | None,
    roles: tuple[str, ...],
    meta: tuple[str, ...],
    oldest_first: bool,
    limit: int,
    as_json: bool,
) -> None:
    """List a user's stored memories (Mem0's get_all), newest first."""
    request = memory_pb2.ListMemoriesRequest(
        scope=memory_pb2.Scope(user_id=user, session_id=session),
        time_range=api.time_range(since, until),
        roles=[api.ROLES[r] for r in roles],
        order=memory_pb2.LIST_ORDER_OLDEST_FIRST
        if oldest_first
        else memory_pb2.LIST_ORDER_NEWEST_FIRST,
        page_size=min(limit, 1000) if limit else 0,
        metadata=api.pairs(meta, "--meta"),
    )
    memories = api.run(_collect(_pages(settings, "ListMemories", request, "memories"), limit))
    if as_json:
        for m in memories:
            click.echo(json.dumps(api.memory_json(m), ensure_ascii=False))
        return
    if not memories:
        click.echo("no memories")
        return
    for m in memories:
        role = api.ROLE_NAMES.get(m.role, "?")
        click.echo(f"{api.iso(m.time)}  {m.scope.session_id:<12}  {role:<9}  {m.memory_id}  "
                   f"{_short(m.text, 60)}")  # fmt: skip
    click.echo(f"({len(memories)} memories)")


@click.command()
@click.argument("memory_id")
@click.option("--user", required=True, help="The memory's owner.")
@click.option("--json", "as_json", is_flag=True, help="Print the memory as JSON.")
@click.pass_obj
def get(settings: CliSettings, memory_id: str, user: str, as_json: bool) -> None:
    """Show one stored memory by id (Mem0's get)."""
    request = memory_pb2.GetMemoryRequest(user_id=user, memory_id=memory_id)

    async def call() -> memory_pb2.GetMemoryResponse:
        async with api.gateway(settings) as stub:
            reply: memory_pb2.GetMemoryResponse = await stub.GetMemory(
                request, metadata=api.metadata(settings), timeout=settings.timeout_seconds
            )
            return reply

    _show(api.run(call()).memory, as_json)


def _show(memory: memory_pb2.MemoryRecord, as_json: bool) -> None:
    out = api.memory_json(memory)
    if as_json:
        click.echo(json.dumps(out, ensure_ascii=False))
        return
    for key in ("memory_id", "user_id", "session_id", "role", "time", "client_id"):
        click.echo(f"{key + ':':<12} {out[key]}")
    for key, value in sorted(out["metadata"].items()):
        click.echo(f"{'meta:':<12} {key}={value}")
    click.echo(out["text"])


@click.command()
@click.argument("memory_id")
@click.option("--user", required=True, help="The memory's owner.")
@click.option(
    "--set", "set_", multiple=True, metavar="KEY=VALUE", help="Add or replace a key (repeatable)."
)
@click.option("--remove", multiple=True, metavar="KEY", help="Drop a key (repeatable).")
@click.option("--json", "as_json", is_flag=True, help="Print the memory as JSON.")
@click.pass_obj
def meta(
    settings: CliSettings,
    memory_id: str,
    user: str,
    set_: tuple[str, ...],
    remove: tuple[str, ...],
    as_json: bool,
) -> None:
    """Change a memory's metadata (Mem0's update; its text never changes) and show it."""
    if not set_ and not remove:
        raise click.UsageError("give --set KEY=VALUE or --remove KEY (or both)")
    request = memory_pb2.UpdateMemoryMetadataRequest(
        user_id=user, memory_id=memory_id, set=api.pairs(set_, "--set"), remove=list(remove)
    )

    async def call() -> memory_pb2.UpdateMemoryMetadataResponse:
        async with api.gateway(settings) as stub:
            reply: memory_pb2.UpdateMemoryMetadataResponse = await stub.UpdateMemoryMetadata(
                request, metadata=api.metadata(settings), timeout=settings.timeout_seconds
            )
            return reply

    _show(api.run(call()).memory, as_json)


@click.command()
@click.option("--user", required=True, help="Whose sessions.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per session.")
@click.pass_obj
def sessions(settings: CliSettings, user: str, as_json: bool) -> None:
    """List a user's sessions: turn counts, first and last activity, state version."""
    request = memory_pb2.ListSessionsRequest(user_id=user)
    found = api.run(_collect(_pages(settings, "ListSessions", request, "sessions")))
    if as_json:
        for s in found:
            click.echo(json.dumps({"session_id": s.session_id, "turn_count": s.turn_count,
                                   "first_time": api.iso(s.first_time),
                                   "last_time": api.iso(s.last_time),
                                   "summary_version": s.summary_version}))  # fmt: skip
        return
    if not found:
        click.echo("no sessions")
        return
    click.echo(f"{'session':<24}  {'turns':>6}  {'first':<16}  {'last':<16}  {'version':>7}")
    for s in found:
        click.echo(f"{s.session_id:<24}  {s.turn_count:>6}  {api.iso(s.first_time):<16}  "
                   f"{api.iso(s.last_time):<16}  {s.summary_version:>7}")  # fmt: skip


@click.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object per user.")
@click.pass_obj
def users(settings: CliSettings, as_json: bool) -> None:
    """List the users of your tenant that hold memories, with counts and activity."""
    found = api.run(_collect(_pages(settings, "ListUsers", memory_pb2.ListUsersRequest(), "users")))
    if as_json:
        for u in found:
            click.echo(json.dumps({"user_id": u.user_id, "turn_count": u.turn_count,
                                   "session_count": u.session_count,
                                   "first_time": api.iso(u.first_time),
                                   "last_time": api.iso(u.last_time)}))  # fmt: skip
        return
    if not found:
        click.echo("no users")
        return
    click.echo(f"{'user':<24}  {'turns':>6}  {'sessions':>8}  {'last':<16}")
    for u in found:
        click.echo(f"{u.user_id:<24}  {u.turn_count:>6}  {u.session_count:>8}  "
                   f"{api.iso(u.last_time):<16}")  # fmt: skip
