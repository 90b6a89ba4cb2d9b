"""Recording merges in the audit log: what an entry holds, and how an event travels.

Every committed merge becomes one "merge" entry (session, merged memory ids, facts
checked/kept before and after validation, retention, LLM calls, repair, summary tokens,
seconds), written by this code, never by a model. The entry holds ids and figures, never
summary or turn text (the audit log's public body outlives a user's erasure).

Delivery is the shared transactional outbox (`hippo_core.outbox`), at least once into an
idempotent log, in order:
- the event is queued in the session store's `audit_outbox` table by the merge's own
  transaction (`SessionStore.commit_merge(event=...)`), so a merge is never committed
  unrecorded and a crash at any point loses no event;
- the core drainer (`Outbox`, named `summariser_audit`) delivers the table oldest first,
  in batches, through `deliverer(sink)`, each event under its `event_id` as idempotency
  key (a delivery whose reply was lost appends it once); in cluster mode each replica
  drains the rows it wrote, and adopts those of a replica that stopped;
- while the audit service is down or busy the table grows and the drainer backs off
  (capped, jittered); merges go on. An event the service refuses for good
  (INVALID_ARGUMENT: a bug) is set aside in the table with the reason, never dropped.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

from hippo_summariser.domain.models import MergeEvent, SessionKey

ACTOR = "summariser"
EVENT_TYPE = "merge"
MAX_IDS = 1000  # the audit service's limit on memory ids per entry
OUTBOX = "summariser_audit"  # the drainer's name: hippo_outbox_*{outbox="summariser_audit"}
TABLE = "audit_outbox"  # in the session store, written by the merge's transaction


class AuditSink(Protocol):
    """The audit service, as the summariser uses it."""

    async def append(self, events: Sequence[MergeEvent]) -> None:
        """Append all, in order, or raise (HippoError). Idempotent per event_id."""
        ...


class AuditQueue(Protocol):
    """The drainer of the outbox, told when a commit queued an event."""

    def notify(self) -> None: ...


def body(event: MergeEvent) -> dict[str, object]:
    """The entry's public body: figures only (see the module docstring)."""
    return {
        "version": event.version,
        "turns_merged": len(event.merged_memory_ids),
        "ids_listed": min(len(event.merged_memory_ids), MAX_IDS),
        "summary_tokens": event.summary_tokens,
        "facts": event.facts,
        "kept_llm": event.kept_llm,
        "kept": event.kept,
        "retention_llm": round(event.retention_llm, 4),
        "retention": round(event.retention, 4),
        "llm_calls": event.llm_calls,
        "repaired": event.repaired,
        "seconds": round(event.seconds, 3),
        "merged_at_us": event.time_us,
    }


def encode(event: MergeEvent) -> str:
    """An event as the outbox stores it. The format of schema 2's `event` column: events
    an older build queued are delivered by this one."""
    fields = dataclasses.asdict(event)
    fields["key"] = [event.key.tenant, event.key.user, event.key.session]
    fields["merged_memory_ids"] = list(event.merged_memory_ids)
    return json.dumps(fields, sort_keys=True)


def decode(text: str) -> MergeEvent:
    fields: dict[str, Any] = json.loads(text)
    tenant, user, session = fields.pop("key")
    ids = tuple(fields.pop("merged_memory_ids"))
    return MergeEvent(key=SessionKey(tenant, user, session), merged_memory_ids=ids, **fields)


def deliverer(sink: AuditSink) -> Callable[[Sequence[MergeEvent]], Awaitable[list[None]]]:
    """The outbox's `deliver`: the whole batch or an error (the sink has no partial
    answer), one result per event."""

    async def deliver(events: Sequence[MergeEvent]) -> list[None]:
        await sink.append(events)
        return [None] * len(events)

    return deliver
