"""Settings of the audit service (environment prefix `HIPPO_AUDIT_`)."""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import SettingsConfigDict

from hippo_core.settings import DatabaseSettings, ServiceSettings


class AuditSettings(ServiceSettings):
    model_config = SettingsConfigDict(env_prefix="HIPPO_AUDIT_")

    port: int = Field(50056, ge=0, le=65535, description="gRPC port (0 picks a free one).")
    metrics_port: int = Field(
        9106, ge=0, le=65535, description="Prometheus /metrics HTTP port (0 picks a free one)."
    )
    database: DatabaseSettings = Field(
        default_factory=DatabaseSettings,
        description="The log's store. Empty url: SQLite files under data_dir (one "
        "replica). A PostgreSQL url: cluster mode, every replica appends to one chain in "
        "schema hippo_audit (entries, checkpoints and per-user keys); needs signing_key.",
    )
    data_dir: str = Field(
        "var/audit",
        description="Where the log (audit.sqlite3), and by default the witness file, the "
        "per-user keys and the signing key live (SQLite mode; unused in cluster mode). "
        "Losing audit.sqlite3 loses the log.",
    )
    witness_path: str = Field(
        "",
        description="The witness file of signed checkpoints. Empty: <data_dir>/witness.log. "
        "Put it where whoever could rewrite the log cannot (another volume, or ship it off "
        "the machine): it is what exposes truncation and rollback.",
    )
    keys_path: str = Field(
        "",
        description="The per-user encryption keys (SQLite). Empty: <data_dir>/keys.sqlite3. "
        "Keep it out of the log's backups: a restored copy of the keys undoes erasures.",
    )
    signing_key: SecretStr = Field(
        SecretStr(""),
        description="Base64 of the 32-byte Ed25519 private key that signs checkpoints. "
        "Empty: <data_dir>/checkpoint.key, generated on first start (the local default; "
        "refused in cluster mode, where every replica must sign with this one key: give "
        "it from a secret). Changing the key makes earlier checkpoints fail Verify: keep "
        "it for the log's life.",
    )
    checkpoint_every: int = Field(
        1000,
        ge=1,
        description="Sign a checkpoint once this many entries were appended since the last. "
        "Entries after the latest checkpoint are not protected against truncation.",
    )
    checkpoint_interval_seconds: float = Field(
        60.0,
        gt=0,
        description="Also sign a checkpoint this often when entries were appended since the "
        "last (and always at shutdown): bounds how long a new entry stays unprotected.",
    )
    max_append_entries: int = Field(
        1000, ge=1, le=100_000, description="Most entries one Append may carry."
    )
    max_batch_entries: int = Field(
        4096,
        ge=1,
        description="Most entries one group commit (one transaction, one fsync) holds.",
    )
    start_verify_entries: int = Field(
        1_000_000,
        ge=0,
        description="At start, recompute the hash chain of this many of the newest entries "
        "(about 1 s per 100,000) and refuse writes if it is broken (an entry edited in "
        "place). 0: only the checkpoints are checked at start. Older entries are checked "
        "by hippo audit verify.",
    )
    max_body_bytes: int = Field(
        64 * 1024,
        ge=1024,
        description="Largest body or private_body of an entry, as canonical JSON bytes.",
    )

    @property
    def cluster(self) -> bool:
        """Cluster mode: the log is in PostgreSQL, shared by every replica."""
        return bool(self.database.url.get_secret_value())

    def log_path(self) -> Path:
        return Path(self.data_dir) / "audit.sqlite3"

    def witness_file(self) -> Path:
        return Path(self.witness_path) if self.witness_path else Path(self.data_dir) / "witness.log"

    def keys_file(self) -> Path:
        return Path(self.keys_path) if self.keys_path else Path(self.data_dir) / "keys.sqlite3"

    def signing_key_file(self) -> Path:
        return Path(self.data_dir) / "checkpoint.key"
