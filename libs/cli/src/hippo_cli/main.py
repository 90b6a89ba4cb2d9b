"""`hippo`: run the cluster locally and talk to it from the terminal."""

from __future__ import annotations

import asyncio
import importlib.metadata
import json
import sys
from pathlib import Path

import click
import grpc
import numpy as np

from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc
from hippo.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc
from hippo_cli import (
    api,
    audit,
    browse,
    chat,
    endpoints,
    launcher,
    memory,
    memtok,
    ops,
    replay,
    seed,
    transfer,
)
from hippo_cli.health import check
from hippo_cli.registry import SERVICES, settings_classes
from hippo_cli.settings import CliSettings
from hippo_core import client, embedding_client, envfile
from hippo_core.settings import TlsSettings


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


def _tls(settings: CliSettings, ca: str | None, cert: str | None, key: str | None) -> TlsSettings:
    """The options over HIPPO_CLI_TLS__*; a certificate needs its key."""
    given = {"ca_file": ca, "cert_file": cert, "key_file": key}
    tls = settings.tls.model_copy(update={k: v for k, v in given.items() if v is not None})
    if bool(tls.cert_file) != bool(tls.key_file):
        raise click.UsageError("--tls-cert and --tls-key go together")
    if tls.cert_file and not tls.ca_file:
        raise click.UsageError("--tls-cert needs --tls-ca (the CA that signs the servers)")
    return tls


EXIT_CODES = """Exit codes: 0 done; 1 a check failed (health, audit verify); 2 a wrong
command line or input file; 3 a service refused or failed the call (the message names the
status, e.g. INVALID_ARGUMENT, with a hint when nothing answered)."""


@click.group(context_settings={"help_option_names": ["-h", "--help"]}, epilog=EXIT_CODES)
@click.version_option(importlib.metadata.version("hippo-cli"), "--version", "-V", prog_name="hippo")
@click.option(
    "--gateway",
    metavar="HOST:PORT",
    help="The gateway the memory commands call [HIPPO_CLI_GATEWAY_ADDR; default: the one "
    "`hippo up` started, else 127.0.0.1:50051].",
)
@click.option(
    "--api-key",
    metavar="KEY",
    help="The API key the memory commands send [HIPPO_CLI_API_KEY; default: the local "
    "development key]. Prefer the variable: a flag shows in the process list.",
)
@click.option(
    "--timeout",
    type=click.FloatRange(min=0, min_open=True),
    metavar="SECONDS",
    help="Deadline of each call [HIPPO_CLI_TIMEOUT_SECONDS; default 10].",
)
@click.option(
    "--tls-ca",
    type=click.Path(exists=True, dir_okay=False),
    help="CA bundle (PEM) that signs the services' certificates: TLS on [HIPPO_CLI_TLS__CA_FILE].",
)
@click.option(
    "--tls-cert",
    type=click.Path(exists=True, dir_okay=False),
    help="Client certificate (PEM), the operator's for internal services "
    "[HIPPO_CLI_TLS__CERT_FILE].",
)
@click.option(
    "--tls-key",
    type=click.Path(exists=True, dir_okay=False),
    help="Private key of --tls-cert [HIPPO_CLI_TLS__KEY_FILE].",
)
@click.pass_context
def cli(
    ctx: click.Context,
    gateway: str | None,
    api_key: str | None,
    timeout: float | None,
    tls_ca: str | None,
    tls_cert: str | None,
    tls_key: str | None,
) -> None:
    """Hippo: long-term, private, verifiable memory for LLM applications."""
    settings = CliSettings()
    # Commands reach every replica of a local cluster unless told otherwise.
    addrs = _addresses(settings)
    flags: dict[str, object] = {
        "gateway_addr": gateway,
        "api_key": api_key,
        "timeout_seconds": timeout,
    }
    ctx.obj = settings.model_copy(
        update={
            **{f"{name}_addr": endpoints.target(a) for name, a in addrs.items()},
            "tls": _tls(settings, tls_ca, tls_cert, tls_key),
            **{k: v for k, v in flags.items() if v is not None},
        }
    )


@cli.command()
@click.option(
    "--cluster",
    is_flag=True,
    help="Cluster mode: PostgreSQL as the state of record and --replicas processes per service.",
)
@click.option("--replicas", type=click.IntRange(1, 8), help="Processes per service (--cluster).")
@click.option(
    "--tls",
    is_flag=True,
    help="mTLS between every service: a throwaway CA and certificates under <data_dir>/tls.",
)
@click.pass_obj
def up(settings: CliSettings, cluster: bool, replicas: int | None, tls: bool) -> None:
    """Start every service locally on loopback and wait until Ctrl-C."""
    count = replicas or settings.replicas
    sys.exit(launcher.up(settings, cluster=cluster, replicas=count, tls=tls))


async def _index_state(addr: str, tls: TlsSettings) -> dict[str, str | int]:
    """A retrieval replica's live index: its embedding model and generation (after an
    online model switch, replicas rebuilt one by one differ until the last is done), the
    vectors searched outside the graph, and whether a rebuild runs; {} when Status fails
    (readiness alone decides the exit code)."""
    async with client.channel(addr, tls_settings=tls) as channel:
        stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
        try:
            reply = await stub.Status(retrieval_pb2.StatusRequest(), timeout=2.0)
        except grpc.aio.AioRpcError:
            return {}
    return {
        "embedding_model": reply.embedding_model,
        "generation": reply.generation,
        "vectors_outside_graph": reply.vectors_outside_graph,
        "rebuilding": int(reply.rebuilding),
        "indexes": f"{reply.lexical_backend or 'tantivy'}+{reply.vector_backend}",
    }


@cli.command()
@click.option("--json", "as_json", is_flag=True, help="One JSON object instead of a table.")
@click.pass_obj
def health(settings: CliSettings, as_json: bool) -> None:
    """Readiness of every replica of every service (exit code 1 if any is not SERVING);
    for retrieval, the live index's embedding model and generation too."""
    addrs = _addresses(CliSettings())  # replica by replica, not the balanced targets

    async def probe(name: str, full_name: str, addr: str) -> dict[str, str | int]:
        out: dict[str, str | int] = {
            "addr": addr,
            "status": await check(addr, full_name, tls=settings.tls),
        }
        if name == "retrieval" and out["status"] == "SERVING":
            out.update(await _index_state(addr, settings.tls))
        return out

    async def run() -> dict[str, list[dict[str, str | int]]]:
        out: dict[str, list[dict[str, str | int]]] = {}
        for spec in SERVICES:
            out[spec.name] = [await probe(spec.name, spec.full_name, a) for a in addrs[spec.name]]
        return out

    report = asyncio.run(run())
    if as_json:
        click.echo(json.dumps(report))
    else:
        for name, rows in report.items():
            for index, row in enumerate(rows):
                label = f"{name}-{index}" if len(rows) > 1 else name
                index_state = (
                    f"  {row['indexes']}, model {row['embedding_model'] or '-'}, "
                    f"generation {row['generation']}, "
                    f"{row['vectors_outside_graph']} vectors outside the graph"
                    + (", rebuilding" if row["rebuilding"] else "")
                    if "generation" in row
                    else ""
                )
                click.echo(f"{label:<13} {row['addr']:<21} {row['status']}{index_state}")
    serving = all(r["status"] == "SERVING" for rows in report.values() for r in rows)
    sys.exit(0 if serving else 1)


@cli.command()
@click.argument("texts", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the full vectors as JSON.")
@click.pass_obj
def embed(settings: CliSettings, texts: tuple[str, ...], as_json: bool) -> None:
    """Embed TEXTS with the embedding service and show the vectors."""

    async def run() -> embedding_pb2.EmbedResponse:
        async with client.channel(settings.embedding_addr, tls_settings=settings.tls) as channel:
            stub = embedding_pb2_grpc.EmbeddingServiceStub(channel)
            reply: embedding_pb2.EmbedResponse = await stub.Embed(
                embedding_pb2.EmbedRequest(texts=list(texts)), timeout=settings.timeout_seconds
            )
            return reply

    try:
        reply = asyncio.run(run())
    except grpc.aio.AioRpcError as exc:
        api.fail(exc)
    vectors = embedding_client.vectors(reply)
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
cli.add_command(browse.list_memories)
cli.add_command(browse.get)
cli.add_command(browse.meta)
cli.add_command(browse.sessions)
cli.add_command(browse.users)
cli.add_command(transfer.export)
cli.add_command(transfer.import_)
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
