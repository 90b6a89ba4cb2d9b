"""The memory use cases: Remember, Recall, Forget, UpdateMemoryMetadata.

Remember assigns each turn its id (deterministic when the caller gave a client id or an
idempotency key, so a retry has exactly one effect), embeds the turns, and writes them
through the turn store in one call: all are stored or none. Recall embeds the query
(unless lexical) and searches inside the caller's tenant and scope. Forget erases in the
turn store, which removes from both indexes.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from hippo_core.embedding import SPEAKER, vector_text
from hippo_core.errors import InvalidArgument, NotFound
from hippo_gateway import metrics
from hippo_gateway.domain import audit_events, ids, validation
from hippo_gateway.domain.audit_recorder import AuditRecorder
from hippo_gateway.domain.models import (
    Embedding,
    Forgotten,
    Memory,
    Mode,
    Recalled,
    RecallQuery,
    Remembered,
    SessionState,
    SessionTurn,
    TurnIn,
    TurnToStore,
)
from hippo_gateway.domain.ports import Embedder, EmbeddingCaches, Memtoks, Sessions, TurnStore
from hippo_gateway.domain.quota import Quotas


def now_us() -> int:
    return time.time_ns() // 1000


@dataclass(frozen=True)
class QuerySpelling:
    """How Recall queries are repaired. `spell` maps the typed text to the repaired text,
    which is what is embedded, and the repairs it made (typed word -> repair). What BM25
    and the speaker step search, by `lexical`:
    - "words": the typed text with the repairs beside it; the retrieval service searches
      a typed word as typed where some turn of the user holds it, else its repair;
    - "repaired": the repaired text;
    - "typed": the text as typed (BM25 repairs it against its own index)."""

    spell: Callable[[str], tuple[str, Mapping[str, str]]]
    lexical: Literal["words", "repaired", "typed"] = "words"


@dataclass(frozen=True)
class ForgetTarget:
    """What to erase. `kind` is explicit on purpose: an empty id list must be refused, never
    read as "everything of the user"."""

    kind: Literal["memories", "session", "user"]
    user: str
    session: str | None = None
    memory_ids: Sequence[str] = ()


class MemoryService:
    def __init__(
        self,
        embedder: Embedder,
        store: TurnStore,
        clock: Callable[[], int] = now_us,
        sessions: Sessions | None = None,
        audit: AuditRecorder | None = None,
        memtoks: Memtoks | None = None,
        quotas: Quotas | None = None,
        caches: EmbeddingCaches | None = None,
        spelling: QuerySpelling | None = None,
    ) -> None:
        self._embedder = embedder
        # Typing slips repaired in Recall queries (domain/spelling.py); None = as typed.
        self._spelling = spelling
        # The embedding service's vector caches, emptied on Forget; None = none to empty.
        self._caches = caches
        # Per-tenant stored-turn quotas (domain/quota.py); None = unlimited.
        self._quotas = quotas
        # The memtok store (injection); None = no influence pipeline in this deployment.
        self._memtoks = memtoks
        self._store = store
        self._clock = clock
        # The session window (summariser); None = no bounded sessions in this deployment.
        self._sessions = sessions
        # The audit log (domain/audit_recorder.py); None = nothing is recorded in this deployment.
        self._audit = audit

    async def admit_turns(self, tenant: str, count: int) -> None:
        """Raise ResourceExhausted if storing `count` more turns would exceed the
        tenant's stored-turn quota (Chat asks before it generates, not after)."""
        if self._quotas is not None:
            await self._quotas.admit_turns(tenant, count)

    async def remember(
        self,
        tenant: str,
        user: str,
        session: str,
        turns: Sequence[TurnIn],
        idempotency_key: str = "",
        wait_searchable: bool = False,
    ) -> Remembered:
        validation.check_remember(user, session, turns, idempotency_key)
        if self._quotas is not None:
            # Before the first write: a refused Remember stores nothing.
            await self._quotas.admit_turns(tenant, len(turns))
        received = self._clock()  # one time for every turn of the request
        embedding = await self.embed_turns(turns)
        to_store = [
            TurnToStore(
                memory_id=ids.memory_id(
                    tenant,
                    user,
                    session,
                    client_id=turn.client_id,
                    idempotency_key=idempotency_key,
                    position=i,
                ),
                user=user,
                session=session,
                role=turn.role,
                text=turn.text,
                time_us=received if turn.time_us is None else turn.time_us,
                client_id=turn.client_id,
                metadata=dict(turn.metadata),
                vector=embedding.vectors[i],
                vector_model=embedding.model,
            )
            for i, turn in enumerate(turns)
        ]
        return await self.store(tenant, user, session, to_store, wait_searchable)

    async def store(
        self,
        tenant: str,
        user: str,
        session: str,
        to_store: Sequence[TurnToStore],
        wait_searchable: bool = False,
    ) -> Remembered:
        """Write validated, embedded turns of one session (all or none), then the
        session window: the one write path of Remember and ImportTurns."""
        stored = await self._audited_write(tenant, user, session, to_store, wait_searchable)
        if self._sessions is not None:
            # After the turn store (the source of truth): if this fails the call fails
            # UNAVAILABLE, and a retry with the same ids completes it without duplicates.
            await self._sessions.append(tenant, user, session, [session_turn(m) for m, _ in stored])
        created = sum(1 for _, new in stored if new)
        if self._quotas is not None:
            self._quotas.stored(tenant, created)
        metrics.TURNS.labels("created").inc(created)
        metrics.TURNS.labels("deduplicated").inc(len(stored) - created)
        return Remembered([m.memory_id for m, _ in stored], created, len(stored) - created)

    async def embed_turns(self, turns: Sequence[TurnIn]) -> Embedding:
        """The turns' vectors (of their text in context: speaker and attachment)."""
        return await self._embedder.embed([vector_text(t.text, t.metadata) for t in turns])

    async def recall(self, tenant: str, query: RecallQuery, *, audited: bool = True) -> Recalled:
        """`audited=False` for callers that record the recall in their own entry
        (BuildContext's "context" entry holds the hits it used and skipped)."""
        validation.check_recall(query)
        with metrics.RECALL_SECONDS.labels(query.mode.value).time():
            vector, model = None, ""
            text, searched = query.query, query
            repairs: Mapping[str, str] = {}
            if self._spelling is not None:
                text, repairs = self._spelling.spell(query.query)
                if repairs and self._spelling.lexical == "words":
                    searched = replace(query, repairs=tuple(sorted(repairs.items())))
                elif repairs and self._spelling.lexical == "repaired":
                    searched = replace(query, query=text)
            if query.mode != Mode.LEXICAL:
                embedding = await self._embedder.embed([text])
                vector, model = embedding.vectors[0], embedding.model
            # The audit entry fingerprints the query as the caller typed it.
            result = await self._store.search(tenant, searched, vector, model)
            if repairs:
                result = replace(result, query_repairs=dict(repairs))
        metrics.RECALL_HITS.labels(query.mode.value).observe(len(result.hits))
        if audited and self._audit is not None:
            await self._audit.recalled(tenant, query, result)
        return result

    async def forget(self, tenant: str, target: ForgetTarget) -> Forgotten:
        if target.kind == "memories":
            validation.check_forget_ids(target.user, target.session, target.memory_ids)
        elif target.kind == "session":
            validation.check_id("session.user_id", target.user)
            validation.check_id("session.session_id", target.session or "")
        else:
            validation.check_id("user_id", target.user)
            if target.session is not None or target.memory_ids:
                raise ValueError("a user target carries no session or ids")
        erased = await self._store.delete(
            tenant, target.user, target.session, list(target.memory_ids)
        )
        metrics.FORGOTTEN.inc(len(erased))
        if self._quotas is not None:
            self._quotas.stored(tenant, -len(erased))
        sessions = 0
        if self._sessions is not None:
            # The windows and summaries too: a summary built from erased text goes whole.
            sessions = await self._sessions.forget(
                tenant, target.user, target.session, list(target.memory_ids)
            )
        memtoks = 0
        if self._memtoks is not None and target.kind == "user":
            # The user's words in the memtok store (a memtok merges words of many turns:
            # it goes with the user, not with one session or turn).
            memtoks = await self._memtoks.forget_user(tenant, target.user)
        # Cached vectors are keyed by text alone, so every replica's cache goes whole
        # (after the stores: a Recall racing this Forget re-caches nothing it can find).
        dropped = await self._caches.drop() if self._caches is not None else 0
        key_destroyed = False
        if self._audit is not None:
            key_destroyed = await self._audit.forgotten(
                tenant,
                target.kind,
                target.user,
                target.session,
                target.memory_ids,
                erased,
                sessions,
                memtoks,
            )
        return Forgotten(
            memories=len(erased),
            sessions=sessions,
            memtoks=memtoks,
            cache_entries=dropped,
            audit_key_destroyed=key_destroyed,
        )

    async def update_metadata(
        self,
        tenant: str,
        user: str,
        memory_id: str,
        set_: Mapping[str, str],
        remove: Sequence[str],
    ) -> tuple[Memory, int]:
        """Change one memory's metadata (never its text), audited; the memory as stored
        and the seq of the `metadata` entry (0: spooled, not yet delivered). A change of
        what is embedded with the text (speaker, attachment) re-embeds the turn, so
        vector search sees the memory as a new Remember of it would."""
        validation.check_metadata_update(user, memory_id, set_, remove)
        found = await self._store.get(tenant, user, [memory_id])
        if not found:
            raise NotFound(
                f"memory_id: no memory {memory_id!r} for this user", reason="MEMORY_NOT_FOUND"
            )
        current = found[0]
        merged = {k: v for k, v in current.metadata.items() if k not in remove}
        merged.update(set_)
        if len(merged) > validation.MAX_METADATA:
            raise InvalidArgument(
                "set",
                f"the memory would hold {len(merged)} metadata entries, "
                f"at most {validation.MAX_METADATA}",
            )
        vector, model = None, ""
        if vector_text(current.text, merged) != vector_text(current.text, current.metadata):
            embedding = await self._embedder.embed([vector_text(current.text, merged)])
            vector, model = embedding.vectors[0], embedding.model

        def write() -> Awaitable[tuple[Memory, bool]]:
            return self._store.update_metadata(tenant, user, memory_id, set_, remove, vector, model)

        if merged == dict(current.metadata):
            return current, 0  # nothing to change, nothing to record
        if self._audit is None:
            return (await write())[0], 0
        event = audit_events.metadata_event(tenant, current, set_, remove, vector is not None)
        (updated, _), seq = await self._audit.writing(event, write, wait=True)
        return updated, seq

    async def get(self, tenant: str, user: str, memory_ids: Sequence[str]) -> list[Memory]:
        return await self._store.get(tenant, user, memory_ids) if memory_ids else []

    async def session_view(
        self, tenant: str, user: str, session: str
    ) -> tuple[SessionState, list[Memory]]:
        """A session's bounded state and the stored records of its window (GetSession)."""
        validation.check_id("scope.user_id", user)
        validation.check_id("scope.session_id", session)
        if self._sessions is None:
            return SessionState([], "", 0), []
        state = await self._sessions.get(tenant, user, session)
        records = await self.get(tenant, user, [t.memory_id for t in state.window])
        return state, records

    async def _audited_write(
        self,
        tenant: str,
        user: str,
        session: str,
        to_store: Sequence[TurnToStore],
        wait_searchable: bool,
    ) -> list[tuple[Memory, bool]]:
        def write() -> Awaitable[list[tuple[Memory, bool]]]:
            return self._store.write(tenant, to_store, wait_searchable)

        if self._audit is None:
            return await write()
        memory_ids = [t.memory_id for t in to_store]
        event = audit_events.remember_event(tenant, user, session, memory_ids, len(to_store))
        return await self._audit.remembering(event, write)


def session_turn(m: Memory) -> SessionTurn:
    return SessionTurn(m.memory_id, m.role, m.text, m.time_us, m.metadata.get(SPEAKER, ""))
