"""Wiring only: settings -> stores, keys, signer, witness -> the log -> serve()."""

from __future__ import annotations

import asyncio

import grpc

from hippo.audit.v1 import audit_pb2, audit_pb2_grpc
from hippo_audit.adapters.keys import SqliteKeyRing
from hippo_audit.adapters.signing import Ed25519Signer
from hippo_audit.adapters.sqlite_log import SqliteLog
from hippo_audit.adapters.witness import FileWitness
from hippo_audit.domain.log import AuditLog, LogConfig
from hippo_audit.domain.validation import Limits
from hippo_audit.servicer import AuditServicer
from hippo_audit.settings import AuditSettings
from hippo_core.server.app import Service, run

FULL_NAME = audit_pb2.DESCRIPTOR.services_by_name["AuditService"].full_name


def open_log(settings: AuditSettings) -> AuditLog:
    """The log over its files, opened and checked against the witness (blocking)."""
    signer = Ed25519Signer.load(
        settings.signing_key.get_secret_value(), settings.signing_key_file()
    )
    log = AuditLog(
        SqliteLog(settings.log_path()),
        SqliteKeyRing(settings.keys_file()),
        signer,
        FileWitness(settings.witness_file()),
        LogConfig(
            checkpoint_every=settings.checkpoint_every,
            checkpoint_interval_seconds=settings.checkpoint_interval_seconds,
            max_batch_entries=settings.max_batch_entries,
            limits=Limits(settings.max_append_entries, settings.max_body_bytes),
        ),
    )
    log.open()
    return log


def build(settings: AuditSettings) -> Service:
    servicer = AuditServicer()
    opened: list[AuditLog] = []

    def register(server: grpc.aio.Server) -> None:
        audit_pb2_grpc.add_AuditServiceServicer_to_server(servicer, server)

    async def warmup() -> None:
        # Off the event loop: opening checks the log against every checkpoint.
        log = await asyncio.to_thread(open_log, settings)
        opened.append(log)
        await log.start()
        servicer.log = log

    async def close() -> None:
        for log in opened:
            await log.close()

    return Service("audit", [FULL_NAME], register, warmup, close)


def main() -> None:
    settings = AuditSettings()
    run(build(settings), settings)


if __name__ == "__main__":
    main()
