"""Operator commands that talk to internal services directly."""

from __future__ import annotations

import sys

import click

from hippo.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc
from hippo_cli import api, endpoints
from hippo_cli.settings import CliSettings
from hippo_core import client


@click.command()
@click.pass_obj
def reindex(settings: CliSettings) -> None:
    """Rebuild the BM25 and vector indexes from the turn store (the service keeps serving).

    Every retrieval replica keeps its own indexes (cluster mode): each is rebuilt in turn,
    so the others serve meanwhile."""

    async def call(addr: str) -> retrieval_pb2.ReindexResponse:
        async with client.channel(addr, tls_settings=settings.tls) as channel:
            stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
            status = await stub.Status(retrieval_pb2.StatusRequest(), timeout=10)
            last = retrieval_pb2.ReindexResponse()
            with click.progressbar(
                length=max(1, status.turns), label=f"reindexing {addr}", file=sys.stderr
            ) as bar:
                # No deadline beyond the service's own: a large store takes minutes.
                async for report in stub.Reindex(retrieval_pb2.ReindexRequest(), timeout=24 * 3600):
                    bar.update(report.applied - last.applied)
                    last = report
            return last

    for addr in endpoints.addresses(settings.retrieval_addr):
        last = api.run(call(addr))
        click.echo(f"reindexed {addr}: {last.applied} changes applied; the new indexes are live")
