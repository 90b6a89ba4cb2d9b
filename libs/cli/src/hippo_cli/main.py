"""`hippo`: run the cluster locally and talk to it from the terminal."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path

import click
import grpc
import numpy as np

from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc
from hippo_cli import audit, chat, endpoints, launcher, memory, memtok, ops, replay, seed
from hippo_cli.health import check
from hippo_cli.registry import SERVICES, settings_classes
from hippo_cli.settings import CliSettings
from hippo_core import client, envfile


def _fail(exc: grpc.aio.AioRpcError) -> None:
    click.echo(f"error: {exc.code().name}: {exc.details()}", err=True)
    sys.exit(2)


def _addresses(settings: CliSettings) -> dict[str, list[str]]:
    """Every replica of every service: those a running `hippo up` recorded (see
    endpoints.py), except where an address was configured explicitly."""
    running = endpoints.read(Path(settings.data_dir))
    out = {}
    for spec in SERVICES:
        field = f"{spec.name}_addr"
        if field not in settings.model_fields_set and running.get(spec.name):
            out[spec.name] = [e.addr for e in running[spec.name]]
        else:
            out[spec.name] = endpoints.addresses(str(getattr(settings, field)))
    return out


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Hippo: long-term, private, verifiable memory for LLM applications."""
    settings = CliSettings()
    # Commands reach every replica of a local cluster unless told otherwise.
    addrs = _addresses(settings)
    ctx.obj = settings.model_copy(
        update={f"{name}_addr": endpoints.target(a) for name, a in addrs.items()}
    )


@cli.command()
@click.option(
    "--cluster",
    is_flag=True,
    help="Cluster mode: PostgreSQL as the state of record and --replicas processes per service.",
)
@click.option("--replicas", type=click.IntRange(1, 8), help="Processes per service (--cluster).")
@click.pass_obj
def up(settings: CliSettings, cluster: bool, replicas: int | None) -> None:
    """Start every service locally on loopback and wait until Ctrl-C."""
    sys.exit(launcher.up(settings, cluster=cluster, replicas=replicas or settings.replicas))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of a table.")
def health(as_json: bool) -> None:
    """Readiness of every replica of every service (exit code 1 if any is not SERVING)."""
    addrs = _addresses(CliSettings())  # replica by replica, not the balanced targets

    async def run() -> dict[str, list[dict[str, str]]]:
        out: dict[str, list[dict[str, str]]] = {}
        for spec in SERVICES:
            out[spec.name] = [
                {"addr": addr, "status": await check(addr, spec.full_name)}
                for addr in addrs[spec.name]
            ]
        return out

    report = asyncio.run(run())
    if as_json:
        click.echo(json.dumps(report))
    else:
        for name, rows in report.items():
            for index, row in enumerate(rows):
                label = f"{name}-{index}" if len(rows) > 1 else name
                click.echo(f"{label:<13} {row['addr']:<21} {row['status']}")
    serving = all(r["status"] == "SERVING" for rows in report.values() for r in rows)
    sys.exit(0 if serving else 1)


@cli.command()
@click.argument("texts", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the full vectors as JSON.")
@click.pass_obj
def embed(settings: CliSettings, texts: tuple[str, ...], as_json: bool) -> None:
    """Embed TEXTS with the embedding service and show the vectors."""

    async def run() -> embedding_pb2.EmbedResponse:
        async with client.channel(settings.embedding_addr) as channel:
            stub = embedding_pb2_grpc.EmbeddingServiceStub(channel)
            reply: embedding_pb2.EmbedResponse = await stub.Embed(
                embedding_pb2.EmbedRequest(texts=list(texts)), timeout=settings.timeout_seconds
            )
            return reply

    try:
        reply = asyncio.run(run())
    except grpc.aio.AioRpcError as exc:
        _fail(exc)
    vectors = np.frombuffer(reply.vectors, dtype="<f4").reshape(reply.count, reply.dimension)
    if as_json:
        click.echo(json.dumps({"model": reply.model, "vectors": vectors.tolist()}))
        return
    click.echo(f"model {reply.model}, {reply.count} x {reply.dimension}, {reply.cached} cached")
    for text, vector in zip(texts, vectors, strict=True):
        head = " ".join(f"{x:+.4f}" for x in vector[:6])
        click.echo(f"  [{head} ...] |v|={np.linalg.norm(vector):.3f}  {text[:60]!r}")
    if len(texts) > 1:
        sims = vectors @ vectors.T
        click.echo("cosine similarity:")
        for i, row in enumerate(sims):
            click.echo("  " + " ".join(f"{x:.3f}" for x in row) + f"  [{i}]")


cli.add_command(memory.remember)
cli.add_command(memory.recall)
cli.add_command(memory.forget)
cli.add_command(replay.replay)
cli.add_command(ops.reindex)
cli.add_command(audit.audit)
cli.add_command(chat.context)
cli.add_command(chat.chat)
cli.add_command(memtok.memtok)
cli.add_command(seed.seed)


@cli.command("env-example")
def env_example() -> None:
    """Print every setting of every service with its default (deploy/hippo.env.example)."""
    click.echo(envfile.render(settings_classes()), nl=False)


if __name__ == "__main__":
    cli()
