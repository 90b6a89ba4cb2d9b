"""`hippo remember`, `hippo recall`, `hippo forget`: the Memory API from the terminal."""

from __future__ import annotations

import asyncio
import json
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

import click

from hippo.memory.v1 import memory_pb2
from hippo_cli import api
from hippo_cli.settings import CliSettings


@click.command()
@click.argument("texts", nargs=-1)
@click.option("--user", required=True, help="The user the memories belong to.")
@click.option("--session", required=True, help="The session (conversation) to append to.")
@click.option("--role", type=click.Choice(sorted(api.ROLES)), default="user", show_default=True)
@click.option("--client-id", "client_ids", multiple=True, help="One per text, for idempotency.")
@click.option("--time", "when", help="When the turns happened (ISO 8601); default: now.")
@click.option("--idempotency-key", default="", help="Makes a retry of this call store nothing.")
@click.option("--json", "as_json", is_flag=True, help="Print the reply as JSON.")
@click.pass_obj
def remember(
    settings: CliSettings,
    texts: tuple[str, ...],
    user: str,
    session: str,
    role: str,
    client_ids: tuple[str, ...],
    when: str | None,
    idempotency_key: str,
    as_json: bool,
) -> None:
    """Store TEXTS as turns of one session, in order. `-` (or no TEXTS, with stdin not
    a terminal) reads one turn's text from stdin."""
    if texts == ("-",) or (not texts and not sys.stdin.isatty()):
        texts = (sys.stdin.read().rstrip("\n"),)
    if not texts:
        raise click.UsageError("give TEXTS, or `-` to read one text from stdin")
    if client_ids and len(client_ids) != len(texts):
        raise click.UsageError(f"give one --client-id per text ({len(texts)}), or none")
    turns = []
    for i, text in enumerate(texts):
        turn = memory_pb2.Turn(role=api.ROLES[role], text=text)
        if client_ids:
            turn.client_id = client_ids[i]
        if when:
            turn.time.FromDatetime(datetime.fromisoformat(when))
        turns.append(turn)
    request = memory_pb2.RememberRequest(
        scope=memory_pb2.Scope(user_id=user, session_id=session),
        turns=turns,
        idempotency_key=idempotency_key,
    )

    async def call() -> memory_pb2.RememberResponse:
        async with api.gateway(settings) as stub:
            reply: memory_pb2.RememberResponse = await stub.Remember(
                request, metadata=api.metadata(settings), timeout=settings.timeout_seconds
            )
            return reply

    reply = api.run(call())
    if as_json:
        out = {"memory_ids": list(reply.memory_ids), "created": reply.created}
        click.echo(json.dumps({**out, "deduplicated": reply.deduplicated}))
        return
    click.echo(f"stored {reply.created}, already stored {reply.deduplicated}")
    for memory_id in reply.memory_ids:
        click.echo(f"  {memory_id}")


def _request(query: dict[str, Any], line: int | None = None) -> memory_pb2.RecallRequest:
    where = f"line {line}: " if line is not None else ""
    mode = str(query.get("mode") or "hybrid").lower()
    if mode not in api.MODES:
        raise click.UsageError(f"{where}mode must be one of {sorted(api.MODES)}, got {mode!r}")
    if not query.get("user") or not query.get("query"):
        raise click.UsageError(f"{where}each query needs 'user' and 'query'")
    return memory_pb2.RecallRequest(
        scope=memory_pb2.Scope(
            user_id=str(query["user"]), session_id=str(query.get("session") or "")
        ),
        query=str(query["query"]),
        mode=api.MODES[mode],
        top_k=int(query.get("top_k") or 0),
    )


def _table(reply: memory_pb2.RecallResponse) -> None:
    if reply.query_repairs:
        repaired = ", ".join(f"{k} -> {v}" for k, v in sorted(reply.query_repairs.items()))
        click.echo(f"(typing slips repaired: {repaired})")
    if not reply.hits:
        click.echo("no memories found")
        return
    click.echo(f"{'#':>3}  {'fused':>7}  {'bm25':>4}  {'vec':>4}  {'date':<16}  text")
    for n, hit in enumerate(reply.hits, start=1):
        text = " ".join(hit.memory.text.split())
        text = text if len(text) <= 70 else text[:69] + "…"
        bm25 = str(hit.lexical_rank or "-")
        vec = str(hit.semantic_rank or "-")
        date = api.iso(hit.memory.time)
        click.echo(f"{n:>3}  {hit.fused_score:7.4f}  {bm25:>4}  {vec:>4}  {date:<16}  {text}")
    click.echo(
        f"({reply.lexical_candidates} BM25 and {reply.semantic_candidates} vector candidates)"
    )


@click.command()
@click.argument("query", required=False)
@click.option("--user", help="Whose memories to search (required without --batch).")
@click.option("--session", default="", help="Only this session.")
@click.option("--mode", type=click.Choice(sorted(api.MODES)), default="hybrid", show_default=True)
@click.option("--top-k", type=int, default=10, show_default=True)
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
@click.option("--json", "as_json", is_flag=True, help="One JSON object per hit.")
@click.option(
    "--batch",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    help="A file with one JSON query per line ({user, query, top_k, mode, session}); "
    "prints one JSON line per query ({query, hits}), in the same order.",
)
@click.option("--concurrency", type=click.IntRange(1, 64), default=8, show_default=True)
@click.pass_obj
def recall(
    settings: CliSettings,
    query: str | None,
    user: str | None,
    session: str,
    mode: str,
    top_k: int,
    since: str | None,
    until: str | None,
    roles: tuple[str, ...],
    meta: tuple[str, ...],
    as_json: bool,
    batch: Path | None,
    concurrency: int,
) -> None:
    """Search a user's memories (BM25 + vectors fused by RRF) and show the hits."""
    if batch is not None:
        lines = [ln for ln in batch.read_text(encoding="utf-8").splitlines() if ln.strip()]
        requests = [_request(json.loads(ln), n) for n, ln in enumerate(lines, start=1)]
        for line in api.run(_batch(settings, requests, concurrency)):
            click.echo(line)
        return
    if not query or not user:
        raise click.UsageError("QUERY and --user are required (or use --batch FILE)")
    request = _request(
        {"user": user, "query": query, "mode": mode, "top_k": top_k, "session": session}
    )
    window = api.time_range(since, until)
    if window is not None:
        request.time_range.CopyFrom(window)
    request.roles.extend(api.ROLES[r] for r in roles)
    request.metadata.update(api.pairs(meta, "--meta"))

    async def call() -> memory_pb2.RecallResponse:
        async with api.gateway(settings) as stub:
            reply: memory_pb2.RecallResponse = await stub.Recall(
                request, metadata=api.metadata(settings), timeout=settings.timeout_seconds
            )
            return reply

    reply = api.run(call())
    if as_json:
        for hit in reply.hits:
            click.echo(json.dumps(api.hit_json(hit), ensure_ascii=False))
    else:
        _table(reply)


async def _batch(
    settings: CliSettings, requests: list[memory_pb2.RecallRequest], concurrency: int
) -> list[str]:
    gate = asyncio.Semaphore(concurrency)
    async with api.gateway(settings) as stub:

        async def one(request: memory_pb2.RecallRequest) -> str:
            async with gate:
                reply = await stub.Recall(
                    request, metadata=api.metadata(settings), timeout=settings.timeout_seconds
                )
            hits = [api.hit_json(h) for h in reply.hits]
            return json.dumps({"query": request.query, "hits": hits}, ensure_ascii=False)

        return list(await asyncio.gather(*(one(r) for r in requests)))


@click.command()
@click.option("--user", required=True, help="Whose memories to erase.")
@click.option("--session", default="", help="Erase this session (or only ids within it).")
@click.option("--memory-id", "memory_ids", multiple=True, help="Erase only these memories.")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation.")
@click.pass_obj
def forget(
    settings: CliSettings, user: str, session: str, memory_ids: tuple[str, ...], yes: bool
) -> None:
    """Erase memories, a session, or everything of a user, everywhere."""
    if memory_ids:
        what = f"{len(memory_ids)} memories of user {user!r}"
        request = memory_pb2.ForgetRequest(
            memory_ids=memory_pb2.MemoryIds(
                scope=memory_pb2.Scope(user_id=user, session_id=session),
                memory_ids=list(memory_ids),
            )
        )
    elif session:
        what = f"session {session!r} of user {user!r}"
        request = memory_pb2.ForgetRequest(
            session=memory_pb2.Scope(user_id=user, session_id=session)
        )
    else:
        what = f"everything of user {user!r}"
        request = memory_pb2.ForgetRequest(user_id=user)
    if not yes:
        click.confirm(f"Erase {what}? This cannot be undone", abort=True)

    async def call() -> memory_pb2.ForgetResponse:
        async with api.gateway(settings) as stub:
            reply: memory_pb2.ForgetResponse = await stub.Forget(
                request, metadata=api.metadata(settings), timeout=settings.timeout_seconds
            )
            return reply

    reply = api.run(call())
    click.echo(
        f"erased {reply.memories_deleted} memories, {reply.sessions_deleted} sessions, "
        f"{reply.memtoks_deleted} memtoks"
    )
    key = ""
    if not session and not memory_ids:
        key = (
            "; audit key destroyed" if reply.audit_key_destroyed else "; audit key erasure spooled"
        )
    click.echo(f"dropped {reply.cache_entries_dropped} cached vectors{key}")
