"""Wiring only: settings -> model -> domain -> serve() (gRPC) + the TGI HTTP API."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import grpc

from hippo.injection.v1 import injection_pb2, injection_pb2_grpc
from hippo_core.server.app import Service, run
from hippo_core.server.authz import OPERATOR, callers
from hippo_injection.adapters.memtok_keys import EdgeKeyIndex
from hippo_injection.adapters.memtok_sqlite import SqliteMemtokStore
from hippo_injection.domain.engine import Engine
from hippo_injection.domain.memtok.pipeline import (
    InfluencePipeline,
    PipelineSettings,
    Route,
    Weights,
)
from hippo_injection.domain.memtok.policy import Policy
from hippo_injection.domain.memtok.ports import Embedder, ItemStore, ReplyBuffer
from hippo_injection.domain.memtok.store import MemtokStore
from hippo_injection.domain.memtok.values import EngineStates, EngineValues
from hippo_injection.domain.queue import ModelQueue
from hippo_injection.domain.service import InjectionService
from hippo_injection.domain.types import GenerateRequest, Prompt
from hippo_injection.domain.validation import Limits
from hippo_injection.servicer import InjectionServicer
from hippo_injection.settings import InjectionSettings
from hippo_injection.web.openai import OpenAiHttpApi
from hippo_injection.web.tgi import TgiHttpApi

FULL_NAME = injection_pb2.DESCRIPTOR.services_by_name["InjectionService"].full_name
# Who may call each RPC when TLS is on (docs/security.md has the whole table): the
# gateway generates, plans and erases; the summariser counts tokens; the operator's
# `hippo memtok` and `hippo seed` set influence and seed memtoks, and the benchmarks
# score and make value vectors.
CALLERS = callers(
    FULL_NAME,
    {
        "Generate": {"gateway", OPERATOR},
        "Score": {OPERATOR},
        "CountTokens": {"gateway", "summariser", OPERATOR},
        "MakeValueVector": {OPERATOR},
        "Info": {"gateway", "summariser", OPERATOR},
        "PlanInfluence": {"gateway"},
        "WriteMemtoks": {"gateway", OPERATOR},
        "SetUserInfluence": {OPERATOR},
        "ForgetUser": {"gateway"},
    },
)
# The HTTP APIs (TGI's /generate, OpenAI's /v1/completions and /v1/chat/completions):
# the gateway's Chat and the summariser's merges.
HTTP_CALLERS = frozenset({"gateway", "summariser", OPERATOR})
VERSION = "0.1.0"


def limits(settings: InjectionSettings) -> Limits:
    return Limits(
        context_length=settings.context_length,
        max_new_tokens=settings.max_new_tokens,
        max_stop_sequences=settings.max_stop_sequences,
        max_stop_chars=settings.max_stop_chars,
        max_influences=settings.max_influences,
        max_strength=settings.max_strength,
        max_memories=settings.max_memories,
        max_memory_tokens=settings.max_memory_tokens,
        max_value_scale=settings.max_value_scale,
        max_baseline_texts=settings.max_baseline_texts,
    )


def load_engine(settings: InjectionSettings):  # type: ignore[no-untyped-def]
    """Blocking: convert the GGUF on first use, then load the cache (torch imported here,
    not at module import, so the process binds its ports at once)."""
    from hippo_injection.adapters import loader
    from hippo_injection.adapters.engine import TransformersEngine

    path = loader.ensure_cached(Path(settings.model_dir))
    return TransformersEngine.load(path, settings.dtype, settings.device, settings.threads)


def open_memtok(settings: InjectionSettings, engine, queue: ModelQueue):  # type: ignore[no-untyped-def]
    """The memtok store and pipeline, keys embedded by the embedding service."""
    from hippo_injection.adapters.embedding_client import EmbeddingClient
    from hippo_injection.domain.memtok.service import MemtokService

    embedder = EmbeddingClient(
        settings.embedding_addr, settings.client.timeout_seconds, settings.tls
    )
    return MemtokService(build_pipeline(settings, engine, embedder), queue)


# -- the memtok store and the influence pipeline ------------------------------------------
# Embedded default (no `database.url`): the items in `data_dir/memtok.sqlite3`, reply words
# in memory. Cluster mode: items and reply words in PostgreSQL (schema hippo_injection),
# shared by every replica; in both, the key index under `data_dir/memtok-keys`, this
# process's own.


def policy(s: InjectionSettings) -> Policy:
    return Policy(
        capacity=s.memtok_capacity,
        min_rank=s.memtok_min_rank,
        min_rank_best=s.memtok_min_rank_best,
        condition_bonus=s.memtok_condition_bonus,
        grace_days=s.memtok_grace_days,
        merge_similarity=s.memtok_merge_similarity,
        count_cap=s.memtok_count_cap,
        condition_cap=s.memtok_condition_cap,
        half_life_days=s.memtok_half_life_days,
        min_similarity=s.memtok_min_similarity,
        base_strength=s.memtok_base_strength,
        compress_below=s.memtok_compress_below,
        reply_buffer=s.memtok_reply_buffer,
    )


def pipeline_settings(s: InjectionSettings) -> PipelineSettings:
    return PipelineSettings(
        layer=s.memtok_layer,
        shortlist=s.influence_shortlist,
        llm2_layer=s.influence_llm2_layer,
        llm2_keep=s.influence_llm2_keep,
        max_inject=s.influence_max_inject,
        select_share=s.influence_select_share,
        weights=Weights(
            s.influence_weight_salience, s.influence_weight_similarity, s.influence_weight_llm2
        ),
        route=Route(s.influence_route),
        attend_tokens=s.influence_attend_tokens,
    )


def cluster(s: InjectionSettings) -> bool:
    return bool(s.database.url.get_secret_value())


def sqlite_path(s: InjectionSettings) -> Path:
    return Path(s.data_dir) / "memtok.sqlite3"


def open_items(s: InjectionSettings) -> tuple[ItemStore, ReplyBuffer | None]:
    """The item store and, in cluster mode, the shared reply buffer (None: in memory)."""
    if not cluster(s):
        return SqliteMemtokStore(sqlite_path(s)), None
    # Imported here: the embedded default never loads psycopg.
    from hippo_core.postgres import Database
    from hippo_injection.adapters.memtok_postgres import (
        SCHEMA,
        PostgresMemtokStore,
        PostgresReplyBuffer,
    )

    database = Database(s.database, schema=SCHEMA, application="hippo-injection")
    try:
        return PostgresMemtokStore(database), PostgresReplyBuffer(database)
    except BaseException:
        database.close()
        raise


def open_store(
    s: InjectionSettings,
    engine: Engine,
    embedder: Embedder,
    *,
    verify_model: bool = True,
    keys_dir: Path | None = None,
) -> MemtokStore:
    """`keys_dir`: where the key index lives if not under data_dir (a throwaway one for
    an operator command in cluster mode)."""
    items, buffer = open_items(s)
    try:
        keys = EdgeKeyIndex(keys_dir or Path(s.data_dir) / "memtok-keys")
    except BaseException:
        items.close()
        raise
    try:
        values = EngineValues(engine, s.memtok_layer)
        attend = EngineStates(engine, s.memtok_attend_layer) if s.memtok_attend_layer >= 0 else None
        return MemtokStore(
            items,
            keys,
            embedder,
            values,
            policy(s),
            buffer=buffer,
            verify_model=verify_model,
            attend=attend,
        )
    except BaseException:
        keys.close()
        items.close()
        raise


def build_pipeline(s: InjectionSettings, engine: Engine, embedder: Embedder) -> InfluencePipeline:
    return InfluencePipeline(engine, open_store(s, engine, embedder), pipeline_settings(s))


def build(settings: InjectionSettings) -> Service:
    """The injection service for `Runner`; the model loads during warm-up."""
    servicer = InjectionServicer(settings)
    queue = ModelQueue(settings.max_waiting, settings.max_waiting_background)
    schedulers: list[Any] = []  # the memtok store's timers, when it has one
    http = TgiHttpApi(
        servicer._domain,
        settings.http_timeout_seconds,
        settings.grace_seconds,
        settings.max_waiting,
        VERSION,
        extra=[OpenAiHttpApi(servicer._domain)],
    )

    def register(server: grpc.aio.Server) -> None:
        injection_pb2_grpc.add_InjectionServiceServicer_to_server(servicer, server)

    async def warmup() -> None:
        # HTTP first, so /health answers 503 while the model loads, like the gRPC health.
        await http.start(settings.host, settings.http_port, settings.tls, HTTP_CALLERS)
        # Off the event loop: conversion takes minutes on first start and health probes
        # must keep answering NOT_SERVING meanwhile.
        engine = await asyncio.to_thread(load_engine, settings)
        service = InjectionService(engine, queue, limits(settings))
        warm = GenerateRequest(Prompt(text="Hippo warms up."), max_new_tokens=2)
        async for _ in service.generate(warm):  # the first passes allocate and pick kernels
            pass
        if settings.embedding_addr:
            # Opening the store checks its model id and layer: a store of another model
            # stops the start (run `hippo memtok rebuild`).
            memtok = await asyncio.to_thread(open_memtok, settings, engine, queue)
            servicer.memtok = memtok
            from hippo_injection.domain.memtok.scheduler import MemtokScheduler

            scheduler = MemtokScheduler(
                memtok.pipeline.store,
                queue,
                settings.memtok_consolidate_seconds,
                settings.memtok_resurface_seconds,
                sync_seconds=settings.memtok_sync_seconds,
                feed_retention_seconds=settings.memtok_feed_retention_days * 86_400,
            )
            scheduler.start()
            schedulers.append(scheduler)
        servicer.service = service

    async def close() -> None:
        await http.stop()
        for scheduler in schedulers:
            await scheduler.stop()
        await queue.close()
        if servicer.memtok is not None:
            servicer.memtok.close()

    return Service(
        "injection", [FULL_NAME], register, warmup, close, version=VERSION, callers=CALLERS
    )


def main() -> None:
    settings = InjectionSettings()
    run(build(settings), settings)


if __name__ == "__main__":
    main()
