"""Values the retrieval domain works with.

Times are UTC epoch microseconds (int): exact, orderable, and what every store can
index as an integer. Vectors are float32 unit rows (cosine = dot product).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import NamedTuple

import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[np.float32]


class Role(StrEnum):
    USER = "user"
    ASSISTANT = "assistant"
    SYSTEM = "system"
    TOOL = "tool"


class Mode(StrEnum):
    HYBRID = "hybrid"
    LEXICAL = "lexical"
    SEMANTIC = "semantic"


@dataclass(frozen=True)
class EmbeddingModel:
    """An embedding model by name (as the embedding service names it) and vector size.
    Vectors of two models are never compared: each index generation has one."""

    name: str
    dimension: int


@dataclass(frozen=True)
class Scope:
    """Where a read may look. Tenant and user are always required; every store adapter
    applies all of it inside its own query (SQL WHERE, Tantivy term clauses, Qdrant
    `must` filter), never by filtering results afterwards."""

    tenant: str
    user: str
    session: str | None = None
    start_us: int | None = None  # inclusive
    end_us: int | None = None  # exclusive
    roles: frozenset[Role] = frozenset()
    # Metadata equality, all of them: (key, value) pairs, sorted (keys are declared
    # filter keys: validation.check_filter).
    metadata: tuple[tuple[str, str], ...] = ()


def metadata_term(key: str, value: str) -> str:
    """One metadata pair as one exact term, as both indexes store and match it. The key's
    length comes first, so no key or value (any text but NUL) can forge another pair."""
    return f"{len(key)}:{key}={value}"


def metadata_terms(metadata: Mapping[str, str]) -> list[str]:
    return [metadata_term(k, v) for k, v in sorted(metadata.items())]


@dataclass(frozen=True)
class NewTurn:
    """A turn to store; `memory_id` is already deterministic (see ids.py)."""

    memory_id: str
    tenant: str
    user: str
    session: str
    role: Role
    text: str
    time_us: int
    client_id: str = ""
    metadata: Mapping[str, str] = field(default_factory=dict)
    vector: Vector | None = None  # kept in the turn store so indexes rebuild without re-embedding
    vector_model: str = ""  # the embedding model `vector` comes from ("" = the store's legacy one)


@dataclass(frozen=True)
class StoredTurn:
    seq: int  # monotonically increasing per store; the order indexes apply changes in
    memory_id: str
    tenant: str
    user: str
    session: str
    role: Role
    text: str
    time_us: int
    client_id: str
    metadata: Mapping[str, str]
    vector: Vector | None
    position: int = 0  # 1-based place in its session, in arrival order; never reused
    document: str = ""  # what BM25 indexes (documents.py); set by the projector, not stored
    # metadata_term of each declared filter key's pair; set by the projector, not stored
    filter_terms: tuple[str, ...] = ()
    vector_model: str = ""  # the embedding model `vector` comes from ("" = the legacy model)


@dataclass(frozen=True)
class Deletion:
    """A change-log entry: the turn `memory_id` of `tenant` was erased at `seq`."""

    seq: int
    tenant: str
    memory_id: str


Change = StoredTurn | Deletion


# A live generation gets a background rebuild once the vectors outside its graph reach
# graph_min_points and half the vectors in it: rebuilding at each 50% of growth keeps all
# the builds a store ever needs within about three builds of its final size.
GRAPH_GROWTH = 0.5


@dataclass(frozen=True)
class GraphState:
    """How much of a vector index a search can reach through its HNSW graph: the rest is
    scored exactly, point by point, which grows with the user's points."""

    points: int
    in_graph: int

    @property
    def outside(self) -> int:
        return max(0, self.points - self.in_graph)

    def due(self, minimum: int) -> bool:
        """Enough vectors outside the graph for a background rebuild: `minimum`
        (graph_min_points; 0 never) and GRAPH_GROWTH of those in the graph."""
        return bool(minimum) and self.outside >= max(minimum, GRAPH_GROWTH * self.in_graph)


@dataclass(frozen=True)
class Candidate:
    """One retriever's result; its rank is its 1-based position in the list."""

    memory_id: str
    score: float


class Place(NamedTuple):
    """Where a turn sits: its session, its position there, and who spoke it (metadata
    `speaker`, "" if none); `terms`, how many content words its own text holds (-1 if
    unknown). Fusion reads it for the neighbour, speaker and short-turn steps."""

    session: str
    position: int
    speaker: str = ""
    terms: int = -1


@dataclass(frozen=True)
class FusedHit:
    memory_id: str
    fused_score: float
    ranks: Mapping[str, int]  # retriever name -> 1-based rank; absent = not found by it
    scores: Mapping[str, float]  # retriever name -> its own score


@dataclass(frozen=True)
class Cursor:
    """The key of a turn in a listing, (time_us, seq): time order, ties in arrival order.
    A page of a listing starts after the cursor of the previous page's last turn."""

    time_us: int
    seq: int


@dataclass(frozen=True)
class SessionStats:
    """A session of a user, from its stored turns."""

    session: str
    turns: int
    first_time_us: int
    last_time_us: int


@dataclass(frozen=True)
class UserStats:
    """A user of a tenant, from their stored turns."""

    user: str
    turns: int
    sessions: int
    first_time_us: int
    last_time_us: int
