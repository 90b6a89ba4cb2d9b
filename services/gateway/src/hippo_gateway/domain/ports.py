"""What the gateway needs from its peers. The adapters speak gRPC; tests may use doubles."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any, Protocol

from hippo_gateway.domain.models import (
    ChatMessage,
    Counted,
    Generation,
    InfluencePlan,
    Memory,
    Piece,
    Recalled,
    RecallQuery,
    SessionState,
    SessionTurn,
    TurnToStore,
    Vectors,
)


class Embedder(Protocol):
    async def embed(self, texts: Sequence[str]) -> Vectors:
        """Unit vectors for the texts, in order. Texts longer than the model reads are
        cut by the adapter (the model would ignore the rest anyway)."""
        ...


class TurnStore(Protocol):
    async def write(
        self, tenant: str, turns: Sequence[TurnToStore], wait_searchable: bool = False
    ) -> list[tuple[Memory, bool]]:
        """Store all turns or none; (stored memory, created now) per turn, in order.
        `wait_searchable`: return only once they are searchable in both indexes."""
        ...

    async def search(self, tenant: str, query: RecallQuery, vector: Vectors | None) -> Recalled: ...

    async def get(self, tenant: str, user: str, memory_ids: Sequence[str]) -> list[Memory]:
        """The user's memories with these ids, in the order asked; absent ones skipped."""
        ...

    async def delete(
        self, tenant: str, user: str, session: str | None, memory_ids: Sequence[str]
    ) -> list[str]:
        """Erase durably; returns the ids erased (absent ones are skipped)."""
        ...


class Sessions(Protocol):
    """Bounded session state (the summariser service)."""

    async def append(
        self, tenant: str, user: str, session: str, turns: Sequence[SessionTurn]
    ) -> None:
        """Add turns to the session's window; ids already there are skipped."""
        ...

    async def get(self, tenant: str, user: str, session: str) -> SessionState: ...

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
