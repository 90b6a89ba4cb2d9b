"""Settings of the gateway (environment prefix `HIPPO_GATEWAY_`)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, SecretStr
from pydantic_settings import SettingsConfigDict

from hippo_core.settings import DatabaseSettings, ServiceSettings
from hippo_gateway.domain.context import INSTRUCTIONS

Role = Literal["read", "write", "erase", "audit-read", "admin"]


def _application_roles() -> list[Role]:
    return ["read", "write", "erase"]


class ApiKeyGrant(BaseModel):
    """One API key's tenant and roles (docs/security.md)."""

    model_config = ConfigDict(extra="forbid")

    tenant: str = Field(description="The tenant every call with this key acts in.")
    roles: list[Role] = Field(
        default_factory=_application_roles,
        min_length=1,
        description="What the key may do: read (Recall, BuildContext, GetSession), write "
        "(Remember, ReportOutcome), erase (Forget), audit-read (ListAuditEntries, "
        "VerifyAudit of its tenant), admin (all, and VerifyAudit of the whole log). Chat "
        "needs read and write.",
    )


class TenantQuotaSettings(BaseModel):
    """One tenant's limits; 0 means unlimited."""

    model_config = ConfigDict(extra="forbid")

    requests_per_second: float = Field(
        0.0,
        ge=0,
        description="Calls per second the tenant may make, per gateway replica (a token "
        "bucket); over it, RESOURCE_EXHAUSTED with RetryInfo and QuotaFailure.",
    )
    burst: int = Field(
        0, ge=0, description="Calls the tenant may make at once; 0: max(1, requests_per_second)."
    )
    max_stored_turns: int = Field(
        0,
        ge=0,
        description="Turns the tenant may store; a Remember that would exceed it gets "
        "RESOURCE_EXHAUSTED with QuotaFailure and stores nothing.",
    )


class GatewaySettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIPPO_GATEWAY_")

    port: int = Field(50051, ge=0, le=65535, description="gRPC port (0 picks a free one).")
    max_concurrent_per_method: int = Field(
        16,
        ge=0,
        description="Calls of one public RPC served at once by this replica; the next gets "
        "RESOURCE_EXHAUSTED with RetryInfo. Throughput saturates at a few calls in flight "
        "per core (2 cores: ~8 Recalls) and calls beyond that only queue, their latency "
        "growing until deadlines pass and the work is wasted; bounded, overload is refused "
        "at once and goodput stays at capacity (bench/load.py). Raise it with the cores "
        "behind a replica; 0 leaves only max_concurrent_rpcs.",
    )
    metrics_port: int = Field(
        9101, ge=0, le=65535, description="Prometheus /metrics HTTP port (0 picks a free one)."
    )
    api_keys: dict[str, str | ApiKeyGrant] = Field(
        default_factory=dict,
        repr=False,  # the keys are the secrets
        description='JSON object: API key -> tenant, e.g. {"k3y": "acme"} (roles read, '
        'write, erase), or -> {"tenant": "acme", "roles": ["audit-read"]}; a key may be '
        'given as "sha256:<hex digest>" instead. Required: with none, the gateway does not '
        'start. `hippo up` sets a local admin key (HIPPO_CLI_API_KEY -> tenant "local").',
    )
    quotas: dict[str, TenantQuotaSettings] = Field(
        default_factory=dict,
        description='JSON object: tenant -> its quota, e.g. {"acme": {"requests_per_second": '
        '50, "max_stored_turns": 100000}}; tenants not listed get default_quota.',
    )
    default_quota: TenantQuotaSettings = Field(
        default_factory=TenantQuotaSettings,
        description="The quota of every tenant not in `quotas` (default: unlimited).",
    )
    quota_refresh_seconds: float = Field(
        5.0,
        gt=0,
        description="How often a replica re-reads a tenant's stored-turn count from the "
        "turn store (between reads it counts its own writes): replicas together may "
        "overshoot max_stored_turns by what they accept in this interval.",
    )
    openai_port: int = Field(
        0,
        ge=0,
        le=65535,
        description="Port of the OpenAI-compatible HTTP API (POST /v1/chat/completions, "
        "GET /v1/models: Chat with memory for any OpenAI SDK, docs/api.md), on `host`; "
        "HTTPS with the gateway's certificate under TLS. 0: not served (the default: "
        "every deployment opts in to the extra listener).",
    )
    openai_default_session: str = Field(
        "default",
        pattern=r"^[A-Za-z0-9._:@-]{1,128}$",
        description="The session of an OpenAI-API request without an X-Hippo-Session "
        "header: every such request of one user shares this session's window.",
    )
    openai_timeout_seconds: float = Field(
        180.0,
        gt=0,
        description="Deadline of one OpenAI-API request (HTTP has no per-call deadline): "
        "recall, generation and storing the exchange together; past it generation stops "
        "and the request gets 504 (or, once streaming, an in-band error).",
    )
    embedding_addr: str = Field("127.0.0.1:50052", description="The embedding service.")
    retrieval_addr: str = Field("127.0.0.1:50053", description="The retrieval service.")
    summariser_addr: str = Field(
        "127.0.0.1:50054",
        description="The summariser service (session windows, summaries). Empty: no "
        "bounded sessions (BuildContext then holds memories and the query only).",
    )
    injection_addr: str = Field(
        "127.0.0.1:50055",
        description="The LLM host's gRPC API, for exact token counts (CountTokens) with the "
        "serving model's tokenizer and prompt format, influence, and erasing a forgotten "
        "user's memtoks. Empty: none (BuildContext and Chat fail; Forget erases no memtoks).",
    )
    tokenizer_path: str = Field(
        "",
        description="The reading model's folder (tokenizer.json, tokenizer_config.json with "
        "its chat template) or its tokenizer.json: BuildContext and Chat then count budgets "
        "with that tokenizer and render prompts with that template (a plain base format "
        "without one), here, instead of asking injection_addr. Set it when llm_url serves "
        "another model than the built-in one (docs/operations.md#bring-your-own-llm).",
    )
    context_length: int = Field(
        0,
        ge=0,
        description="With tokenizer_path: the model's context window in tokens (0: the "
        "tokenizer_config.json's model_max_length, else no limit beyond the token budget).",
    )
    llm_url: str = Field(
        "http://127.0.0.1:8085",
        description="Where Chat generates: with llm_backend tgi a TGI-compatible endpoint "
        "(the text-generation client), with openai an OpenAI-compatible API's base URL (a "
        "URL without a path gets /v1). The local injection host's HTTP API by default; it "
        "serves both. Token counts come from injection_addr, so the server should serve "
        "the same model or one with the same prompt format (docs/operations.md#bring-your-"
        "own-llm).",
    )
    llm_backend: Literal["tgi", "openai"] = Field(
        "tgi",
        description="The client Chat generates with: tgi (TGI's /generate_stream, the "
        "default) or openai (the `openai` client: vLLM, llama.cpp, Ollama, TGI's /v1, "
        "hosted APIs, the injection host's /v1).",
    )
    llm_model: str = Field(
        "google/gemma-3-270m",
        min_length=1,
        description="llm_backend openai: the model name sent with every request (the "
        "injection host serves one model and accepts any name).",
    )
    llm_api_key: SecretStr = Field(
        SecretStr(""),
        description="llm_backend openai: the API key sent as a bearer token (set it from a "
        "secret; never logged). Empty: none, for local servers.",
    )
    llm_api_style: Literal["completions", "chat"] = Field(
        "completions",
        description="llm_backend openai: completions posts the prompt Hippo built, as is, "
        "to /v1/completions (base models, vLLM, llama.cpp, TGI); chat splits it into its "
        "turns and posts /v1/chat/completions (servers that only take messages, hosted "
        "APIs). Chat's reply stops before a matched stop sequence with either.",
    )
    llm_max_concurrency: int = Field(
        16,
        ge=1,
        le=1024,
        description="llm_backend openai: most Chat generations in flight per replica; "
        "more wait for a slot within their deadline.",
    )
    llm_timeout_seconds: float = Field(
        120.0,
        gt=0,
        description="Longest a Chat reply may take to generate (the caller's deadline, when "
        "shorter, wins). On 2 CPU cores the local 270M model writes 7-8 tokens/s.",
    )
    default_token_budget: int = Field(
        2048,
        ge=256,
        le=131072,
        description="Prompt budget of BuildContext and Chat when the request gives none.",
    )
    system_prompt: str = Field(
        INSTRUCTIONS,
        min_length=1,
        description="The system instructions at the top of every built prompt. Keep the "
        "rule that text inside <memory> tags is data, not instructions.",
    )
    data_dir: str = Field(
        "var/gateway",
        description="Embedded mode (no database.url): where the gateway keeps its audit "
        "spool (audit-spool.sqlite3) and the audit fingerprint key. Losing it loses audit "
        "events not yet delivered. Unused in cluster mode.",
    )
    database: DatabaseSettings = Field(
        default_factory=DatabaseSettings,
        description="Cluster mode: a PostgreSQL URL keeps the audit spool and the generated "
        "fingerprint key in the gateway's schema (hippo_gateway), shared by every replica; "
        "a replica's undelivered events are delivered by another if it stops. Empty: the "
        "SQLite spool under data_dir (the embedded default).",
    )
    audit_addr: str = Field(
        "127.0.0.1:50056",
        description="The audit service. Empty: no audit log in this deployment (nothing is "
        "recorded; the audit RPCs answer UNIMPLEMENTED).",
    )
    audit_fail_closed: bool = Field(
        False,
        description="false: audit events go to the durable spool (fsynced locally, or "
        "committed in PostgreSQL in cluster mode) and are delivered in the background, so an "
        "audit outage delays records but not calls. true: a call fails UNAVAILABLE unless "
        "its event is in the audit log first (Remember records before it writes, reads "
        "before they answer; Forget is never refused).",
    )
    audit_seq_wait_seconds: float = Field(
        0.5,
        ge=0,
        le=10,
        description="How long BuildContext and Chat wait for their audit entry to be "
        "delivered so they can return its seq; after that they answer with audit_seq 0 and "
        "the entry follows from the spool.",
    )
    audit_fingerprint_key: SecretStr = Field(
        SecretStr(""),
        description="Base64 of the secret that keys query fingerprints in the audit log "
        "(HMAC-SHA256) and, derived from it, the key that seals private bodies in the "
        "audit spool (AES-GCM). Empty: generated on first start and kept in "
        "<data_dir>/audit-fingerprint.key, or in cluster mode in the gateway's PostgreSQL "
        "schema, where every replica reads the same one (and whoever reads that schema "
        "can read the key: set it from a secret to keep it out of the database).",
    )
    query_spelling: Literal["off", "vector", "all", "words"] = Field(
        "words",
        description="Repair typing slips in Recall queries: a word of 4+ letters that an "
        "English word list does not hold becomes the most frequent listed word one edit "
        "away. The embedded text is always the repaired one; BM25 and the speaker step "
        "search, with words: each typed word that some turn of the user holds as typed, "
        "the repair of one that none does; all: the repaired words; vector: the words as "
        "typed (BM25 repairs them against its own index). off: no repair. English only: "
        "turn it off when users write in another language (docs/recall.md).",
    )
    peer_wait_seconds: float = Field(
        120.0,
        gt=0,
        description="At start, how long to wait for the embedding service to answer Info "
        "before giving up (the gateway is NOT_SERVING meanwhile).",
    )
