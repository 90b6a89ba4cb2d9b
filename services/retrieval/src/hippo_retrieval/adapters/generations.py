"""Index generations on disk (Tantivy + edge shard) or on a Qdrant server.

Layout under the data dir:

    indexes/CURRENT            the live generation's number (written atomically)
    indexes/PURGE              present while the live generation's files still hold
                               erased documents (the purge rebuild removes it)
    indexes/g000001/lexical/   Tantivy index
    indexes/g000001/vectors/   qdrant-edge shard (+ vectors.applied.json beside it)
    indexes/g000001/EMBEDDING  the embedding model its vectors come from (JSON: name,
                               dimension), written before the generation is built;
                               absent in generations made before models were recorded

With a Qdrant server, the vectors of generation n live in the collection
`<collection>_g<n>` (and its `_meta` companion) instead; the Tantivy index stays local.
A missing CURRENT means generation 1, so a fresh data dir needs no setup.

Cluster mode with a Qdrant server (`lease` given): every replica searches one collection,
`<collection>_shared`, written by the lease holder (shared_vectors.py). It belongs to no
generation: a replica's reindex rebuilds its own Tantivy index and leaves the collection
alone (other replicas are searching it); docs/recall.md says how to rebuild it.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable
from pathlib import Path

from qdrant_client import QdrantClient

from hippo_core.files import write_atomic
from hippo_retrieval.adapters.edge_vectors import EdgeVectorIndex
from hippo_retrieval.adapters.qdrant_vectors import QdrantVectorIndex
from hippo_retrieval.adapters.shared_vectors import LeasedVectorIndex, WriterLease
from hippo_retrieval.adapters.tantivy_index import TantivyIndex
from hippo_retrieval.domain.models import EmbeddingModel
from hippo_retrieval.domain.ports import LexicalIndex, VectorIndex

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
    ) -> None:
        if timeout_s <= 0:
            raise ValueError("timeout_s must be positive")
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

    @property
    def shared_name(self) -> str:
        """The one collection of cluster mode, shared by every replica."""
        return f"{self.collection}_shared"


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
    ) -> None:
        if lease is not None and server is None:
            raise ValueError("a shared vector index needs a Qdrant server")
        self._root = Path(root) / "indexes"
        self._root.mkdir(parents=True, exist_ok=True)
        self._server = server
        self._lease = lease
        self._shared: LeasedVectorIndex | None = None
        self._typos = typos  # the lexical index repairs query typos (TantivyIndex)

    @property
    def vector_backend(self) -> str:
        return "qdrant" if self._server is not None else "edge"

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
        lexical = TantivyIndex(folder / "lexical", typos=self._typos)
        try:
            vectors: VectorIndex
            if self._server is None:
                vectors = EdgeVectorIndex(folder / "vectors", dimension)
            elif self._lease is not None:
                vectors = self._shared_index(self._server, self._lease, dimension)
            else:
                vectors = self._collection(self._server, self._server.name(generation), dimension)
        except BaseException:
            lexical.close()
            raise
        return lexical, vectors

    def _collection(self, server: QdrantServer, name: str, dimension: int) -> QdrantVectorIndex:
        client = server.client()
        try:
            return QdrantVectorIndex(
                client,
                collection=name,
                dimension=dimension,
                concurrent_searches=server.concurrent_searches,
            )
        except BaseException:
            client.close()
            raise

    def _shared_index(
        self, server: QdrantServer, lease: WriterLease, dimension: int
    ) -> LeasedVectorIndex:
        if self._shared is None:
            collection = self._collection(server, server.shared_name, dimension)
            self._shared = LeasedVectorIndex(collection, lease)
        return self._shared

    def remove(self, generation: int) -> None:
        folder = self._dir(generation)
        if folder.exists():
            shutil.rmtree(folder)
        if self._server is not None and self._lease is None:
            name = self._server.name(generation)
            client = self._server.client()
            try:
                for collection in (name, f"{name}_meta"):
                    if client.collection_exists(collection):
                        client.delete_collection(collection)
            finally:
                client.close()

    def close(self) -> None:
        """Hand the shared collection's writer lease back and close it (cluster mode)."""
        shared, self._shared = self._shared, None
        if shared is not None:
            shared.shutdown()
