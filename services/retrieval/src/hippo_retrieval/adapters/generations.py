"""Index generations on disk (Tantivy + edge shard) or on a Qdrant server.

Layout under the data dir:

    indexes/CURRENT            the live generation's number (written atomically)
    indexes/g000001/lexical/   Tantivy index
    indexes/g000001/vectors/   qdrant-edge shard (+ vectors.applied.json beside it)

With a Qdrant server, the vectors of generation n live in the collection
`<collection>_g<n>` (and its `_meta` companion) instead; the Tantivy index stays local.
A missing CURRENT means generation 1, so a fresh data dir needs no setup.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from qdrant_client import QdrantClient

from hippo_retrieval.adapters import qdrant_vectors
from hippo_retrieval.adapters.edge_vectors import EdgeVectorIndex
from hippo_retrieval.adapters.files import write_atomic
from hippo_retrieval.adapters.tantivy_index import TantivyIndex
from hippo_retrieval.domain.ports import LexicalIndex, VectorIndex

CURRENT = "CURRENT"


class QdrantServer:
    """Where server-side collections are: URL, key, name prefix, timeout."""

    def __init__(self, url: str, api_key: str | None, collection: str, timeout_s: float) -> None:
        self.url = url
        self.api_key = api_key
        self.collection = collection
        self.timeout_s = timeout_s

    def name(self, generation: int) -> str:
        return f"{self.collection}_g{generation}"


class LocalIndexSet:
    """`IndexSet` with Tantivy on local disk and vectors in an edge shard, or on a Qdrant
    server when `server` is given."""

    def __init__(
        self, root: Path, *, dimension: int = 384, server: QdrantServer | None = None
    ) -> None:
        self._root = Path(root) / "indexes"
        self._root.mkdir(parents=True, exist_ok=True)
        self._dimension = dimension
        self._server = server

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

    def open(self, generation: int) -> tuple[LexicalIndex, VectorIndex]:
        folder = self._dir(generation)
        lexical = TantivyIndex(folder / "lexical")
        try:
            vectors: VectorIndex
            if self._server is None:
                vectors = EdgeVectorIndex(folder / "vectors", self._dimension)
            else:
                vectors = qdrant_vectors.from_url(
                    self._server.url,
                    self._server.api_key,
                    self._server.timeout_s,
                    collection=self._server.name(generation),
                    dimension=self._dimension,
                )
        except BaseException:
            lexical.close()
            raise
        return lexical, vectors

    def remove(self, generation: int) -> None:
        folder = self._dir(generation)
        if folder.exists():
            shutil.rmtree(folder)
        if self._server is not None:
            name = self._server.name(generation)
            client = QdrantClient(url=self._server.url, api_key=self._server.api_key)
            try:
                for collection in (name, f"{name}_meta"):
                    if client.collection_exists(collection):
                        client.delete_collection(collection)
            finally:
                client.close()
