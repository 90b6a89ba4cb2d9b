"""`hippo context` and `hippo chat`: the boundary-weighted prompt and a chat with memory."""

from __future__ import annotations

import asyncio
import json
import sys

import click

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_cli import api
from hippo_cli.settings import CliSettings

LAYOUTS = {
    "boundary": memory_pb2.CONTEXT_LAYOUT_BOUNDARY_WEIGHTED,
    "summary-in-system": memory_pb2.CONTEXT_LAYOUT_SUMMARY_IN_SYSTEM,
    "chronological": memory_pb2.CONTEXT_LAYOUT_CHRONOLOGICAL,
}
ZONES = {
    memory_pb2.ZONE_KIND_SYSTEM: "system",
    memory_pb2.ZONE_KIND_MEMORIES: "memories",
    memory_pb2.ZONE_KIND_SUMMARY: "summary",
    memory_pb2.ZONE_KIND_WINDOW: "window",
    memory_pb2.ZONE_KIND_QUERY: "query",
}


async def _build(
    settings: CliSettings, request: memory_pb2.BuildContextRequest
) -> memory_pb2.BuildContextResponse:
    async with api.gateway(settings) as stub:
        reply: memory_pb2.BuildContextResponse = await stub.BuildContext(
            request, metadata=api.metadata(settings), timeout=settings.timeout_seconds
        )
        return reply


def _print_context(reply: memory_pb2.BuildContextResponse, *, prompt: bool) -> None:
    t = reply.tokens
    click.echo(f"{t.total} of {t.budget} tokens (with the chat format)")
    for zone in reply.zones:
        name = ZONES.get(zone.kind, "?")
        click.echo(click.style(f"\n── {name} ({zone.tokens} tokens) ──", bold=True))
        click.echo(zone.text)
    if reply.disclosure_note:
        click.echo(click.style("\n── note ──", bold=True))
        click.echo(reply.disclosure_note)
    if prompt:
        click.echo(click.style("\n── the prompt as the model reads it ──", bold=True))
        click.echo(reply.prompt)


@click.command()
@click.argument("query")
@click.option("--user", required=True)
@click.option("--session", required=True, help="The session whose window and summary are used.")
@click.option("--budget", type=int, default=0, help="Token budget (0: the gateway's default).")
@click.option("--layout", type=click.Choice(sorted(LAYOUTS)), default="boundary", show_default=True)
@click.option("--prompt", "show_prompt", is_flag=True, help="Also print the rendered prompt.")
@click.option("--json", "as_json", is_flag=True, help="The whole reply as JSON.")
@click.pass_obj
def context(
    settings: CliSettings,
    query: str,
    user: str,
    session: str,
    budget: int,
    layout: str,
    show_prompt: bool,
    as_json: bool,
) -> None:
    """Print the prompt BuildContext assembles for QUERY, zone by zone."""
    request = memory_pb2.BuildContextRequest(
        scope=memory_pb2.Scope(user_id=user, session_id=session),
        query=query,
        token_budget=budget,
        layout=LAYOUTS[layout],
    )
    reply = api.run(_build(settings, request))
    if as_json:
        from google.protobuf.json_format import MessageToDict

        click.echo(json.dumps(MessageToDict(reply), ensure_ascii=False))
        return
    _print_context(reply, prompt=show_prompt)


async def _chat_loop(
    settings: CliSettings, user: str, session: str, budget: int, max_new_tokens: int
) -> None:
    scope = memory_pb2.Scope(user_id=user, session_id=session)
    last = ""
    async with api.gateway(settings) as stub:
        while True:
            try:
                line = await asyncio.to_thread(input, "you> ")
            except EOFError:
                return
            line = line.strip()
            if not line:
                continue
            if line in ("/quit", "/exit"):
                return
            if line == "/summary":
                await _show_session(stub, settings, scope)
                continue
            if line == "/memories":
                if not last:
                    click.echo("(nothing asked yet)")
                    continue
                request = memory_pb2.BuildContextRequest(
                    scope=scope, query=last, token_budget=budget
                )
                reply = await stub.BuildContext(
                    request, metadata=api.metadata(settings), timeout=settings.timeout_seconds
                )
                memories = [z.text for z in reply.zones if z.kind == memory_pb2.ZONE_KIND_MEMORIES]
                click.echo(memories[0] if memories else "(no memories were used)")
                continue
            last = line
            await _one_turn(stub, settings, scope, line, budget, max_new_tokens)


async def _show_session(
    stub: memory_pb2_grpc.MemoryServiceStub, settings: CliSettings, scope: memory_pb2.Scope
) -> None:
    state = await stub.GetSession(
        memory_pb2.GetSessionRequest(scope=scope),
        metadata=api.metadata(settings),
        timeout=settings.timeout_seconds,
    )
    click.echo(f"summary ({state.summary_tokens} tokens): {state.summary or '(none yet)'}")
    click.echo(
        f"window: {len(state.window)} turns, {state.window_tokens} tokens; "
        f"{state.turns_total} turns in the session; version {state.version}"
    )


async def _one_turn(
    stub: memory_pb2_grpc.MemoryServiceStub,
    settings: CliSettings,
    scope: memory_pb2.Scope,
    message: str,
    budget: int,
    max_new_tokens: int,
) -> None:
    request = memory_pb2.ChatRequest(
        scope=scope,
        message=message,
        token_budget=budget,
        params=memory_pb2.GenerationParameters(max_new_tokens=max_new_tokens),
    )
    # A reply on a CPU takes a while: the deadline covers the whole stream.
    call = stub.Chat(
        request, metadata=api.metadata(settings), timeout=max(120, settings.timeout_seconds)
    )
    async for event in call:
        kind = event.WhichOneof("event")
        if kind == "start":
            used = len(event.start.memory_ids_used)
            click.echo(
                click.style(f"[{used} memories, {event.start.tokens.total} tokens]", dim=True)
            )
            click.echo("hippo> ", nl=False)
        elif kind == "token":
            click.echo(event.token.text, nl=False)
            sys.stdout.flush()
        else:
            click.echo(
                click.style(
                    f"\n[{event.end.finish_reason}, {event.end.generated_tokens} tokens]", dim=True
                )
            )


@click.command()
@click.option("--user", required=True)
@click.option("--session", required=True)
@click.option("--budget", type=int, default=0, help="Prompt token budget (0: the default).")
@click.option("--max-new-tokens", type=int, default=128, show_default=True)
@click.pass_obj
def chat(settings: CliSettings, user: str, session: str, budget: int, max_new_tokens: int) -> None:
    """Chat with memory over the local model. /memories shows what the last reply used,
    /summary the session's summary and window, /quit ends."""
    click.echo("Chat with memory. /memories, /summary, /quit.")
    api.run(_chat_loop(settings, user, session, budget, max_new_tokens))
