"""Operator commands that talk to internal services directly."""

from __future__ import annotations

import sys

import click

from hippo.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc
from hippo_cli import api, endpoints
from hippo_cli.settings import CliSettings
from hippo_core import client


@click.command()
@click.option(
    "--embedding-model",
    metavar="NAME",
    help="Build the new vector index with this embedding model: every turn is embedded "
    "again (the embedding service must have it loaded: HIPPO_EMBEDDING_MODELS), while the "
    "old index keeps serving until the new one is complete. Default: the live model, from "
    "the stored vectors.",
)
@click.pass_obj
def reindex(settings: CliSettings, embedding_model: str | None) -> None:
    """Rebuild the BM25 and vector indexes from the turn store (the service keeps serving).

    Every retrieval replica keeps its own indexes (cluster mode): each is rebuilt in turn,
    so the others serve meanwhile."""
    if embedding_model is not None and not embedding_model.strip():
        raise click.BadParameter("must name a model", param_hint="--embedding-model")
    request = retrieval_pb2.ReindexRequest(embedding_model=embedding_model or "")

    def shown(report: retrieval_pb2.ReindexResponse | None) -> str | None:
        # Re-embedding is the slow part of a switch: the count says it is moving.
        return f"{report.embedded} re-embedded" if report and embedding_model else None

    async def call(addr: str) -> retrieval_pb2.ReindexResponse:
        async with client.channel(addr, tls_settings=settings.tls) as channel:
            stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
            status = await stub.Status(retrieval_pb2.StatusRequest(), timeout=10)
            last = retrieval_pb2.ReindexResponse()
            with click.progressbar(
                length=max(1, status.turns),
                label=f"reindexing {addr}",
                file=sys.stderr,
                item_show_func=shown,
            ) as bar:
                # No deadline beyond the service's own: a large store takes minutes.
                async for report in stub.Reindex(request, timeout=24 * 3600):
                    bar.update(report.applied - last.applied, current_item=report)
                    last = report
            return last

    for addr in endpoints.addresses(settings.retrieval_addr):
        last = api.run(call(addr))
        embedded = f", {last.embedded} turns re-embedded" if embedding_model else ""
        model = f" (embedding model {last.embedding_model})" if last.embedding_model else ""
        click.echo(
            f"reindexed {addr}: {last.applied} changes applied{embedded}; "
            f"the new indexes are live{model}"
        )
