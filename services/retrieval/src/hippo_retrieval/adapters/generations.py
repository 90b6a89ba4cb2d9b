"""Index generations on disk (Tantivy + edge shard) or on a Qdrant server.

Layout under the data dir:

    indexes/CURRENT            the live generation's number (written atomically)
    indexes/PURGE              present while the live generation's files still hold
                               erased documents (the purge rebuild removes it)
    indexes/g000001/lexical/   Tantivy index (lexical_index=tantivy, the default), or
    indexes/g000001/lexical-sparse/  the BM25 edge shard (lexical_index=qdrant;
                               + lexical-sparse.applied.json beside it)
    indexes/g000001/vectors/   qdrant-edge shard (+ vectors.applied.json beside it)
    indexes/g000001/EMBEDDING  the embedding model its vectors come from (JSON: name,
                               dimension), written before the generation is built;
                               absent in generations made before models were recorded

With a Qdrant server, the vectors of generation n live in the collection
`<collection>_g<n>` (and its `_meta` companion) instead, and with lexical_index=qdrant the
BM25 index in `<collection>_lexical_g<n>`; a Tantivy index stays local.
A missing CURRENT means generation 1, so a fresh data dir needs no setup.

Cluster mode with a Qdrant server (`lease` given): every replica searches one collection,
`<collection>_shared`, written by the lease holder (shared_indexes.py). It belongs to no
generation: a replica's reindex rebuilds its own Tantivy index and leaves the collection
alone (other replicas are searching it); docs/recall.md says how to rebuild it.

Stateless mode (`SharedIndexSet`: cluster mode, a Qdrant server, lexical_index=qdrant):
both indexes are shared collections, `<collection>_shared` and
`<collection>_lexical_shared`, each written by the holder of its own lease, and the
replica keeps nothing on its disk: no generations, no records.

Server-side fusion (`fusion="server"`, lexical_index=qdrant on a server): one collection
holds both vectors of each turn (hybrid_collection.py), `<collection>_fused_g<n>` per
generation, or `<collection>_fused_shared` in stateless mode, written under one lease.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from qdrant_client import QdrantClient

from hippo_core.files import write_atomic
from hippo_retrieval import metrics
from hippo_retrieval.adapters.edge_vectors import EdgeVectorIndex
from hippo_retrieval.adapters.hybrid_collection import OneCollection, QdrantHybridIndex
from hippo_retrieval.adapters.qdrant_vectors import Layout, QdrantVectorIndex
from hippo_retrieval.adapters.shared_indexes import LeasedIndex, WriterLease
from hippo_retrieval.adapters.sparse_lexical import EdgeLexicalIndex, QdrantLexicalIndex
from hippo_retrieval.adapters.tantivy_index import TantivyIndex
from hippo_retrieval.domain.models import EmbeddingModel
from hippo_retrieval.domain.ports import LexicalIndex, VectorIndex

Index = TypeVar("Index")

TANTIVY = "tantivy"
QDRANT = "qdrant"
CURRENT = "CURRENT"
PURGE = "PURGE"
EMBEDDING = "EMBEDDING"


class QdrantServer:
    """Where server-side collections are: URL, key, name prefix, timeout. `connect` makes
    a client (tests pass one that opens qdrant-client's local mode instead)."""

    def __init__(
        self,
        url: str,
        api_key: str | None,
        collection: str,
        timeout_s: float,
        connect: Callable[[], QdrantClient] | None = None,
        *,
        shards: int = 1,
        replication: int = 1,
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
        if shards < 1 or replication < 1:
            raise ValueError("shards and replication must be at least 1")
        self.layout = Layout(shards, replication)
        self.url = url
        self.api_key = api_key
        self.collection = collection
        self.timeout_s = timeout_s
        self._connect = connect

    def client(self) -> QdrantClient:
        if self._connect is not None:
            return self._connect()
        return QdrantClient(
            url=self.url,
            api_key=self.api_key,
            timeout=max(1, math.ceil(self.timeout_s)),  # the client takes whole seconds
        )

    @property
    def concurrent_searches(self) -> bool:
        """Server clients are thread-safe; qdrant-client's local mode is not."""
        return self._connect is None

    def name(self, generation: int) -> str:
        return f"{self.collection}_g{generation}"

    def lexical_name(self, generation: int) -> str:
        return f"{self.collection}_lexical_g{generation}"

    @property
    def shared_name(self) -> str:
        """The one vector collection of cluster mode, shared by every replica."""
        return f"{self.collection}_shared"

    @property
    def shared_lexical_name(self) -> str:
        """The one BM25 collection of stateless mode, shared by every replica."""
        return f"{self.collection}_lexical_shared"

    def fused_name(self, generation: int) -> str:
        return f"{self.collection}_fused_g{generation}"

    @property
    def shared_fused_name(self) -> str:
        """The one collection of stateless mode with server-side fusion."""
        return f"{self.collection}_fused_shared"

    def hybrid_collection(
        self, name: str, dimension: int, *, typos: bool = False
    ) -> QdrantHybridIndex:
        return self._owning(QdrantHybridIndex, name, dimension, typos=typos)

    def vector_collection(self, name: str, dimension: int) -> QdrantVectorIndex:
        return self._owning(QdrantVectorIndex, name, dimension)

    def lexical_collection(self, name: str, *, typos: bool = False) -> QdrantLexicalIndex:
        return self._owning(QdrantLexicalIndex, name, typos=typos)

    def _owning(self, kind: Callable[..., Index], name: str, *args: Any, **kwargs: Any) -> Index:
        """`kind(client, name, ...)` over a client of its own (the index closes it; so
        does a failed construction), with this server's search and layout settings."""
        client = self.client()
        try:
            return kind(
                client,
                name,
                *args,
                concurrent_searches=self.concurrent_searches,
                layout=self.layout,
                **kwargs,
            )
        except BaseException:
            client.close()
            raise

    def drop(self, *names: str) -> None:
        """Delete these collections and their `_meta` companions; absent is fine."""
        client = self.client()
        try:
            for name in names:
                for collection in (name, f"{name}_meta"):
                    if client.collection_exists(collection):
                        client.delete_collection(collection)
        finally:
            client.close()


class LocalIndexSet:
    """`IndexSet` with Tantivy on local disk and vectors in an edge shard, or on a Qdrant
    server when `server` is given: per generation, or (given `lease`, cluster mode) in
    the one collection every replica shares."""

    def __init__(
        self,
        root: Path,
        *,
        server: QdrantServer | None = None,
        lease: WriterLease | None = None,
        typos: bool = False,
        lexical: str = TANTIVY,
        fused: bool = False,
    ) -> None:
        if fused and (server is None or lexical != QDRANT or lease is not None):
            raise ValueError(
                "server-side fusion needs BM25 and vectors in one collection of a Qdrant "
                "server (lexical_index=qdrant, qdrant_url); in cluster mode, SharedIndexSet"
            )
        if lease is not None and server is None:
            raise ValueError("a shared vector index needs a Qdrant server")
        if lexical not in (TANTIVY, QDRANT):
            raise ValueError(f"lexical index {lexical!r}: expected {TANTIVY!r} or {QDRANT!r}")
        if lexical == QDRANT and lease is not None:
            raise ValueError("cluster mode with BM25 on the Qdrant server is SharedIndexSet")
        self._root = Path(root) / "indexes"
        self._root.mkdir(parents=True, exist_ok=True)
        self._server = server
        self._lease = lease
        self._shared: LeasedIndex | None = None
        self._typos = typos  # the lexical index repairs query typos
        self._lexical = lexical
        self._fused = fused

    @property
    def vector_backend(self) -> str:
        return "qdrant" if self._server is not None else "edge"

    @property
    def lexical_backend(self) -> str:
        return self._lexical

    @property
    def local_files(self) -> bool:
        return True

    def _dir(self, generation: int) -> Path:
        return self._root / f"g{generation:06d}"

    def current(self) -> int:
        path = self._root / CURRENT
        if not path.exists():
            return 1
        text = path.read_text(encoding="ascii").strip()
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"{path} does not hold a generation number: {text!r}")
        return int(text)

    def set_current(self, generation: int) -> None:
        # Plain text on purpose: an operator can read it (and in an emergency, write it).
        write_atomic(self._root / CURRENT, f"{generation}\n".encode("ascii"))

    def purge_pending(self) -> bool:
        return (self._root / PURGE).exists()

    def set_purge_pending(self, pending: bool) -> None:
        path = self._root / PURGE
        if pending:
            write_atomic(path, b"the live generation holds erased documents\n")
        else:
            path.unlink(missing_ok=True)

    @property
    def shared_vectors(self) -> bool:
        return self._lease is not None

    def embedding(self, generation: int) -> EmbeddingModel | None:
        path = self._dir(generation) / EMBEDDING
        if not path.exists():
            return None
        record = json.loads(path.read_text(encoding="utf-8"))
        return EmbeddingModel(str(record["name"]), int(record["dimension"]))

    def set_embedding(self, generation: int, model: EmbeddingModel) -> None:
        folder = self._dir(generation)
        folder.mkdir(parents=True, exist_ok=True)
        record = {"name": model.name, "dimension": model.dimension}
        write_atomic(folder / EMBEDDING, json.dumps(record).encode("utf-8"))

    def open(self, generation: int, dimension: int) -> tuple[LexicalIndex, VectorIndex]:
        folder = self._dir(generation)
        if self._fused:
            assert self._server is not None
            name = self._server.fused_name(generation)
            index = self._server.hybrid_collection(name, dimension, typos=self._typos)
            pair = OneCollection(index, index)
            return pair.lexical, pair.vectors
        lexical: LexicalIndex
        if self._lexical == TANTIVY:
            lexical = TantivyIndex(folder / "lexical", typos=self._typos)
        elif self._server is None:
            lexical = EdgeLexicalIndex(folder / "lexical-sparse", typos=self._typos)
        else:
            name = self._server.lexical_name(generation)
            lexical = self._server.lexical_collection(name, typos=self._typos)
        try:
            vectors: VectorIndex
            if self._server is None:
                vectors = EdgeVectorIndex(folder / "vectors", dimension)
            elif self._lease is not None:
                vectors = self._shared_index(self._server, self._lease, dimension)
            else:
                vectors = self._server.vector_collection(self._server.name(generation), dimension)
        except BaseException:
            lexical.close()
            raise
        return lexical, vectors

    def _shared_index(
        self, server: QdrantServer, lease: WriterLease, dimension: int
    ) -> LeasedIndex:
        if self._shared is None:
            collection = server.vector_collection(server.shared_name, dimension)
            self._shared = LeasedIndex(collection, lease)
        return self._shared

    def remove(self, generation: int) -> None:
        folder = self._dir(generation)
        if folder.exists():
            shutil.rmtree(folder)
        if self._server is not None and self._lease is None:
            self._server.drop(
                self._server.name(generation),
                self._server.lexical_name(generation),
                self._server.fused_name(generation),
            )

    def close(self) -> None:
        """Hand the shared collection's writer lease back and close it (cluster mode)."""
        shared, self._shared = self._shared, None
        if shared is not None:
            shared.shutdown()


class SharedIndexSet:
    """`IndexSet` of stateless mode: the vector and BM25 indexes are collections on a
    Qdrant server that every replica shares, each written by the holder of its lease;
    nothing is kept on this replica's disk. There is one generation, forever: a replica
    cannot rebuild what the others are searching (docs/recall.md says how to rebuild
    the collections), and erased points leave the server's segments by its optimizer,
    with no rebuild of this replica's.

    `lexical_lease` None: server-side fusion, one collection holding both vectors
    (`shared_fused_name`), written by the holder of `vector_lease`."""

    def __init__(
        self,
        server: QdrantServer,
        vector_lease: WriterLease,
        lexical_lease: WriterLease | None,
        *,
        typos: bool = False,
    ) -> None:
        self._server = server
        self._typos = typos
        self._vector_lease = vector_lease
        self._lexical_lease = lexical_lease
        self._vectors: LeasedIndex | None = None
        self._lexical: LeasedIndex | None = None
        self._pair: OneCollection | None = None

    @property
    def vector_backend(self) -> str:
        return QDRANT

    @property
    def lexical_backend(self) -> str:
        return QDRANT

    @property
    def local_files(self) -> bool:
        return False

    @property
    def shared_vectors(self) -> bool:
        return True

    def current(self) -> int:
        return 1

    def set_current(self, generation: int) -> None:
        if generation != 1:
            raise ValueError("stateless mode has one generation")

    def embedding(self, generation: int) -> EmbeddingModel | None:
        return None  # the configured model (a shared collection's cannot change)

    def set_embedding(self, generation: int, model: EmbeddingModel) -> None:
        raise ValueError("stateless mode records no model: its collections are shared")

    def purge_pending(self) -> bool:
        return False

    def set_purge_pending(self, pending: bool) -> None:
        """Nothing to record: no file of this replica's holds erased documents."""

    @property
    def fused(self) -> bool:
        return self._lexical_lease is None

    def open(self, generation: int, dimension: int) -> tuple[LexicalIndex, VectorIndex]:
        if self._lexical_lease is None:
            if self._pair is None:
                name = self._server.shared_fused_name
                index = self._server.hybrid_collection(name, dimension, typos=self._typos)
                self._vectors = LeasedIndex(index, self._vector_lease)
                self._pair = OneCollection(index, self._vectors, owned=False)
            return self._pair.lexical, self._pair.vectors
        if self._lexical is None:
            self._lexical = LeasedIndex(
                self._server.lexical_collection(
                    self._server.shared_lexical_name, typos=self._typos
                ),
                self._lexical_lease,
                gauge=metrics.LEXICAL_WRITER,
            )
        if self._vectors is None:
            self._vectors = LeasedIndex(
                self._server.vector_collection(self._server.shared_name, dimension),
                self._vector_lease,
            )
        return self._lexical, self._vectors

    def remove(self, generation: int) -> None:
        """Nothing of a generation's is this replica's to delete."""

    def close(self) -> None:
        """Hand both writer leases back and close the collections."""
        for index in (self._lexical, self._vectors):
            if index is not None:
                index.shutdown()
        self._lexical = self._vectors = None
        self._pair = None
