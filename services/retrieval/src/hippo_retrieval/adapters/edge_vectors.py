"""The embedded vector index: Qdrant's own engine in-process (`qdrant_edge.EdgeShard`).

Why this is the default: qdrant-edge is the real Qdrant storage engine (WAL, segments,
HNSW, payload indexes, filtered search) linked into the process, so a single-node Hippo
gets Qdrant's behaviour without a server. qdrant-client's "local mode" looks similar but
is a pure-Python brute force that filters in Python (≈150 ms per filtered query at 10k
points), so it only serves as a test double for `QdrantVectorIndex`, never as a store.

Layout. `path` is the shard directory (owned by the engine). Next to it,
`<path>.applied.json` records the last change-feed seq applied; it is written atomically
(temp file, fsync, os.replace, fsync of the directory) only after `EdgeShard.flush()`
returned, so after a crash it can lag the shard (the projector replays, which is
idempotent) but never lead it. Creating a new shard resets it to 0, so a deleted shard
directory next to a stale sidecar cannot claim data it no longer has.

Points. The point id is the memory_id (a UUID string, which the engine accepts as a
point id); the payload is {memory_id, tenant, user_id, session_id, role, time_us,
metadata_terms (one `models.metadata_term` per metadata pair, for filters)}, with
keyword indexes on the strings and an integer index on time_us. No text goes here: the
turn store holds the text. Upserts are conditional on the tenant (an existing point is
replaced only by its own tenant's write). Every search carries tenant and user (plus the optional
session, roles and time range) in the engine's `must` filter, never filtered afterwards;
a deletion deletes by filter (tenant AND id), so one tenant's deletion cannot touch
another tenant's point.

One owner per shard: the engine locks its WAL, so a second `EdgeVectorIndex` on the same
path (in this process or another) fails with `ShardLockedError`.
"""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from qdrant_edge import (
    CountRequest,
    EdgeConfig,
    EdgeShard,
    FieldCondition,
    Filter,
    HasIdCondition,
    KeywordIndexParams,
    MatchAny,
    MatchValue,
    PayloadSchemaType,
    Point,
    Query,
    QueryRequest,
    RangeFloat,
    SearchParams,
    UpdateOperation,
)

from hippo_core.files import write_atomic
from hippo_retrieval.adapters import edge_graph
from hippo_retrieval.adapters.edge_graph import shard_config
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

# Payload keys, shared with qdrant_vectors.py so both adapters index the same fields.
MEMORY_ID = "memory_id"
TENANT = "tenant"
USER = "user_id"
SESSION = "session_id"
ROLE = "role"
TIME = "time_us"
METADATA = "metadata_terms"  # models.metadata_term of each pair: metadata filters
KEYWORD_FIELDS = (TENANT, USER, SESSION, ROLE)

_SIDECAR_SUFFIX = ".applied.json"

log = logging.getLogger(__name__)


class ShardLockedError(RuntimeError):
    """Another EdgeVectorIndex (this process or another) already owns the shard's WAL."""


_ID_NAMESPACE = uuid.UUID("3b0f3c0e-5d7a-4c61-9a0e-7f1d2b8c4e55")  # fixed forever


def point_id(memory_id: str) -> str:
    """The point id for a memory_id: memory ids are UUIDs (ids.py) and are used as they
    are, in canonical form; anything else maps to a stable uuid5 rather than wedging the
    projector. Results always report the payload's memory_id, never the point id."""
    try:
        return str(uuid.UUID(memory_id))
    except ValueError:
        return str(uuid.uuid5(_ID_NAMESPACE, memory_id))


def vector_list(vector: Vector, dimension: int, what: str) -> list[float] | None:
    """The vector as floats; None if it has no direction (zero or not finite), which
    cosine cannot score. A wrong dimension is a configuration error and raises."""
    row = np.asarray(vector, dtype=np.float32)
    if row.shape != (dimension,):
        raise ValueError(f"vector of {what} has shape {row.shape}, expected ({dimension},)")
    if not np.all(np.isfinite(row)) or not np.any(row):
        return None
    return [float(x) for x in row]


def turn_row(turn: StoredTurn, dimension: int) -> list[float] | None:
    """The turn's vector as its point's, or None: it has none, or one cosine cannot score
    (logged: the turn stays BM25-searchable)."""
    if turn.vector is None:
        return None
    row = vector_list(turn.vector, dimension, turn.memory_id)
    if row is None:
        log.warning("turn %s has a zero or non-finite vector", turn.memory_id)
    return row


def deletion_groups(deletions: Sequence[Deletion]) -> dict[str, set[str]]:
    """Point ids to delete, per tenant (a deletion only ever matches its tenant's points)."""
    by_tenant: dict[str, set[str]] = {}
    for d in deletions:
        by_tenant.setdefault(d.tenant, set()).add(point_id(d.memory_id))
    return by_tenant


def payload(turn: StoredTurn) -> dict[str, Any]:
    return {
        MEMORY_ID: turn.memory_id,
        TENANT: turn.tenant,
        USER: turn.user,
        SESSION: turn.session,
        ROLE: str(turn.role),
        TIME: turn.time_us,
        METADATA: list(turn.filter_terms),
    }


def runs(changes: Sequence[Change]) -> list[list[StoredTurn] | list[Deletion]]:
    """Consecutive writes and consecutive deletions grouped, order kept (a write then a
    deletion of the same id must end deleted, and the reverse must end written)."""
    groups: list[list[StoredTurn] | list[Deletion]] = []
    writes: list[StoredTurn] = []
    deletions: list[Deletion] = []
    for change in changes:
        if isinstance(change, StoredTurn):
            if deletions:
                groups.append(deletions)
                deletions = []
            writes.append(change)
        else:
            if writes:
                groups.append(writes)
                writes = []
            deletions.append(change)
    if writes:
        groups.append(writes)
    if deletions:
        groups.append(deletions)
    return groups


def write_json_atomic(path: Path, data: dict[str, Any]) -> None:
    """Replace `path` with `data` as JSON so that a crash leaves the old or the new file."""
    write_atomic(path, json.dumps(data).encode("utf-8"))


class EdgeIndex:
    """What an index over an edge shard does whatever its points hold (the dense vectors
    here, the sparse BM25 vectors of sparse_lexical.py): open or create the shard, its
    payload indexes, the applied-seq sidecar, ordered tenant-safe writes, close.
    A subclass gives `_point_vector` (a turn's vector(s); None: no point) and searches."""

    _what = "index shard"

    def __init__(self, path: Path, config: EdgeConfig) -> None:
        self._path = Path(path)
        self._config = config
        self._sidecar = self._path.with_name(self._path.name + _SIDECAR_SUFFIX)
        self._lock = threading.Lock()
        existed = self._path.is_dir() and any(self._path.iterdir())
        try:
            if existed:
                # With a config, load checks it against the segments (size, distance).
                self._shard: EdgeShard | None = EdgeShard.load(str(self._path), config)
            else:
                self._path.parent.mkdir(parents=True, exist_ok=True)
                self._shard = EdgeShard.create(str(self._path), config)
        except Exception as exc:  # the engine raises plain Exception with a message
            if "WAL" in str(exc) and "WouldBlock" in str(exc):
                raise ShardLockedError(
                    f"{self._what} {self._path} is in use by another {type(self).__name__} "
                    f"(its WAL is locked; one owner per shard): {exc}"
                ) from exc
            raise
        try:
            self._ensure_indexes()
            if existed:
                self._applied = self._read_applied()
            else:
                self._applied = 0
                write_json_atomic(self._sidecar, {"applied_seq": 0})
        except BaseException:
            self._shard.close()
            self._shard = None
            raise

    @property
    def path(self) -> Path:
        return self._path

    def _ensure_indexes(self) -> None:
        shard = self._require()
        have = set(shard.info().payload_schema)
        wanted: dict[str, Any] = {
            TENANT: KeywordIndexParams(is_tenant=True),
            USER: PayloadSchemaType.Keyword,
            SESSION: PayloadSchemaType.Keyword,
            ROLE: PayloadSchemaType.Keyword,
            TIME: PayloadSchemaType.Integer,
            METADATA: PayloadSchemaType.Keyword,
        }
        for field, schema in wanted.items():
            if field not in have:
                shard.update(UpdateOperation.create_field_index(field, schema))
        shard.flush()

    def _read_applied(self) -> int:
        try:
            data = json.loads(self._sidecar.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return 0  # shard written before any sidecar: replaying from 0 is idempotent
        seq = data.get("applied_seq") if isinstance(data, dict) else None
        if not isinstance(seq, int) or seq < 0:
            raise ValueError(f"{self._sidecar} holds no valid applied_seq: {data!r}")
        return seq

    def _require(self) -> EdgeShard:
        if self._shard is None:
            raise RuntimeError(f"{type(self).__name__} {self._path} is closed")
        return self._shard

    def apply(self, changes: Sequence[Change]) -> None:
        if not changes:
            return
        # Build (and so validate) every operation first: a bad change fails the whole
        # batch before anything is written.
        groups: list[UpdateOperation] = []
        for group in runs(changes):
            points: dict[str, list[Point]] = {}  # per tenant
            deletions: list[Deletion] = []
            for change in group:
                if isinstance(change, Deletion):
                    deletions.append(change)
                else:
                    vector = self._point_vector(change)
                    if vector is None:
                        continue
                    point = Point(point_id(change.memory_id), vector, payload(change))
                    points.setdefault(change.tenant, []).append(point)
            for tenant, batch in points.items():
                # Conditional upsert: a new id is inserted, an existing one is replaced
                # only if it is this tenant's, so no write can take over another's point.
                groups.append(UpdateOperation.upsert_points(batch, condition=tenant_is(tenant)))
            for tenant, ids in deletion_groups(deletions).items():
                groups.append(UpdateOperation.delete_points_by_filter(owned(tenant, ids)))
        last = max(c.seq for c in changes)
        with self._lock:
            shard = self._require()
            for op in groups:
                shard.update(op)
            shard.flush()
            if last > self._applied:
                write_json_atomic(self._sidecar, {"applied_seq": last})
                self._applied = last

    def _point_vector(self, turn: StoredTurn) -> Any:
        raise NotImplementedError

    def writable(self) -> bool:
        return True  # one owner per shard: always this process

    def applied_seq(self) -> int:
        with self._lock:
            return self._applied

    def _query(self, request: QueryRequest) -> list[Any]:
        with self._lock:
            return list(self._require().query(request))

    def count(self) -> int:
        """Points stored (all tenants): for tests and metrics."""
        with self._lock:
            return int(self._require().count(CountRequest(exact=True)))

    def close(self) -> None:
        with self._lock:
            if self._shard is None:
                return
            shard, self._shard = self._shard, None
            try:
                shard.flush()
            finally:
                shard.close()


# The HNSW search beam: twice the candidates asked, at least 128. The engine's default
# (its build beam, 100) found 97.4% of the exact top 100 at 10k turns of one user; the
# wider beam costs a fraction of the exact scan it replaces (docs/recall.md). Segments
# outside the graph are scored exactly whatever the beam.
SEARCH_EF_MIN = 128


def search_ef(limit: int) -> int:
    return max(SEARCH_EF_MIN, 2 * limit)


class EdgeVectorIndex(EdgeIndex):
    """`VectorIndex` over an in-process Qdrant edge shard at `path`."""

    _what = "vector shard"

    def __init__(self, path: Path, dimension: int = 384) -> None:
        if dimension <= 0:
            raise ValueError("dimension must be positive")
        self._dimension = dimension
        super().__init__(path, shard_config(dimension))

    def _point_vector(self, turn: StoredTurn) -> list[float] | None:
        return turn_row(turn, self._dimension)

    def search(self, scope: Scope, vector: Vector, limit: int) -> list[Candidate]:
        if limit <= 0:
            return []
        query = vector_list(vector, self._dimension, "the query")
        if query is None:
            return []  # no direction: nothing is nearer than anything else
        request = QueryRequest(
            limit=limit,
            query=Query.Nearest(query),
            filter=scope_filter(scope),
            with_payload=[MEMORY_ID],
            params=SearchParams(hnsw_ef=search_ef(limit)),
        )
        hits = self._query(request)
        return [Candidate(str((h.payload or {})[MEMORY_ID]), float(h.score)) for h in hits]

    def graph_state(self) -> GraphState:
        with self._lock:
            info = self._require().info()
        return GraphState(points=info.points_count, in_graph=info.indexed_vectors_count)

    def build_graph(self, cancelled: Callable[[], bool]) -> None:
        """Build the HNSW graph over every point, in a child process (edge_graph.py says
        why), the shard closed meanwhile: only for an index nobody searches or writes
        yet (a generation being rebuilt). Reopened afterwards, whatever happened."""
        with self._lock:
            shard = self._require()
            shard.flush()
            shard.close()
            self._shard = None
            try:
                stats = edge_graph.build(self._path, self._dimension, cancelled)
            finally:
                self._shard = EdgeShard.load(str(self._path), self._config)
        log.info(
            "vector graph built: %d of %d points in %.1f s",
            stats["in_graph"],
            stats["points"],
            stats["seconds"],
        )


def tenant_is(tenant: str) -> Filter:
    return Filter(must=[FieldCondition(key=TENANT, match=MatchValue(value=tenant))])


def owned(tenant: str, ids: set[str]) -> Filter:
    """These points, but only where they belong to `tenant`."""
    point_ids: set[int | uuid.UUID | str] = set(ids)
    return Filter(
        must=[FieldCondition(key=TENANT, match=MatchValue(value=tenant)), HasIdCondition(point_ids)]
    )


def scope_filter(scope: Scope) -> Filter:
    """The whole scope as one engine filter: tenant and user always."""
    if not scope.tenant or not scope.user:
        raise ValueError("a vector search needs tenant and user")
    must: list[Any] = [
        FieldCondition(key=TENANT, match=MatchValue(value=scope.tenant)),
        FieldCondition(key=USER, match=MatchValue(value=scope.user)),
    ]
    if scope.session is not None:
        must.append(FieldCondition(key=SESSION, match=MatchValue(value=scope.session)))
    if scope.roles:
        must.append(FieldCondition(key=ROLE, match=MatchAny(sorted(str(r) for r in scope.roles))))
    for key, value in scope.metadata:  # an array payload matches if any element does
        must.append(FieldCondition(key=METADATA, match=MatchValue(value=metadata_term(key, value))))
    if scope.start_us is not None or scope.end_us is not None:
        # The engine's range is f64: exact for |t| < 2**53 µs (≈ year 2255).
        must.append(FieldCondition(key=TIME, range=RangeFloat(gte=scope.start_us, lt=scope.end_us)))
    return Filter(must=must)
