"""Shared by the audit tests: a real log over real files in a folder, and entries."""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path

from hippo_audit.adapters.keys import SqliteKeyRing
from hippo_audit.adapters.signing import Ed25519Signer
from hippo_audit.adapters.sqlite_log import SqliteLog
from hippo_audit.adapters.witness import FileWitness
from hippo_audit.domain.log import AuditLog, LogConfig
from hippo_audit.domain.models import NewEntry, Verdict

FILES = ("audit.sqlite3", "keys.sqlite3", "witness.log", "checkpoint.key")


def make_log(folder: Path, *, checkpoint_every: int = 1000, interval: float = 3600.0) -> AuditLog:
    """An AuditLog over `folder`, laid out as the service lays out its data dir (not opened)."""
    return AuditLog(
        SqliteLog(folder / "audit.sqlite3"),
        SqliteKeyRing(folder / "keys.sqlite3"),
        Ed25519Signer.load("", folder / "checkpoint.key"),
        FileWitness(folder / "witness.log"),
        LogConfig(checkpoint_every=checkpoint_every, checkpoint_interval_seconds=interval),
    )


def copy_log(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for name in FILES:
        if (source / name).exists():
            shutil.copy2(source / name, target / name)


def entry(
    tenant: str = "acme",
    user: str = "alice",
    *,
    session: str = "s1",
    event_type: str = "recall",
    private: dict[str, object] | None = None,
    key: str = "",
) -> NewEntry:
    """A plausible gateway entry; its body carries a unique nonce, so no two bodies match."""
    nonce = uuid.uuid4().hex
    return NewEntry(
        tenant=tenant,
        actor="gateway",
        event_type=event_type,
        user=user,
        session=session,
        memory_ids=(f"m-{nonce[:8]}", f"m-{nonce[8:16]}"),
        body={"nonce": nonce, "candidates": 7, "hits": [{"rank": 1, "fused_score": 0.41}]},
        private=private,
        idempotency_key=key,
    )


def verify_folder(folder: Path, *, chain_only: bool = False) -> Verdict:
    """Verify the log in `folder` as it is on disk, without opening it for writes (a log
    that fails its checkpoints must still be verifiable)."""
    store = SqliteLog(folder / "audit.sqlite3")
    keys = SqliteKeyRing(folder / "keys.sqlite3")
    try:
        log = AuditLog(
            store,
            keys,
            Ed25519Signer.load("", folder / "checkpoint.key"),
            FileWitness(folder / "witness.log"),
        )
        return log.verify_now(chain_only=chain_only)
    finally:
        store.close()
        keys.close()
