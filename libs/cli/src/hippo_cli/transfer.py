"""`hippo export` and `hippo import`: a user's memory to a JSONL file and back.

The file format (docs/export.md) is the ExportUser stream itself, one message per line
as proto JSON: a header, the memories oldest first, the sessions, a footer. `hippo
import` reads that format, or a chat archive in LoCoMo's format (as `hippo replay`
does), and sends ImportTurns in batches. Memory ids are kept (for a LoCoMo archive they
are derived from the user, session and dia_id), so importing a file again stores
nothing twice, and a failed import is resumed by running it again.
"""

from __future__ import annotations

import json
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import click
from google.protobuf import json_format

from hippo.memory.v1 import memory_pb2
from hippo_cli import api, locomo, replay
from hippo_cli.settings import CliSettings

BATCH = 256  # records per ImportTurns message: the API's limit
PROGRESS_EVERY = 1000
# Ids of LoCoMo turns: uuid5 of (user, session, dia_id) under this namespace.
LOCOMO_IDS = uuid.UUID("6f0b8d2e-3c1a-5e7f-9a4b-2d6c8e0f1a3b")


def line(message: memory_pb2.ExportUserResponse) -> str:
    return json_format.MessageToJson(message, indent=None, preserving_proto_field_name=True)


@click.command()
@click.option("--user", required=True, help="Whose memory to export.")
@click.option(
    "--output",
    "-o",
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the JSONL here (default: stdout). Written to FILE.partial, renamed when done.",
)
@click.pass_obj
def export(settings: CliSettings, user: str, output: Path | None) -> None:
    """Export everything stored for a user as JSONL (docs/export.md)."""
    partial = output.with_name(output.name + ".partial") if output else None
    sink: IO[str] = partial.open("w", encoding="utf-8") if partial else sys.stdout

    async def run() -> memory_pb2.ExportFooter | None:
        footer = None
        memories = 0
        async with api.gateway(settings) as stub:
            # One deadline for the whole stream: generous, as an export can be large.
            stream = stub.ExportUser(
                memory_pb2.ExportUserRequest(user_id=user),
                metadata=api.metadata(settings),
                timeout=max(settings.timeout_seconds, 3600.0),
            )
            async for message in stream:
                sink.write(line(message) + "\n")
                if message.HasField("memory"):
                    memories += 1
                    if memories % PROGRESS_EVERY == 0:
                        click.echo(f"exported {memories} memories", err=True)
                if message.HasField("footer"):
                    footer = message.footer
        return footer

    try:
        footer = api.run(run())
    finally:
        if partial:
            sink.close()
    if footer is None:
        click.echo("error: the export ended without its footer: it is incomplete", err=True)
        sys.exit(api.SERVER_ERROR)
    if partial and output:
        partial.replace(output)
    click.echo(f"exported {footer.memories} memories and {footer.sessions} sessions", err=True)


def _read_export(path: Path) -> int:
    """Check an export file whole before anything is sent; the number of memories."""
    memories = 0
    footer: memory_pb2.ExportFooter | None = None
    with path.open(encoding="utf-8") as lines:
        for n, text in enumerate(lines, start=1):
            if not text.strip():
                continue
            try:
                message = json_format.Parse(text, memory_pb2.ExportUserResponse())
            except json_format.ParseError as exc:
                raise click.UsageError(f"{path}: line {n}: not an export line: {exc}") from None
            kind = message.WhichOneof("item")
            if n == 1 and kind != "header":
                raise click.UsageError(f"{path}: line 1: an export starts with its header")
            if kind == "header" and message.header.format_version != 1:
                raise click.UsageError(
                    f"{path}: format_version {message.header.format_version} (this hippo reads 1)"
                )
            if footer is not None:
                raise click.UsageError(f"{path}: line {n}: after the footer")
            if kind == "memory":
                memories += 1
            elif kind == "footer":
                footer = message.footer
    if footer is None:
        raise click.UsageError(f"{path}: no footer: the export is incomplete")
    if footer.memories != memories:
        raise click.UsageError(
            f"{path}: holds {memories} memories, its footer says {footer.memories}"
        )
    return memories


def _export_records(path: Path) -> Iterator[memory_pb2.MemoryRecord]:
    with path.open(encoding="utf-8") as lines:
        for text in lines:
            if text.strip():
                message = json_format.Parse(text, memory_pb2.ExportUserResponse())
                if message.HasField("memory"):
                    yield message.memory


def locomo_records(
    conversations: list[locomo.Conversation], user_prefix: str
) -> Iterator[memory_pb2.MemoryRecord]:
    """A LoCoMo archive's turns as records: `hippo replay`'s users, sessions, roles and
    metadata, with ids derived from (user, session, dia_id)."""
    for conv in conversations:
        user = f"{user_prefix}{conv.sample_id}"
        for turn in conv.turns:
            session = f"session_{turn.session}"
            t = replay.memory_turn(turn, conv)
            key = "\x1f".join((user, session, turn.dia_id))
            yield memory_pb2.MemoryRecord(
                memory_id=str(uuid.uuid5(LOCOMO_IDS, key)),
                scope=memory_pb2.Scope(user_id=user, session_id=session),
                role=t.role,
                text=t.text,
                time=t.time,
                client_id=t.client_id,
                metadata=dict(t.metadata),
            )


def _is_export(path: Path) -> bool:
    with path.open(encoding="utf-8") as f:
        first = f.readline()
    try:
        return isinstance(json.loads(first), dict) and "header" in json.loads(first)
    except ValueError:
        return False


@click.command("import")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--user-prefix", default="", help="LoCoMo archives: prepended to each sample_id.")
@click.pass_obj
def import_(settings: CliSettings, file: Path, user_prefix: str) -> None:
    """Import FILE: an export (JSONL) or a LoCoMo-format chat archive. The file is checked
    whole first; running the same import again stores nothing twice."""
    if _is_export(file):
        total = _read_export(file)
        records: Iterator[memory_pb2.MemoryRecord] = _export_records(file)
    else:
        try:
            conversations = locomo.load(file)
        except locomo.FileError as exc:
            raise click.UsageError(f"{exc} (neither an export nor a LoCoMo archive)") from None
        total = sum(len(c.turns) for c in conversations)
        records = locomo_records(conversations, user_prefix)

    def batches() -> Iterator[memory_pb2.ImportTurnsRequest]:
        batch: list[memory_pb2.MemoryRecord] = []
        sent = 0
        for record in records:
            batch.append(record)
            if len(batch) == BATCH:
                yield memory_pb2.ImportTurnsRequest(records=batch)
                sent += len(batch)
                batch = []
                if sent % (BATCH * 4) == 0:
                    click.echo(f"sent {sent}/{total} records", err=True)
        if batch:
            yield memory_pb2.ImportTurnsRequest(records=batch)

    async def run() -> memory_pb2.ImportTurnsResponse:
        async with api.gateway(settings) as stub:
            reply: memory_pb2.ImportTurnsResponse = await stub.ImportTurns(
                batches(),
                metadata=api.metadata(settings),
                timeout=max(settings.timeout_seconds, 3600.0),
            )
            return reply

    reply = api.run(run())
    click.echo(f"imported {reply.created} records, {reply.deduplicated} already stored")
