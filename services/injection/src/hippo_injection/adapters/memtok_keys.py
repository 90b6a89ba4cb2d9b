"""Memtok key vectors in Qdrant's engine in-process (`qdrant_edge.EdgeShard`), the same
engine and conventions as retrieval's vector index (services never import each other):
the point id is the memtok id (a UUID); the payload holds tenant and user with keyword
indexes (tenant as the engine's tenant key); every search carries both in the engine's
`must` filter; upserts are conditional on the tenant and deletions are by filter
(tenant AND id), so no tenant's write can touch another's point.

The item store is the source of truth; this index records the last change seq it
applied in `<path>.applied.json` (written after `flush()`), and the store brings it up
to date (or rebuilds it) when the two disagree. One owner per shard: the engine locks
its WAL, so every replica keeps its own under its own data dir."""

from __future__ import annotations

import json
import shutil
import threading
import uuid
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
from qdrant_edge import (
    Distance,
    EdgeConfig,
    EdgeShard,
    EdgeVectorParams,
    FieldCondition,
    Filter,
    HasIdCondition,
    KeywordIndexParams,
    MatchValue,
    PayloadSchemaType,
    Point,
    Query,
    QueryRequest,
    UpdateOperation,
)

from hippo_injection.domain.memtok.models import Memtok, Vector

TENANT, USER, ID = "tenant", "user_id", "memtok_id"


def _tenant(tenant: str) -> Filter:
    return Filter(must=[FieldCondition(key=TENANT, match=MatchValue(value=tenant))])


class EdgeKeyIndex:
    def __init__(self, path: Path, dimension: int = 384) -> None:
        self._path = Path(path)
        self._dimension = dimension
        self._sidecar = self._path.with_name(self._path.name + ".applied.json")
        self._lock = threading.Lock()
        self._applied = 0
        self._shard: EdgeShard | None = self._open()

    def _open(self) -> EdgeShard:
        config = EdgeConfig(
            vectors=EdgeVectorParams(size=self._dimension, distance=Distance.Cosine)
        )
        existed = self._path.is_dir() and any(self._path.iterdir())
        if existed:
            shard = EdgeShard.load(str(self._path), config)
        else:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            shard = EdgeShard.create(str(self._path), config)
        try:
            have = set(shard.info().payload_schema)
            wanted: dict[str, Any] = {
                TENANT: KeywordIndexParams(is_tenant=True),
                USER: PayloadSchemaType.Keyword,
            }
            for field, schema in wanted.items():
                if field not in have:
                    shard.update(UpdateOperation.create_field_index(field, schema))
            shard.flush()
            if existed:
                self._applied = self._read()
            else:
                self._write(0)
        except BaseException:
            shard.close()
            raise
        return shard

    def _read(self) -> int:
        try:
            data = json.loads(self._sidecar.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return 0
        seq = data.get("applied_seq") if isinstance(data, dict) else None
        return seq if isinstance(seq, int) and seq >= 0 else 0

    def _write(self, seq: int) -> None:
        tmp = self._sidecar.with_name(self._sidecar.name + ".tmp")
        tmp.write_text(json.dumps({"applied_seq": seq}), encoding="utf-8")
        tmp.replace(self._sidecar)
        self._applied = seq

    def _require(self) -> EdgeShard:
        if self._shard is None:
            raise RuntimeError(f"EdgeKeyIndex {self._path} is closed")
        return self._shard

    def upsert(self, items: Sequence[Memtok], seq: int) -> None:
        by_tenant: dict[str, list[Point]] = {}
        for m in items:
            row = np.asarray(m.key, dtype=np.float32)
            if row.shape != (self._dimension,) or not np.all(np.isfinite(row)) or not row.any():
                continue  # no direction: cosine cannot score it
            point = Point(
                str(uuid.UUID(m.id)),
                [float(x) for x in row],
                {ID: m.id, TENANT: m.tenant, USER: m.user},
            )
            by_tenant.setdefault(m.tenant, []).append(point)
        with self._lock:
            shard = self._require()
            for tenant, points in by_tenant.items():
                shard.update(UpdateOperation.upsert_points(points, condition=_tenant(tenant)))
            shard.flush()
            self._write(max(seq, self._applied))

    def delete(self, tenant: str, ids: Sequence[str], seq: int) -> None:
        point_ids: set[int | uuid.UUID | str] = {str(uuid.UUID(i)) for i in ids}
        with self._lock:
            shard = self._require()
            if point_ids:
                owned = Filter(
                    must=[
                        FieldCondition(key=TENANT, match=MatchValue(value=tenant)),
                        HasIdCondition(point_ids),
                    ]
                )
                shard.update(UpdateOperation.delete_points_by_filter(owned))
            shard.flush()
            self._write(max(seq, self._applied))

    def search(self, tenant: str, user: str, vector: Vector, limit: int) -> list[tuple[str, float]]:
        row = np.asarray(vector, dtype=np.float32)
        if limit <= 0 or not np.all(np.isfinite(row)) or not row.any():
            return []
        if not tenant or not user:
            raise ValueError("a key search needs tenant and user")
        request = QueryRequest(
            limit=limit,
            query=Query.Nearest([float(x) for x in row]),
            filter=Filter(
                must=[
                    FieldCondition(key=TENANT, match=MatchValue(value=tenant)),
                    FieldCondition(key=USER, match=MatchValue(value=user)),
                ]
            ),
            with_payload=[ID],
        )
        with self._lock:
            hits = self._require().query(request)
        return [(str((h.payload or {})[ID]), float(h.score)) for h in hits]

    def applied_seq(self) -> int:
        with self._lock:
            return self._applied

    def clear(self) -> None:
        """A new, empty shard in place of this one (quicker than deleting every point,
        and no deleted point lingers in its segments)."""
        with self._lock:
            shard, self._shard = self._require(), None
            shard.close()
            # The mark first: a crash mid-way leaves an index that says "nothing applied".
            self._write(0)
            shutil.rmtree(self._path)
            self._shard = self._open()

    def close(self) -> None:
        with self._lock:
            if self._shard is None:
                return
            shard, self._shard = self._shard, None
            try:
                shard.flush()
            finally:
                shard.close()
