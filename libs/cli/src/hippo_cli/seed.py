"""`hippo seed FILE`: replay a LoCoMo-format archive through the memtok store.

Chronological within each conversation, with the archive's own session dates as the
clock (so influence decay means something). speaker_a is the operator: each of their
turns is written (WriteMemtoks) with the speaker_b turns that answer it as the reply,
whose words enter only if the operator's next turn echoes them. Each conversation's
sample_id is the user. `--holdout N` keeps the N most recent conversations out (a test
set) and names them.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import click

from hippo.injection.v1 import injection_pb2, injection_pb2_grpc
from hippo_cli import api, locomo
from hippo_cli.settings import CliSettings
from hippo_core import client


def exchanges(conversation: locomo.Conversation) -> list[tuple[str, str, int]]:
    """(operator text, reply text, time_us) per speaker_a turn, in order; the reply is
    the speaker_b turns up to the operator's next turn."""
    out: list[tuple[str, str, int]] = []
    for turn in conversation.turns:
        if turn.speaker == conversation.speaker_a:
            out.append((turn.text, "", turn.time_us))
        elif out:
            text, reply, when = out[-1]
            out[-1] = (text, f"{reply} {turn.text}".strip(), when)
    return [e for e in out if e[0].strip()]


def split(
    conversations: list[locomo.Conversation], holdout: int
) -> tuple[list[locomo.Conversation], list[locomo.Conversation]]:
    """(seeded, held back): the `holdout` conversations that end last are held back."""
    ordered = sorted(conversations, key=lambda c: max((t.time_us for t in c.turns), default=0))
    cut = len(ordered) - holdout if holdout > 0 else len(ordered)
    held = {c.sample_id for c in ordered[cut:]}
    return [c for c in conversations if c.sample_id not in held], ordered[cut:]


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--tenant", default="local", show_default=True, help="Tenant of the users.")
@click.option("--holdout", type=click.IntRange(0), default=0, help="Most recent to keep out.")
@click.option(
    "--limit", type=click.IntRange(0), default=0, help="Operator turns per user (0: all)."
)
@click.pass_obj
def seed(settings: CliSettings, file: Path, tenant: str, holdout: int, limit: int) -> None:
    """Replay a LoCoMo-format FILE through the memtok store (the injection service)."""
    try:
        conversations = locomo.load(file)
    except locomo.FileError as exc:  # names the file, conversation, field and value
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    seeded, held = split(conversations, holdout)
    work = [(c.sample_id, e) for c in seeded for e in exchanges(c)[: limit or None]]
    totals = {"created": 0, "merged": 0, "evicted": 0}
    started = time.monotonic()

    async def run() -> None:
        async with client.channel(settings.injection_addr, tls_settings=settings.tls) as channel:
            stub = injection_pb2_grpc.InjectionServiceStub(channel)
            with click.progressbar(length=len(work), label="seeding", file=sys.stderr) as bar:
                for user, (text, reply, when) in work:
                    request = injection_pb2.WriteMemtoksRequest(
                        tenant=tenant, user_id=user, query=text, reply=reply, time_us=when
                    )
                    result = await stub.WriteMemtoks(
                        request, timeout=max(60.0, settings.timeout_seconds)
                    )
                    totals["created"] += result.created
                    totals["merged"] += result.merged
                    totals["evicted"] += result.evicted
                    bar.update(1)

    api.run(run())  # a failed call prints the error and exits 2
    took = time.monotonic() - started
    click.echo(
        f"{len(work)} operator turns of {len(seeded)} conversations in {took:.1f} s: "
        f"{totals['created']} memtoks created, {totals['merged']} merged, "
        f"{totals['evicted']} evicted"
    )
    if held:
        click.echo("held back: " + ", ".join(c.sample_id for c in held))
