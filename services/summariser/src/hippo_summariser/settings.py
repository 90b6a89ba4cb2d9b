"""Settings of the summariser (environment prefix `HIPPO_SUMMARISER_`)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, SecretStr, model_validator
from pydantic_settings import SettingsConfigDict

from hippo_core.settings import DatabaseSettings, ServiceSettings


class SummariserSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIPPO_SUMMARISER_")

    port: int = Field(50054, ge=0, le=65535, description="gRPC port (0 picks a free one).")
    metrics_port: int = Field(
        9104, ge=0, le=65535, description="Prometheus /metrics HTTP port (0 picks a free one)."
    )
    data_dir: str = Field(
        "var/summariser",
        description="Where the session store (sessions.sqlite3) lives when database.url is "
        "empty. Losing it loses windows and summaries (the turns themselves are in the "
        "retrieval service's store).",
    )
    database: DatabaseSettings = Field(
        default_factory=DatabaseSettings,
        description="The session store in cluster mode: a PostgreSQL URL shared by every "
        "replica (schema hippo_summariser: sessions, turns, merge claims, the audit "
        "outbox). Empty: sessions.sqlite3 under data_dir.",
    )
    claim_lease_seconds: float = Field(
        30.0,
        ge=1,
        le=3600,
        description="A replica merging a session holds its claim for this long, renewed every "
        "third of it while it works; other replicas leave the session alone meanwhile. A "
        "replica that dies mid-merge holds its sessions until the lease runs out: another "
        "takes them over within 1.5x this (every replica sweeps every half lease), and so "
        "does a restarted process (it is a new owner). Shorter: faster takeover, more "
        "renewals.",
    )
    injection_addr: str = Field(
        "127.0.0.1:50055",
        description="The injection service (gRPC): its CountTokens counts every turn with the "
        "serving model's tokenizer.",
    )
    tokenizer_path: str = Field(
        "",
        description="The reading model's folder or tokenizer.json: the window is counted "
        "with that tokenizer, here, instead of injection_addr's CountTokens. Set it, as the "
        "gateway's, when llm_url serves another model than the built-in one.",
    )
    llm_url: str = Field(
        "http://127.0.0.1:8085",
        description="The merge LLM: with llm_backend tgi a text-generation-inference HTTP "
        "API, with openai an OpenAI-compatible API's base URL (a URL without a path gets "
        "/v1). By default the injection service's HTTP API, which serves both (its "
        "HIPPO_INJECTION_HTTP_PORT; `hippo up` sets this to where it listens); e.g. "
        "http://tgi:80, http://vllm:8000/v1.",
    )
    llm_backend: Literal["tgi", "openai"] = Field(
        "tgi",
        description="The client merges call the LLM with: tgi (TGI's API, the default) or "
        "openai (the `openai` client: vLLM, llama.cpp, Ollama, TGI's /v1, hosted APIs, "
        "the injection host's /v1). Both mark merges X-Hippo-Priority: background.",
    )
    llm_model: str = Field(
        "google/gemma-3-270m",
        min_length=1,
        description="llm_backend openai: the model name sent with every merge request (the "
        "injection host serves one model and accepts any name).",
    )
    llm_api_key: SecretStr = Field(
        SecretStr(""),
        description="llm_backend openai: the API key sent as a bearer token (set it from a "
        "secret; never logged). Empty: none, for local servers.",
    )
    llm_api_style: Literal["completions", "chat"] = Field(
        "completions",
        description="llm_backend openai: completions posts the merge prompt to "
        "/v1/completions (base models, vLLM, llama.cpp, TGI); chat sends it as one user "
        "message to /v1/chat/completions (servers that only take messages, hosted APIs).",
    )
    llm_max_concurrency: int = Field(
        4,
        ge=1,
        le=256,
        description="llm_backend openai: most merge LLM calls in flight per replica (on "
        "top of max_concurrent_merges and merge_pause_seconds); more wait for a slot "
        "within llm_timeout_seconds.",
    )
    audit_addr: str = Field(
        "127.0.0.1:50056",
        description="The audit service: every committed merge is recorded there (ids, "
        "facts checked and kept, retention; no text) through a durable outbox in the "
        "session store, delivered in order and retried while the service is down. Empty: "
        "merges are not recorded.",
    )
    audit_retry_max_seconds: float = Field(
        30.0, gt=0, description="Longest wait between deliveries of the audit outbox."
    )
    window_tokens: int = Field(
        1024,
        ge=16,
        le=1_000_000,
        description="Token budget of a session's working window (turns counted as the model "
        "reads them). Over it, the oldest whole exchanges are merged into the summary; the "
        "latest exchange always stays, even if alone it is larger.",
    )
    merge_low_water: float = Field(
        0.75,
        gt=0,
        le=1,
        description="A merge trims the window to this share of window_tokens, so merges come "
        "in batches (one LLM call per ~25% of the budget with 0.75) instead of one per new "
        "exchange once the window is full. 1.0 trims only to the budget.",
    )
    summary_tokens: int = Field(
        256,
        ge=16,
        le=8192,
        description="Most tokens of a rolling summary (the LLM's max_new_tokens too). When "
        "the validated summary is longer, its oldest sentences go first.",
    )
    merge_input_tokens: int = Field(
        1536,
        ge=64,
        description="Most tokens of dropped turns one merge prompt carries (at least one "
        "whole exchange); a larger backlog is merged in several ordered steps. Keep prompt "
        "(~400 tokens of examples + summary + this) plus summary_tokens within the LLM's "
        "context (the injection host accepts 4,096).",
    )
    merge_style: Literal["rewrite", "extend"] = Field(
        "rewrite",
        description="rewrite: the LLM restates the summary with the dropped turns (a capable "
        "model compresses; a rewrite that loses the old summary's facts is appended to it "
        "instead). extend: the LLM retells only the dropped turns and the note is appended. "
        "On the local 270M model both keep the same facts; rewrite merged 2x faster and "
        "invented less (docs/sessions.md).",
    )
    merge_mode: Literal["auto", "llm", "extractive"] = Field(
        "auto",
        description="How merges fold dropped exchanges into the summary. llm: the LLM "
        "rewrites it (prompt, validation, strict retry, missing-facts sentence). "
        "extractive: no LLM; the sentences that carry the facts (names, numbers, dates, "
        "identifiers) are kept as dated, attributed lines, deduplicated and fitted to "
        "summary_tokens in milliseconds. auto: extractive when the LLM at llm_url is the "
        "built-in Gemma 3 270M base model (its TGI /info), which cannot summarise "
        "(measured in docs/sessions.md#merge-modes), llm otherwise.",
    )
    strict_retry: bool = Field(
        True,
        description="When the summary misses facts of the merged turns, ask the LLM once more "
        "with a prompt that lists them (before appending the missing facts as a sentence).",
    )
    max_concurrent_merges: int = Field(
        2,
        ge=1,
        le=256,
        description="Merges calling the LLM at once, over all sessions (each session's merges "
        "run one at a time, in order). The local host runs one request at a time anyway.",
    )
    merge_pause_seconds: float = Field(
        0.5,
        ge=0,
        le=3600,
        description="Least pause between two merge LLM calls of this replica (after one "
        "ends, before the next starts), on top of max_concurrent_merges. Merges share the "
        "model host with Chat: they are sent as background work, so Chat goes first, and "
        "the pause leaves the host a gap between merges and keeps a backlog or a failing "
        "LLM from sending back-to-back requests. A slot uses about call / (call + pause) "
        "of the host: a pause near the mean merge call halves it, at the cost of a slower "
        "catch-up after a bulk load. 0: no pause.",
    )
    llm_timeout_seconds: float = Field(
        120.0,
        gt=0,
        description="Deadline of one LLM call (includes waiting in the host's queue; the "
        "270M model writes ~8 tokens/s on 2 CPU cores).",
    )
    count_timeout_seconds: float = Field(
        5.0, gt=0, description="Deadline of one CountTokens call to the injection service."
    )
    backoff_initial_seconds: float = Field(
        1.0,
        gt=0,
        description="First wait before retrying a merge whose LLM (or counter) was "
        "unavailable; doubles per failure, with ±20% jitter.",
    )
    backoff_max_seconds: float = Field(
        60.0, gt=0, description="Longest wait between merge retries."
    )
    drain_seconds: float = Field(
        3.0,
        ge=0,
        description="On shutdown, merges inside an LLM call get this long to commit before "
        "they are cancelled (nothing is lost: they run again at the next start). Keep "
        "grace_seconds + drain_seconds under the pod's termination period.",
    )
    flush_max_seconds: float = Field(
        300.0,
        gt=0,
        description="Longest a Flush whose caller set no deadline waits for merges (with a "
        "deadline, Flush waits until just before it).",
    )
    llm_greedy: bool = Field(
        True, description="Greedy decoding for merges (reproducible summaries)."
    )
    llm_temperature: float = Field(
        0.7, gt=0, le=2, description="Sampling temperature when llm_greedy is false."
    )
    llm_top_p: float = Field(
        0.9, gt=0, lt=1, description="Nucleus sampling when llm_greedy is false."
    )
    llm_seed: int = Field(0, ge=0, description="Seed sent with every merge request.")
    llm_repetition_penalty: float = Field(
        1.0, gt=0, le=2, description="TGI repetition penalty (1.0 = none)."
    )
    max_turns_per_append: int = Field(1024, ge=1, description="Most turns in one Append.")
    max_text_bytes: int = Field(
        32 * 1024, ge=1, description="Largest turn text in bytes (the public API's limit)."
    )

    @model_validator(mode="after")
    def _backoff_order(self) -> SummariserSettings:
        if self.backoff_max_seconds < self.backoff_initial_seconds:
            raise ValueError("backoff_max_seconds must be >= backoff_initial_seconds")
        return self
