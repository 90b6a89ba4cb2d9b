"""`hippo`: run the cluster locally and talk to it from the terminal."""

from __future__ import annotations

import asyncio
import json
import sys

import click
import grpc
import numpy as np

from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc
from hippo_cli import audit, chat, launcher, memory, memtok, ops, replay, seed
from hippo_cli.health import check
from hippo_cli.registry import SERVICES, settings_classes
from hippo_cli.settings import CliSettings
from hippo_core import client, envfile


def _fail(exc: grpc.aio.AioRpcError) -> None:
    click.echo(f"error: {exc.code().name}: {exc.details()}", err=True)
    sys.exit(2)


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.pass_context
def cli(ctx: click.Context) -> None:
    """Hippo: long-term, private, verifiable memory for LLM applications."""
    ctx.obj = CliSettings()


@cli.command()
@click.pass_obj
def up(settings: CliSettings) -> None:
    """Start every service locally on loopback and wait until Ctrl-C."""
    sys.exit(launcher.up(settings))


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of a table.")
@click.pass_obj
def health(settings: CliSettings, as_json: bool) -> None:
    """Readiness of every service (exit code 1 if any is not SERVING)."""
    addrs = {
        "gateway": settings.gateway_addr,
        "embedding": settings.embedding_addr,
        "retrieval": settings.retrieval_addr,
        "injection": settings.injection_addr,
        "summariser": settings.summariser_addr,
        "audit": settings.audit_addr,
    }

    async def run() -> dict[str, dict[str, str]]:
        out = {}
        for spec in SERVICES:
            addr = addrs[spec.name]
            out[spec.name] = {"addr": addr, "status": await check(addr, spec.full_name)}
        return out

    report = asyncio.run(run())
    if as_json:
        click.echo(json.dumps(report))
    else:
        for name, row in report.items():
            click.echo(f"{name:<11} {row['addr']:<21} {row['status']}")
    sys.exit(0 if all(r["status"] == "SERVING" for r in report.values()) else 1)


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
