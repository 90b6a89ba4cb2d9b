"""Wiring only: settings -> stores, keys, signer, witness -> the log -> serve()."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc

from hippo.audit.v1 import audit_pb2, audit_pb2_grpc
from hippo_audit.adapters.signing import Ed25519Signer
from hippo_audit.adapters.sqlite_keys import SqliteKeyRing
from hippo_audit.adapters.sqlite_log import SqliteLog
from hippo_audit.adapters.witness import FileWitness
from hippo_audit.domain.log import AuditLog, LogConfig
from hippo_audit.domain.validation import Limits
from hippo_audit.servicer import AuditServicer
from hippo_audit.settings import AuditSettings
from hippo_core.errors import FailedPrecondition
from hippo_core.server.app import Service, run
from hippo_core.server.authz import OPERATOR, callers

if TYPE_CHECKING:
    from hippo_core.postgres import Database

FULL_NAME = audit_pb2.DESCRIPTOR.services_by_name["AuditService"].full_name
# Who may call each RPC when TLS is on (docs/security.md has the whole table): entries
# come from the gateway and the summariser only, key erasure from the gateway's Forget;
# the operator's `hippo audit verify|tail` reads.
CALLERS = callers(
    FULL_NAME,
    {
        "Append": {"gateway", "summariser"},
        "Head": {OPERATOR},
        "Read": {"gateway"},
        "Stream": {OPERATOR},
        "Verify": {"gateway", OPERATOR},
        "ForgetUser": {"gateway"},
    },
)


@dataclass
class Opened:
    log: AuditLog
    database: Database | None  # cluster mode: closed after the log


def check(settings: AuditSettings) -> None:
    """Refuse settings that would break the log's guarantees, before anything starts."""
    if settings.cluster and not settings.signing_key.get_secret_value():
        raise FailedPrecondition(
            "HIPPO_AUDIT_SIGNING_KEY (signing_key) must be set in cluster mode "
            "(HIPPO_AUDIT_DATABASE__URL is set): every replica signs checkpoints of the "
            "one shared log, so all must use the same key; a key generated per pod would "
            "make the other replicas' checkpoints fail Verify. Give the base64 of a "
            "32-byte Ed25519 private key from a secret."
        )


def open_log(settings: AuditSettings) -> Opened:
    """The log over its stores, opened and checked against the witness (blocking)."""
    check(settings)
    signer = Ed25519Signer.load(
        settings.signing_key.get_secret_value(), settings.signing_key_file()
    )
    config = LogConfig(
        checkpoint_every=settings.checkpoint_every,
        checkpoint_interval_seconds=settings.checkpoint_interval_seconds,
        max_batch_entries=settings.max_batch_entries,
        limits=Limits(settings.max_append_entries, settings.max_body_bytes),
        start_verify_entries=settings.start_verify_entries,
    )
    if not settings.cluster:
        log = AuditLog(
            SqliteLog(settings.log_path()),
            SqliteKeyRing(settings.keys_file()),
            signer,
            FileWitness(settings.witness_file()),
            config,
        )
        log.open()
        return Opened(log, None)
    # Cluster mode only: psycopg and the PostgreSQL adapters load on demand.
    from hippo_audit.adapters.postgres_keys import PostgresKeyRing
    from hippo_audit.adapters.postgres_log import PostgresLog
    from hippo_audit.adapters.postgres_schema import MIGRATIONS, SCHEMA
    from hippo_audit.adapters.postgres_witness import PostgresWitness
    from hippo_core.postgres import Database

    database = Database(settings.database, schema=SCHEMA, application="hippo-audit")
    try:
        database.open(MIGRATIONS)
        log = AuditLog(
            PostgresLog(database),
            PostgresKeyRing(database),
            signer,
            PostgresWitness(database),
            config,
        )
        log.open()
    except BaseException:
        database.close()
        raise
    return Opened(log, database)


def build(settings: AuditSettings) -> Service:
    check(settings)
    servicer = AuditServicer()
    opened: list[Opened] = []

    def register(server: grpc.aio.Server) -> None:
        audit_pb2_grpc.add_AuditServiceServicer_to_server(servicer, server)

    async def warmup() -> None:
        # Off the event loop: opening checks the log against every checkpoint.
        done = await asyncio.to_thread(open_log, settings)
        opened.append(done)
        await done.log.start()
        servicer.log = done.log

    async def close() -> None:
        for done in opened:
            await done.log.close()
            if done.database is not None:
                await asyncio.to_thread(done.database.close)

    return Service("audit", [FULL_NAME], register, warmup, close, callers=CALLERS)


def main() -> None:
    settings = AuditSettings()
    try:
        service = build(settings)
    except FailedPrecondition as exc:
        raise SystemExit(f"audit: {exc.message}") from None
    run(service, settings)


if __name__ == "__main__":
    main()
