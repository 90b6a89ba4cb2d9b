"""The gateway's audit spool: the core outbox (`hippo_core.outbox`) over the spool's store
(adapters/spool_store.py), delivering through the recorder (domain/audit_recorder.py).

What the gateway adds to the core outbox: each item is stamped with its caller's trace
(the delivery, later and batched, rejoins the call's trace), and once a user's key
erasure is delivered the store is scrubbed of what the user's delivered items left; and
private bodies are sealed in the store (`Sealer`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import logging
import os
from collections.abc import Sequence
from dataclasses import replace
from typing import Any

from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from hippo_core import outbox, tracing
from hippo_gateway.adapters.spool_store import Scrub
from hippo_gateway.domain.audit_events import AuditEvent, AuditItem, EraseUser, Json
from hippo_gateway.domain.ports import Deliver, OnBuried, OnDelivered, OpenOutbox

log = logging.getLogger(__name__)

NAME = "gateway_audit"  # the outbox label of the hippo_outbox_* metrics


class Sealer:
    """Private bodies are sealed in the spool (AES-256-GCM, bound to their event id), so
    the words of a note or a memtok never reach the spool's file, its WAL, PostgreSQL's
    WAL or a backup in plain text; the audit service gets them opened and seals them
    under the user's own key. The key is derived (HKDF) from the gateway's secret
    (`audit_fingerprint_key`: configured from a Secret, else generated once, see
    adapters/fingerprint_key.py), so every replica can open what any replica spooled."""

    INFO = b"hippo gateway audit spool seal v1"

    def __init__(self, secret: bytes) -> None:
        key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=self.INFO).derive(secret)
        self._aead = AESGCM(key)

    def seal(self, private: Json, event_id: str) -> str:
        nonce = os.urandom(12)
        plain = json.dumps(private, sort_keys=True).encode()
        return base64.b64encode(
            nonce + self._aead.encrypt(nonce, plain, event_id.encode())
        ).decode()

    def open(self, sealed: str, event_id: str) -> Json:
        raw = base64.b64decode(sealed)
        opened: Json = json.loads(self._aead.decrypt(raw[:12], raw[12:], event_id.encode()))
        return opened


def dump(item: AuditItem, sealer: Sealer | None = None) -> str:
    if isinstance(item, EraseUser):
        return json.dumps({"erase": item.__dict__}, sort_keys=True)
    fields = {**item.__dict__, "memory_ids": list(item.memory_ids)}
    if sealer is not None and item.private is not None:
        fields["private"] = None
        fields["private_sealed"] = sealer.seal(item.private, item.event_id)
    return json.dumps({"event": fields}, sort_keys=True)


def load(text: str, sealer: Sealer | None = None) -> AuditItem:
    raw: dict[str, Any] = json.loads(text)
    if "erase" in raw:
        return EraseUser(**raw["erase"])
    fields = raw["event"]
    sealed = fields.pop("private_sealed", None)
    if sealed is not None:
        if sealer is None:
            raise ValueError("a sealed spool item, and no key to open it")
        fields["private"] = sealer.open(sealed, fields["event_id"])
    return AuditEvent(**{**fields, "memory_ids": tuple(fields["memory_ids"])})


class AuditSpool(outbox.Outbox[AuditItem]):
    """`AuditOutbox`: the core outbox, plus trace stamps and the scrub after an erasure."""

    def __init__(
        self,
        store: outbox.OutboxStore,
        *,
        deliver: Deliver,
        on_delivered: OnDelivered,
        on_buried: OnBuried,
        config: outbox.DrainConfig | None = None,
        scrub: Scrub | None = None,
        sealer: Sealer | None = None,
    ) -> None:
        super().__init__(
            NAME,
            store,
            deliver=deliver,
            encode=lambda item: dump(item, sealer),
            decode=lambda text: load(text, sealer),
            config=config,
            on_delivered=self._delivered,
            on_buried=on_buried,
        )
        self._owner_delivered = on_delivered
        self._scrub = scrub
        self._scrub_wanted = False
        self._scrubbing: asyncio.Task[None] | None = None

    async def put(self, items: Sequence[AuditItem]) -> None:
        # The caller's span, taken here on the caller's path: the commit runs in another
        # task, shared by concurrent callers, and the delivery later still.
        origin = tracing.traceparent()
        if origin:
            items = [i if i.trace_parent else replace(i, trace_parent=origin) for i in items]
        await super().put(items)

    async def close(self) -> None:
        if self._scrubbing is not None:
            await asyncio.gather(self._scrubbing, return_exceptions=True)
        await super().close()

    def _delivered(self, item: AuditItem, seq: Any) -> None:
        self._owner_delivered(item, seq)
        if isinstance(item, EraseUser) and self._scrub is not None:
            # The user's items spooled before the erasure were delivered (and deleted)
            # before it: scrub now, off the drainer's path; erasures meanwhile coalesce.
            self._scrub_wanted = True
            if self._scrubbing is None or self._scrubbing.done():
                self._scrubbing = asyncio.get_running_loop().create_task(self._scrub_all())

    async def _scrub_all(self) -> None:
        assert self._scrub is not None
        while self._scrub_wanted:
            self._scrub_wanted = False
            try:
                await asyncio.to_thread(self._scrub)
            except Exception:  # the erasure is done; this is hygiene, retried next time
                log.warning("audit spool: scrub after an erasure failed", exc_info=True)


def opener(
    store: outbox.OutboxStore,
    config: outbox.DrainConfig | None = None,
    scrub: Scrub | None = None,
    seal_key: bytes | None = None,
) -> OpenOutbox:
    """How the recorder opens its spool over `store` (inside the running loop); with
    `seal_key` (the gateway's secret), private bodies are sealed in the store."""
    sealer = Sealer(seal_key) if seal_key is not None else None

    def open_spool(deliver: Deliver, delivered: OnDelivered, buried: OnBuried) -> AuditSpool:
        return AuditSpool(
            store,
            deliver=deliver,
            on_delivered=delivered,
            on_buried=buried,
            config=config,
            scrub=scrub,
            sealer=sealer,
        )

    return open_spool
