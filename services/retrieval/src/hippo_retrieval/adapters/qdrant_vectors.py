"""The vector index on a Qdrant server or cluster, through `qdrant_client`.

For deployments that run Qdrant separately (shared, replicated, scaled on its own); the
embedded default is `EdgeVectorIndex`. Both adapters keep the same points: id = the
memory_id UUID, payload {memory_id, tenant, user_id, session_id, role, time_us,
metadata_terms} with
keyword indexes on the strings (tenant marked `is_tenant`, which lets the server lay
segments out per tenant) and an integer index on time_us; no text. Every search puts the
whole scope (tenant, user, optional session, roles, time range) in the server's `must`
filter; nothing is filtered afterwards. Upserts are conditional on the tenant
(`update_filter`: an existing point is replaced only by its own tenant's write) and
deletions delete by filter (tenant AND id), so one tenant can never overwrite or erase
another's point, even on an id collision. `update_filter` needs Qdrant ≥ 1.16.

Where `applied_seq` lives: in Qdrant, next to the data, as the payload of one point in a
small companion collection `<collection>_meta` (a 1-d vector, because every Qdrant
version accepts that). Not a reserved point in the data collection: that point would sit
in every scroll, count and optimiser pass, and would need a vector that no query could
ever rank. Not collection metadata: changing it is a cluster-wide consensus operation,
too heavy for every apply. Each apply first writes the changes (one ordered
`batch_update_points`, `wait=True`), then the seq (`wait=True`), so the seq can lag the
data after a crash (replay is idempotent) but never lead it. When the data collection is
created the seq is reset to 0, so a dropped collection is rebuilt rather than trusted.

The test suite runs this adapter over qdrant-client's local mode (`QdrantClient(path=)`),
which speaks the same client API but is pure Python: it ignores payload indexes and
filters by brute force (≈150 ms per filtered query at 10k points), so it is a test double
for a server, never a store.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from qdrant_client import QdrantClient, models

from hippo_retrieval.adapters.edge_vectors import (
    MEMORY_ID,
    METADATA,
    ROLE,
    SESSION,
    TENANT,
    TIME,
    USER,
    deletion_groups,
    payload,
    point_id,
    runs,
    turn_row,
    vector_list,
)
from hippo_retrieval.domain.models import (
    Candidate,
    Change,
    Deletion,
    GraphState,
    Scope,
    StoredTurn,
    Vector,
    metadata_term,
)

META_POINT = 1  # the one point of `<collection>_meta`


@dataclass(frozen=True)
class Layout:
    """How a new collection spreads over a Qdrant cluster: `shards` (spread over nodes)
    and `replication` (copies of each shard on different nodes). Read only when the
    collection is created; the `_meta` companion, one point, gets one shard."""

    shards: int = 1
    replication: int = 1


ONE_NODE = Layout()


APPLIED_SEQ = "applied_seq"

log = logging.getLogger(__name__)


class QdrantIndex:
    """What an index over a Qdrant collection does whatever its points hold (the dense
    vectors here, the sparse BM25 vectors of sparse_lexical.py): the collection and its
    payload indexes, the applied seq in `<collection>_meta`, ordered tenant-safe writes.
    A subclass gives the collection's vectors (`_vectors`, `_sparse`), `_point_vector`
    (a turn's vector(s); None: no point) and searches.

    Takes ownership of `client`: `close()` closes it. Writes always hold the lock.
    `concurrent_searches=True` lets searches run outside it, which is right for a server
    client (HTTP and gRPC clients are thread-safe; generations.QdrantServer sets it) but not for
    qdrant-client's local mode, where a search racing an upsert raises IndexError inside
    the client; hence the safe default False."""

    def __init__(
        self,
        client: QdrantClient,
        collection: str,
        *,
        concurrent_searches: bool = False,
        layout: Layout = ONE_NODE,
    ) -> None:
        self._client = client
        self._layout = layout
        self._collection = collection
        self._meta = f"{collection}_meta"
        self._lock = threading.Lock()  # serialises writes (apply), close, and maybe searches
        self._concurrent_searches = concurrent_searches
        self._closed = False
        created = self._ensure_collection(
            collection, self._vectors(), self._sparse(), layout.shards
        )
        self._ensure_indexes()
        self._ensure_collection(
            self._meta, models.VectorParams(size=1, distance=models.Distance.COSINE), None, 1
        )
        if created:
            self._write_applied(0)
            self._applied = 0
        else:
            self._applied = self._read_applied()

    def _vectors(self) -> models.VectorParams | dict[str, models.VectorParams]:
        raise NotImplementedError

    def _sparse(self) -> dict[str, models.SparseVectorParams] | None:
        return None

    def _point_vector(self, turn: StoredTurn) -> Any:
        raise NotImplementedError

    @property
    def collection(self) -> str:
        return self._collection

    def _ensure_collection(
        self,
        name: str,
        vectors: models.VectorParams | dict[str, models.VectorParams],
        sparse: dict[str, models.SparseVectorParams] | None,
        shards: int,
    ) -> bool:
        """Create `name` if missing (True if this call created it); check it otherwise."""
        if not self._client.collection_exists(name):
            try:
                self._client.create_collection(
                    name,
                    vectors_config=vectors,
                    sparse_vectors_config=sparse,
                    shard_number=shards,
                    replication_factor=self._layout.replication,
                )
                return True
            except Exception:
                if not self._client.collection_exists(name):
                    raise
                # another replica created it between our check and our create
        params = self._client.get_collection(name).config.params
        if not _same_vectors(params.vectors, vectors) or not _same_sparse(
            params.sparse_vectors, sparse
        ):
            raise ValueError(
                f"Qdrant collection {name!r} has vectors {params.vectors!r} and sparse "
                f"vectors {params.sparse_vectors!r}; expected {vectors!r} and {sparse!r}"
            )
        return False

    def _ensure_indexes(self) -> None:
        have = self._client.get_collection(self._collection).payload_schema
        wanted: dict[str, Any] = {
            TENANT: models.KeywordIndexParams(type=models.KeywordIndexType.KEYWORD, is_tenant=True),
            USER: models.PayloadSchemaType.KEYWORD,
            SESSION: models.PayloadSchemaType.KEYWORD,
            ROLE: models.PayloadSchemaType.KEYWORD,
            TIME: models.PayloadSchemaType.INTEGER,
            METADATA: models.PayloadSchemaType.KEYWORD,
        }
        for field, schema in wanted.items():
            if field not in have:
                self._client.create_payload_index(
                    self._collection, field, field_schema=schema, wait=True
                )

    def _read_applied(self) -> int:
        records = self._client.retrieve(self._meta, [META_POINT], with_payload=True)
        if not records:
            return 0  # never recorded: replaying from 0 is idempotent
        seq = (records[0].payload or {}).get(APPLIED_SEQ)
        if not isinstance(seq, int) or seq < 0:
            raise ValueError(f"{self._meta} holds no valid {APPLIED_SEQ}: {records[0].payload!r}")
        return seq

    def _write_applied(self, seq: int) -> None:
        point = models.PointStruct(
            id=META_POINT,
            vector=[1.0],
            payload={APPLIED_SEQ: seq, "collection": self._collection},
        )
        self._client.upsert(self._meta, [point], wait=True)

    def _require_open(self) -> None:
        if self._closed:
            raise RuntimeError(f"{type(self).__name__} {self._collection!r} is closed")

    def apply(self, changes: Sequence[Change]) -> None:
        if not changes:
            return
        # Build (and so validate) every operation first: a bad change fails the whole
        # batch before anything is written. Order is kept: runs of writes and deletions.
        operations: list[models.UpsertOperation | models.DeleteOperation] = []
        for group in runs(changes):
            points: dict[str, list[models.PointStruct]] = {}  # per tenant
            deletions: list[Deletion] = []
            for change in group:
                if isinstance(change, Deletion):
                    deletions.append(change)
                else:
                    vector = self._point_vector(change)
                    if vector is None:
                        continue
                    points.setdefault(change.tenant, []).append(
                        models.PointStruct(
                            id=point_id(change.memory_id), vector=vector, payload=payload(change)
                        )
                    )
            for tenant, batch in points.items():
                operations.append(
                    models.UpsertOperation(
                        upsert=models.PointsList(points=batch, update_filter=_tenant_is(tenant))
                    )
                )
            for tenant, ids in deletion_groups(deletions).items():
                selector = models.FilterSelector(filter=_owned(tenant, ids))
                operations.append(models.DeleteOperation(delete=selector))
        last = max(c.seq for c in changes)
        with self._lock:
            self._require_open()
            if operations:
                self._client.batch_update_points(self._collection, operations, wait=True)
            if last > self._applied:
                self._write_applied(last)
                self._applied = last

    def writable(self) -> bool:
        """True: this object writes whenever asked. Shared by replicas, it is wrapped by
        shared_indexes.LeasedIndex, which decides who writes."""
        return True

    def applied_seq(self) -> int:
        with self._lock:
            return self._applied

    def graph_state(self) -> GraphState | None:
        return None  # the server's optimizer builds the graph as points arrive

    def build_graph(self, cancelled: Callable[[], bool]) -> None:
        """Nothing to do: the server's optimizer builds it."""

    def reload_applied(self) -> int:
        """Read the applied seq back from the collection: another replica may have
        written it since (cluster mode, where one replica at a time writes)."""
        with self._lock:
            self._require_open()
            self._applied = self._read_applied()
            return self._applied

    def _query(
        self,
        query: Any,
        using: str | None,
        query_filter: models.Filter,
        limit: int,
        fields: list[str],
        prefetch: list[models.Prefetch] | None = None,
    ) -> list[models.ScoredPoint]:
        def run() -> list[models.ScoredPoint]:
            self._require_open()
            return self._client.query_points(
                self._collection,
                query=query,
                using=using,
                prefetch=prefetch,
                query_filter=query_filter,
                limit=limit,
                with_payload=fields,
            ).points

        if self._concurrent_searches:
            return run()
        with self._lock:
            return run()

    def _query_batch(self, requests: list[models.QueryRequest]) -> list[models.QueryResponse]:
        def run() -> list[models.QueryResponse]:
            self._require_open()
            return self._client.query_batch_points(self._collection, requests)

        if self._concurrent_searches:
            return run()
        with self._lock:
            return run()

    def _nearest(
        self, scope: Scope, vector: Vector, dimension: int, using: str | None, limit: int
    ) -> list[Candidate]:
        """The points nearest `vector` by their dense vector `using` (None: the unnamed
        one), inside the scope, best first."""
        if limit <= 0:
            return []
        query = vector_list(vector, dimension, "the query")
        if query is None:
            return []  # no direction: nothing is nearer than anything else
        points = self._query(query, using, scope_filter(scope), limit, [MEMORY_ID])
        return [Candidate(str((p.payload or {})[MEMORY_ID]), float(p.score)) for p in points]

    def count(self) -> int:
        """Points stored (all tenants): for tests and metrics."""
        with self._lock:
            self._require_open()
            return self._client.count(self._collection, exact=True).count

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            self._client.close()


class QdrantVectorIndex(QdrantIndex):
    """`VectorIndex` over the collection `collection` of a Qdrant server (one unnamed
    dense vector per point)."""

    def __init__(
        self,
        client: QdrantClient,
        collection: str = "hippo_turns",
        dimension: int = 384,
        *,
        concurrent_searches: bool = False,
        layout: Layout = ONE_NODE,
    ) -> None:
        if dimension <= 0:
            raise ValueError("dimension must be positive")
        self._dimension = dimension
        super().__init__(client, collection, concurrent_searches=concurrent_searches, layout=layout)

    def _vectors(self) -> models.VectorParams:
        return models.VectorParams(size=self._dimension, distance=models.Distance.COSINE)

    def _point_vector(self, turn: StoredTurn) -> list[float] | None:
        return turn_row(turn, self._dimension)

    def search(self, scope: Scope, vector: Vector, limit: int) -> list[Candidate]:
        return self._nearest(scope, vector, self._dimension, None, limit)


def _tenant_is(tenant: str) -> models.Filter:
    return models.Filter(
        must=[models.FieldCondition(key=TENANT, match=models.MatchValue(value=tenant))]
    )


def _owned(tenant: str, ids: set[str]) -> models.Filter:
    """These points, but only where they belong to `tenant`."""
    has_id: list[int | str] = sorted(ids)
    return models.Filter(
        must=[
            models.FieldCondition(key=TENANT, match=models.MatchValue(value=tenant)),
            models.HasIdCondition(has_id=has_id),
        ]
    )


def scope_filter(scope: Scope) -> models.Filter:
    """The whole scope as one server filter: tenant and user always."""
    if not scope.tenant or not scope.user:
        raise ValueError("a vector search needs tenant and user")
    must: list[models.Condition] = [
        models.FieldCondition(key=TENANT, match=models.MatchValue(value=scope.tenant)),
        models.FieldCondition(key=USER, match=models.MatchValue(value=scope.user)),
    ]
    if scope.session is not None:
        must.append(
            models.FieldCondition(key=SESSION, match=models.MatchValue(value=scope.session))
        )
    if scope.roles:
        roles = sorted(str(r) for r in scope.roles)
        must.append(models.FieldCondition(key=ROLE, match=models.MatchAny(any=roles)))
    for key, value in scope.metadata:  # an array payload matches if any element does
        term = metadata_term(key, value)
        must.append(models.FieldCondition(key=METADATA, match=models.MatchValue(value=term)))
    if scope.start_us is not None or scope.end_us is not None:
        must.append(
            models.FieldCondition(key=TIME, range=models.Range(gte=scope.start_us, lt=scope.end_us))
        )
    return models.Filter(must=must)


def _same_vectors(have: Any, want: models.VectorParams | dict[str, models.VectorParams]) -> bool:
    if isinstance(want, models.VectorParams):
        return (
            isinstance(have, models.VectorParams)
            and have.size == want.size
            and have.distance == want.distance
        )
    have = have or {}
    return (
        isinstance(have, dict)
        and set(have) == set(want)
        and all(_same_vectors(have[name], want[name]) for name in want)
    )


def _same_sparse(have: Any, want: dict[str, models.SparseVectorParams] | None) -> bool:
    have, want = have or {}, want or {}
    return set(have) == set(want) and all(
        (have[name].modifier or models.Modifier.NONE)
        == (want[name].modifier or models.Modifier.NONE)
        for name in want
    )
