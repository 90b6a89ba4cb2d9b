"""Wiring only: settings -> store, counter, LLM -> domain -> serve()."""

from __future__ import annotations

import asyncio
from pathlib import Path

import grpc
import structlog

from hippo.summariser.v1 import summariser_pb2, summariser_pb2_grpc
from hippo_core import client
from hippo_core.server.app import Service, run
from hippo_summariser import metrics
from hippo_summariser.adapters.audit_client import GrpcAuditSink
from hippo_summariser.adapters.sqlite_store import SqliteSessionStore
from hippo_summariser.adapters.tgi_llm import Generation, TgiLlm
from hippo_summariser.adapters.token_counter import GrpcTokenCounter
from hippo_summariser.domain.audit import AuditOutbox, OutboxConfig
from hippo_summariser.domain.merge import MergeConfig, Merger
from hippo_summariser.domain.ports import MergeObserver, NoObserver
from hippo_summariser.domain.service import Budgets, SummariserService
from hippo_summariser.domain.summarise import SummaryConfig
from hippo_summariser.domain.validation import Limits
from hippo_summariser.servicer import SummariserServicer
from hippo_summariser.settings import SummariserSettings

log = structlog.stdlib.get_logger("hippo.summariser")
FULL_NAME = summariser_pb2.DESCRIPTOR.services_by_name["SummariserService"].full_name


def merge_config(settings: SummariserSettings) -> MergeConfig:
    return MergeConfig(
        window_tokens=settings.window_tokens,
        low_water_tokens=max(1, int(settings.window_tokens * settings.merge_low_water)),
        max_input_tokens=settings.merge_input_tokens,
        summary=SummaryConfig(
            summary_tokens=settings.summary_tokens,
            style=settings.merge_style,
            strict_retry=settings.strict_retry,
        ),
        max_concurrent=settings.max_concurrent_merges,
        backoff_initial_seconds=settings.backoff_initial_seconds,
        backoff_max_seconds=settings.backoff_max_seconds,
        drain_seconds=settings.drain_seconds,
    )


def build(settings: SummariserSettings, observer: MergeObserver | None = None) -> Service:
    """`observer` is the on_merge hook (e.g. the audit log's client); none by default."""
    servicer = SummariserServicer()
    opened: list[SummariserService] = []
    outboxes: list[AuditOutbox] = []
    channels: list[grpc.aio.Channel] = []

    def register(server: grpc.aio.Server) -> None:
        summariser_pb2_grpc.add_SummariserServiceServicer_to_server(servicer, server)

    async def warmup() -> None:
        # Off the event loop: opening the store may migrate or recover a large WAL.
        store = await asyncio.to_thread(
            SqliteSessionStore, Path(settings.data_dir) / "sessions.sqlite3"
        )
        metrics.SESSIONS.set_function(store.session_count)
        # Made inside the server's loop (aio channels bind to it). The injection service
        # is not awaited: until it answers, turns are stored uncounted (see service.py).
        injection = client.channel(settings.injection_addr, settings.client)
        channels.append(injection)
        counter = GrpcTokenCounter(injection, settings.count_timeout_seconds)
        llm = TgiLlm(
            settings.llm_url,
            settings.llm_timeout_seconds,
            Generation(
                greedy=settings.llm_greedy,
                temperature=settings.llm_temperature,
                top_p=settings.llm_top_p,
                seed=settings.llm_seed,
                repetition_penalty=settings.llm_repetition_penalty,
            ),
        )
        outbox = None
        if settings.audit_addr:
            audit = client.channel(settings.audit_addr, settings.client)
            channels.append(audit)
            outbox = AuditOutbox(
                store,
                GrpcAuditSink(audit),
                OutboxConfig(retry_max_seconds=settings.audit_retry_max_seconds),
            )
            outboxes.append(outbox)
            outbox.start()  # delivers what a previous run left in the outbox
        else:
            log.warning("merges_not_audited", reason="HIPPO_SUMMARISER_AUDIT_ADDR is empty")
        merger = Merger(
            store, counter, llm, merge_config(settings), observer or NoObserver(), outbox=outbox
        )
        service = SummariserService(
            store,
            counter,
            merger,
            Budgets(settings.window_tokens, settings.summary_tokens, settings.flush_max_seconds),
            Limits(max_turns=settings.max_turns_per_append, max_text_bytes=settings.max_text_bytes),
        )
        opened.append(service)
        await service.resume()
        servicer.service = service

    async def close() -> None:
        # The outbox first (it reads the store the service closes); what it has not
        # delivered in a second stays queued for the next start.
        for outbox in outboxes:
            await outbox.drained(timeout=1.0)
            await outbox.close()
        for service in opened:
            await service.close()
        for channel in channels:
            await channel.close()

    return Service("summariser", [FULL_NAME], register, warmup, close)


def main() -> None:
    settings = SummariserSettings()
    run(build(settings), settings)


if __name__ == "__main__":
    main()
