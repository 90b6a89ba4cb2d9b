"""Builds the memtok store and the influence pipeline from the settings (wiring only).

Embedded default (no `database.url`): the items in `data_dir/memtok.sqlite3`, reply words
in memory. Cluster mode: items and reply words in PostgreSQL (schema hippo_injection),
shared by every replica; in both, the key index under `data_dir/memtok-keys`, this
process's own."""

from __future__ import annotations

from pathlib import Path

from hippo_injection.adapters.memtok_keys import EdgeKeyIndex
from hippo_injection.adapters.memtok_sqlite import SqliteMemtokStore
from hippo_injection.domain.engine import Engine
from hippo_injection.domain.memtok.pipeline import InfluencePipeline, PipelineSettings, Weights
from hippo_injection.domain.memtok.policy import Policy
from hippo_injection.domain.memtok.ports import Embedder, ItemStore, ReplyBuffer
from hippo_injection.domain.memtok.store import MemtokStore
from hippo_injection.domain.memtok.values import EngineValues
from hippo_injection.settings import InjectionSettings


def policy(s: InjectionSettings) -> Policy:
    return Policy(
        capacity=s.memtok_capacity,
        min_rank=s.memtok_min_rank,
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
        return MemtokStore(
            items, keys, embedder, values, policy(s), buffer=buffer, verify_model=verify_model
        )
    except BaseException:
        keys.close()
        items.close()
        raise


def build_pipeline(s: InjectionSettings, engine: Engine, embedder: Embedder) -> InfluencePipeline:
    return InfluencePipeline(engine, open_store(s, engine, embedder), pipeline_settings(s))
