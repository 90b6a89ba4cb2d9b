"""`hippo replay FILE`: load a LoCoMo-format file through the Memory API.

Chronological within each conversation (session by session, turn by turn); each
conversation's `sample_id` becomes its user, `session_<n>` its session, each turn's
`dia_id` its client id (so a replay can be repeated or resumed: what is stored already is
not stored twice), the session's date the turns' time, speaker_a the user role and
speaker_b the assistant role. The speaker's name goes in metadata `speaker` and a shared
image's caption in `attachment`: both are indexed with the turn (docs/recall.md).
"""

from __future__ import annotations

import asyncio
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_cli import api, locomo
from hippo_cli.settings import CliSettings

BATCH = 64  # the API's limit of turns per Remember


def memory_turn(turn: locomo.Turn, conversation: locomo.Conversation) -> memory_pb2.Turn:
    role = (
        memory_pb2.ROLE_USER
        if turn.speaker == conversation.speaker_a
        else memory_pb2.ROLE_ASSISTANT
    )
    metadata = {"speaker": turn.speaker}
    if turn.caption:  # what the shared picture showed: indexed with the turn
        metadata["attachment"] = turn.caption[:1024]
    out = memory_pb2.Turn(role=role, text=turn.text, client_id=turn.dia_id, metadata=metadata)
    out.time.FromMicroseconds(turn.time_us)
    return out


def requests(
    conversation: locomo.Conversation, user_prefix: str = ""
) -> list[memory_pb2.RememberRequest]:
    """One Remember per session (split at the API's limit), in chronological order."""
    out: list[memory_pb2.RememberRequest] = []
    sessions: dict[int, list[locomo.Turn]] = {}
    for turn in conversation.turns:
        sessions.setdefault(turn.session, []).append(turn)
    for n, turns in sessions.items():
        scope = memory_pb2.Scope(
            user_id=f"{user_prefix}{conversation.sample_id}", session_id=f"session_{n}"
        )
        for start in range(0, len(turns), BATCH):
            chunk = [memory_turn(t, conversation) for t in turns[start : start + BATCH]]
            out.append(memory_pb2.RememberRequest(scope=scope, turns=chunk))
    return out


async def replay_all(
    settings: CliSettings,
    conversations: list[locomo.Conversation],
    *,
    user_prefix: str = "",
    concurrency: int = 4,
    advance: Callable[[int], None] = lambda n: None,
) -> tuple[int, int]:
    """Replay every conversation (up to `concurrency` at once, each in order); returns
    (created, deduplicated)."""
    counts = [0, 0]
    gate = asyncio.Semaphore(concurrency)

    async def one(stub: memory_pb2_grpc.MemoryServiceStub, conv: locomo.Conversation) -> None:
        async with gate:
            for request in requests(conv, user_prefix):
                reply = await stub.Remember(
                    request, metadata=api.metadata(settings), timeout=settings.timeout_seconds
                )
                counts[0] += reply.created
                counts[1] += reply.deduplicated
                advance(len(request.turns))

    async with api.gateway(settings) as stub:
        await asyncio.gather(*(one(stub, c) for c in conversations))
    return counts[0], counts[1]


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--user-prefix", default="", help="Put before each sample_id to make the user id.")
@click.option("--concurrency", type=click.IntRange(1, 32), default=4, show_default=True)
@click.pass_obj
def replay(settings: CliSettings, file: Path, user_prefix: str, concurrency: int) -> None:
    """Load a LoCoMo-format FILE through the API, in chronological order."""
    conversations = locomo.load(file)
    total = sum(len(c.turns) for c in conversations)
    started = time.monotonic()
    with click.progressbar(length=total, label="replaying", file=sys.stderr) as bar:
        created, existing = api.run(
            replay_all(
                settings,
                conversations,
                user_prefix=user_prefix,
                concurrency=concurrency,
                advance=bar.update,
            )
        )
    took = time.monotonic() - started
    click.echo(
        f"{total} turns of {len(conversations)} conversations: {created} stored, "
        f"{existing} already stored, in {took:.1f} s ({total / took:.0f} turns/s)"
    )
