"""Settings of the injection service (environment prefix `HIPPO_INJECTION_`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator
from pydantic_settings import SettingsConfigDict

from hippo_core.settings import DatabaseSettings, ServiceSettings


class InjectionSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIPPO_INJECTION_")

    port: int = Field(50055, ge=0, le=65535, description="gRPC port (0 picks a free one).")
    metrics_port: int = Field(
        9105, ge=0, le=65535, description="Prometheus /metrics HTTP port (0 picks a free one)."
    )
    http_port: int = Field(
        8085,
        ge=0,
        le=65535,
        description="Port of the TGI-compatible HTTP API (/generate, /generate_stream, "
        "/info, /health) on `host`; 0 picks a free one.",
    )
    model_dir: str = Field(
        "var/injection/model",
        description="Where the converted model is cached (relative to the working "
        "directory). The first start converts the GGUF there (1-2 minutes on 2 cores); later "
        "starts load it in about a second. It is a derived copy of an installed package, not "
        "service state, so it is not under the launcher's per-cluster data dir: throwaway "
        "clusters (tests) reuse one conversion.",
    )
    dtype: Literal["auto", "bfloat16", "float32"] = Field(
        "auto",
        description="Weights' dtype. auto: float32 on CPU, bfloat16 on CUDA. On this AVX2 "
        "CPU (no bf16 instructions) bfloat16 decodes 1.2x faster but prefills a 256-token "
        "prompt 5.6x slower, so float32 wins below ~200 new tokens, and it is the "
        "reference (docs/injection.md).",
    )
    device: Literal["auto", "cpu", "cuda"] = Field(
        "auto", description="auto: CUDA when a GPU is visible, else CPU."
    )
    threads: int = Field(
        1,
        ge=0,
        le=256,
        description="Intra-op CPU threads of torch (0: one per core). 1 by default: on a "
        "2-core machine shared with other services, 2 threads ran up to 10x slower than 1 "
        "(spinning threads fight for the cores; docs/injection.md).",
    )
    max_waiting: int = Field(
        16,
        ge=0,
        le=10_000,
        description="Interactive requests (Chat, anything not marked background) that may "
        "wait for the model while one runs; the next one gets RESOURCE_EXHAUSTED. One "
        "request holds the model from its first to its last token; interactive waiters go "
        "before background ones.",
    )
    max_waiting_background: int = Field(
        64,
        ge=0,
        le=10_000,
        description="Background requests (marked `X-Hippo-Priority: background`: the "
        "summariser's merges) that may wait; the next one gets RESOURCE_EXHAUSTED and the "
        "merge backs off. A separate bound, so a merge backlog never refuses an interactive "
        "request. Keep it at least max_concurrent_merges x summariser replicas: merges "
        "refused here only retry later.",
    )
    context_length: int = Field(
        4096,
        ge=64,
        le=32_768,
        description="Most tokens per request, prompt (with memories) + new tokens. The model "
        "allows 32k; CPU time and memory grow with it.",
    )
    max_new_tokens: int = Field(1024, ge=1, le=32_768, description="Most new tokens per request.")
    max_stop_sequences: int = Field(
        4, ge=0, le=64, description="Most stop sequences per request (TGI's default is 4)."
    )
    max_stop_chars: int = Field(256, ge=1, description="Most characters per stop sequence.")
    max_influences: int = Field(8, ge=0, le=256, description="Most influences per request.")
    max_strength: float = Field(
        8.0,
        gt=0,
        description="Largest |strength| of an influence. With vectors scaled to the layer "
        "norm, every sweep setting at 0.5 already wrecked unrelated answers "
        "(docs/injection.md); 8 leaves room for unscaled vectors, not for more damage.",
    )
    max_memories: int = Field(16, ge=0, le=256, description="Most attendable memory texts.")
    max_memory_tokens: int = Field(
        1024, ge=1, description="Most tokens of all attendable memories together."
    )
    max_value_scale: float = Field(
        16.0, gt=0, description="Largest attendable.value_scale accepted."
    )
    max_baseline_texts: int = Field(
        256, ge=1, description="Most baseline texts in one MakeValueVector call."
    )
    http_timeout_seconds: float = Field(
        300.0,
        gt=0,
        description="Deadline of an HTTP request (the HTTP API has no per-call deadline of "
        "its own); generation stops when it passes.",
    )

    # -- the memtok store and the influence pipeline (docs/memtok.md) ---------------
    data_dir: str = Field(
        "var/injection",
        description="Where the memtok store lives (memtok.sqlite3, the source of truth, and "
        "memtok-keys/, the Qdrant edge shard of key vectors, rebuilt from it if lost). In "
        "cluster mode only memtok-keys/, this replica's own projection: never shared by two "
        "replicas (an emptyDir is enough).",
    )
    database: DatabaseSettings = Field(
        default_factory=DatabaseSettings,
        description="Cluster mode: a PostgreSQL URL keeps the memtok items, user modes and "
        "reply buffers in the injection schema (hippo_injection), shared by every replica; "
        "each replica's key index catches up with the others' writes through the store's "
        "change feed. Empty: SQLite under data_dir (the embedded default, one replica).",
    )
    embedding_addr: str = Field(
        "",
        description="The embedding service (key vectors of memtoks and of the salient query "
        "words); `hippo up` sets it. Empty: no memtok store is opened and the influence RPCs "
        "answer FAILED_PRECONDITION.",
    )
    memtok_layer: int = Field(
        3,
        ge=0,
        le=255,
        description="Layer of the memtok value vectors and of residual influence: the sweep's "
        "best setting within the damage bound (docs/injection.md). Changing it (or the model) "
        "makes the store refuse to open until `hippo memtok rebuild`.",
    )
    memtok_attend_layer: int = Field(
        6,
        ge=-1,
        le=255,
        description="Keep each new memtok's attendable key/value states (its source words "
        "as the model read them), values from this layer up (the sweep's best: 6), for "
        "influence by attention (influence_route=attend; docs/memtok.md). -1: none are "
        "computed or stored (then influence_route must be residual). "
        "Changing it makes the store refuse to open until `hippo memtok rebuild`; about "
        "15 KiB per token of a memtok's source words (docs/memtok.md).",
    )
    memtok_capacity: int = Field(
        2000,
        ge=1,
        description="Slots per tenant and user (a float16 item takes 1, an int8-compressed "
        "one 0.5).",
    )
    memtok_min_rank: float = Field(
        0.45,
        ge=0,
        description="LLM1 rank below which a word is not stored (most ordinary words), but for "
        "an operator turn's best word (memtok_min_rank_best).",
    )
    memtok_min_rank_best: float = Field(
        0.3,
        ge=0,
        description="An operator turn none of whose words reaches memtok_min_rank still "
        "stores its best word if it ranks at least this (every statement leaves a memtok; "
        "above memtok_min_rank: off).",
    )
    memtok_grace_days: float = Field(
        7.0, ge=0, description="New items are not evicted before this many days."
    )
    memtok_merge_similarity: float = Field(
        0.9,
        gt=0,
        le=1,
        description="Key cosine at or above which a word's new mention merges into its item "
        "(running mean; the count rises only for operator words).",
    )
    memtok_count_cap: int = Field(
        8, ge=1, description="Counts above this add no influence strength."
    )
    memtok_condition_cap: float = Field(
        1.5,
        ge=1,
        description="Cap multiplier of items in conditional wording (only if, never, always, "
        "must); their rank also gets memtok_condition_bonus.",
    )
    memtok_condition_bonus: float = Field(
        0.15, ge=0, description="Rank added to words in conditional wording."
    )
    memtok_half_life_days: float = Field(
        30.0,
        ge=0,
        description="Influence halves per this many days since an item was last seen (0: no "
        "decay). Decay affects influence only, never survival.",
    )
    memtok_min_similarity: float = Field(
        0.35,
        ge=0,
        le=1,
        description="Key similarity below which an item injects nothing (a thin store injects "
        "nothing rather than noise).",
    )
    memtok_base_strength: float = Field(
        0.06,
        ge=0,
        description="Strength (x the layer's mean hidden-state norm) of a fully counted, "
        "fresh, perfectly similar item: the sweep's safe ceiling at layer 3.",
    )
    memtok_compress_below: float = Field(
        0.25,
        ge=0,
        description="Keep score under which an item is packed to int8 before any deletion.",
    )
    memtok_reply_buffer: int = Field(
        64,
        ge=0,
        description="Reply words per user waiting for the next query (only echoed ones are "
        "stored).",
    )
    memtok_consolidate_seconds: float = Field(
        3600.0,
        ge=0,
        description="Every this many seconds, near-duplicate memtoks are merged and weak ones "
        "packed to int8 (logged); 0: never.",
    )
    memtok_resurface_seconds: float = Field(
        300.0,
        ge=0,
        description="Every this many seconds, memtoks an operator marked whose time has come "
        "return to full influence (logged); 0: never.",
    )
    memtok_sync_seconds: float = Field(
        60.0,
        ge=0,
        description="Cluster mode: every this many seconds an idle replica's key index "
        "catches up with the change feed (a request catches up anyway before it searches); "
        "0: only on requests.",
    )
    memtok_feed_retention_days: float = Field(
        7.0,
        gt=0,
        description="Cluster mode: the change feed's records of deleted memtoks (tenant and "
        "id, no words) are trimmed after this long; a replica away longer rebuilds its key "
        "index from the items at start.",
    )
    influence_shortlist: int = Field(
        100, ge=1, le=1000, description="Shortlist taken from the store per query (50-200)."
    )
    influence_llm2_layer: int = Field(
        6, ge=0, le=255, description="LLM2 re-scores the shortlist up to this layer."
    )
    influence_llm2_keep: int = Field(
        16, ge=1, description="Candidates kept after LLM2 and the merge (the best merged)."
    )
    influence_max_inject: int = Field(4, ge=0, le=256, description="Most items applied per query.")
    influence_route: Literal["residual", "attend"] = Field(
        "attend",
        description="How mode ON applies the chosen memtoks. attend (the default): their "
        "stored key/value states, which the prompt attends before its own tokens (needs "
        "memtok_attend_layer >= 0); measured +4.2 nats on the answer and 35% exact match "
        "against +0.1 and 0% for residual (docs/memtok.md). residual: their value vectors "
        "added at memtok_layer.",
    )
    influence_attend_tokens: int = Field(
        256,
        ge=1,
        le=4096,
        description="attend route: most positions of all the attended memtoks together.",
    )
    influence_select_share: float = Field(
        0.3,
        gt=0,
        le=1,
        description="Share of the query's words (best LLM1 rank first) that are searched.",
    )
    influence_weight_salience: float = Field(
        0.0, ge=0, description="Merge weight of the item's LLM1 salience (highest rank)."
    )
    influence_weight_similarity: float = Field(
        1.0, ge=0, description="Merge weight of the key similarity to the salient words."
    )
    influence_weight_llm2: float = Field(
        0.25, ge=0, description="Merge weight of LLM2's attention to the item's words."
    )

    @model_validator(mode="after")
    def _attend_needs_states(self) -> InjectionSettings:
        if self.influence_route == "attend" and self.memtok_attend_layer < 0:
            raise ValueError(
                "influence_route=attend needs memtok_attend_layer >= 0: the store keeps "
                "the states it attends"
            )
        return self
