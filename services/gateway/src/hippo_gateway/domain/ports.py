"""What the gateway needs from its peers and its audit spool. The adapters speak gRPC
(the spool: the core outbox over SQLite or PostgreSQL); tests may use doubles."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from typing import Any, Protocol

from hippo_gateway.domain.audit_events import (
    AuditEvent,
    AuditItem,
    AuditRecord,
    EraseUser,
    Verification,
)
from hippo_gateway.domain.models import (
    ChatMessage,
    Counted,
    Embedding,
    Generation,
    InfluencePlan,
    ListKey,
    ListQuery,
    Memory,
    Piece,
    Recalled,
    RecallQuery,
    SessionInfo,
    SessionState,
    SessionTurn,
    TurnToStore,
    UserInfo,
    Vectors,
)


class Embedder(Protocol):
    async def embed(self, texts: Sequence[str]) -> Embedding:
        """Unit vectors for the texts, in order, all from one model, and that model's
        name. Texts longer than the model reads are cut by the adapter (the model would
        ignore the rest anyway). Which model is the adapter's choice (the live index's,
        as far as it knows): the turn store re-embeds a vector of another model itself."""
        ...


class EmbeddingCaches(Protocol):
    async def drop(self) -> int:
        """Empty the embedding service's vector cache on every replica (Forget: a cached
        text answers faster and as `cached`, telling that erased text was seen); the
        entries dropped. Raises when a running replica could not be reached in time."""
        ...


class TurnStore(Protocol):
    async def write(
        self, tenant: str, turns: Sequence[TurnToStore], wait_searchable: bool = False
    ) -> list[tuple[Memory, bool]]:
        """Store all turns or none; (stored memory, created now) per turn, in order.
        `wait_searchable`: return only once they are searchable in both indexes."""
        ...

    async def search(
        self, tenant: str, query: RecallQuery, vector: Vectors | None, vector_model: str = ""
    ) -> Recalled:
        """`vector_model`: the model `vector` comes from ("" = the live index's)."""
        ...

    async def get(self, tenant: str, user: str, memory_ids: Sequence[str]) -> list[Memory]:
        """The user's memories with these ids, in the order asked; absent ones skipped."""
        ...

    async def delete(
        self, tenant: str, user: str, session: str | None, memory_ids: Sequence[str]
    ) -> list[str]:
        """Erase durably; returns the ids erased (absent ones are skipped)."""
        ...

    async def update_metadata(
        self,
        tenant: str,
        user: str,
        memory_id: str,
        set_: Mapping[str, str],
        remove: Sequence[str],
        vector: Vectors | None = None,
        vector_model: str = "",
    ) -> tuple[Memory, bool]:
        """Change one memory's metadata (and its vector, given) and re-index it; the
        memory as stored and whether anything changed. NotFound when the user has no
        such memory."""
        ...

    async def list_memories(
        self, tenant: str, query: ListQuery, after: ListKey | None, limit: int
    ) -> tuple[list[Memory], ListKey | None]:
        """A page of the user's memories in the query's order, starting after `after`;
        and the key of its last memory when more follow (None: the last page)."""
        ...

    async def list_sessions(
        self, tenant: str, user: str, after: str, limit: int
    ) -> tuple[list[SessionInfo], str]:
        """A page of the user's sessions by id after `after`; the last id when more follow."""
        ...

    async def list_users(self, tenant: str, after: str, limit: int) -> tuple[list[UserInfo], str]:
        """A page of the tenant's users by id after `after`; the last id when more follow."""
        ...


class Sessions(Protocol):
    """Bounded session state (the summariser service)."""

    async def append(
        self, tenant: str, user: str, session: str, turns: Sequence[SessionTurn]
    ) -> None:
        """Add turns to the session's window; ids already there are skipped."""
        ...

    async def get(self, tenant: str, user: str, session: str) -> SessionState: ...

    async def versions(self, tenant: str, user: str, sessions: Sequence[str]) -> dict[str, int]:
        """The state version of each session that has state (absent: none)."""
        ...

    async def forget(
        self, tenant: str, user: str, session: str | None, memory_ids: Sequence[str]
    ) -> int:
        """Erase memories or whole sessions; returns the sessions erased whole."""
        ...


class Tokenizer(Protocol):
    """The serving model's own tokenizer and prompt format (the LLM host)."""

    async def count(self, messages: Sequence[ChatMessage]) -> Counted:
        """Exact tokens of the messages as the model reads them (format included)."""
        ...

    async def count_text(self, text: str) -> int:
        """Exact tokens of a bare text (no format, no <bos>)."""
        ...

    async def special_tokens(self) -> Sequence[str]:
        """Every string the tokenizer turns into one of its added tokens (control
        tokens first of all), which text in a prompt must never spell."""
        ...


class Llm(Protocol):
    """Text generation (a TGI-compatible endpoint, through the text-generation client)."""

    def stream(self, prompt: str, params: Generation) -> AsyncIterator[Piece]: ...


class Influencer(Protocol):
    """The memtok pipeline of the injection service (issue 8)."""

    async def plan(self, tenant: str, user: str, query: str, mode: str | None) -> InfluencePlan:
        """Run the pipeline for `query`; `mode` None: the user's recorded mode (else off)."""
        ...

    def stream(self, prompt: str, params: Generation, plan: InfluencePlan) -> AsyncIterator[Piece]:
        """Generate from the raw `prompt` with the plan's influences applied."""
        ...

    async def write(
        self, tenant: str, user: str, query: str, reply: str
    ) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
        """Rank and store the query's words, buffer the reply's; the audit entry's public
        body (ids, numbers) and private part (the words)."""
        ...


class Memtoks(Protocol):
    """The injection service's memtok store, as Forget reaches it."""

    async def forget_user(self, tenant: str, user: str) -> int:
        """Erase the user's memtoks (items, buffered reply words, recorded mode); how many
        items. 0 where the deployment has no memtok store. Idempotent."""
        ...


class AuditLog(Protocol):
    """The audit service, as the gateway uses it."""

    async def append(self, events: Sequence[AuditEvent]) -> list[int]:
        """Append in order, all or none; the seq of each (the earlier one for an event_id
        already appended)."""
        ...

    async def erase_user(self, erase: EraseUser) -> int:
        """Destroy the user's keys; the seq of the entry recording it."""
        ...

    async def read(
        self, tenant: str, user: str, session: str, after_seq: int, to_seq: int, limit: int
    ) -> tuple[list[AuditRecord], int]:
        """The user's (or session's) entries after `after_seq`, private bodies decrypted
        where the key exists; and the next after_seq (0 = no more)."""
        ...

    async def verify(self, from_seq: int, to_seq: int, tenant: str = "") -> Verification:
        """The whole chain checked over the range; with `tenant`, that tenant's entries
        in it counted too."""
        ...


class AuditOutbox(Protocol):
    """The durable spool of audit items not yet delivered, and its one drainer
    (`hippo_core.outbox.Outbox`: a SQLite file embedded, the gateway's PostgreSQL schema
    in cluster mode). Items are delivered oldest first through the recorder's `deliver`."""

    @property
    def reachable(self) -> bool:
        """False while deliveries fail."""
        ...

    async def start(self) -> None: ...

    async def put(self, items: Sequence[AuditItem]) -> None:
        """Durable (committed, synced) before it returns; `items` keep their order."""
        ...

    async def drain_now(self) -> None:
        """Deliver everything waiting before returning; raises what delivery raised."""
        ...

    def depth(self) -> int:
        """Items waiting, as last seen (no I/O)."""
        ...

    async def close(self) -> None:
        """Stop delivering; what waits stays for the next start (or another replica)."""
        ...


# What the recorder hands its outbox: how to deliver a batch (results for a prefix of it,
# one per item delivered), and what to do once an item is delivered or refused for good.
Deliver = Callable[[Sequence[AuditItem]], Awaitable[Sequence[int]]]
OnDelivered = Callable[[AuditItem, int], None]
OnBuried = Callable[[AuditItem], None]
OpenOutbox = Callable[[Deliver, OnDelivered, OnBuried], AuditOutbox]
