"""The retrieval use cases: write, search, delete, status and an online reindex.

Blocking work (SQLite fsyncs, Tantivy, the vector engine) runs on the service's own
thread pool, never on the event loop, so health checks and other calls keep flowing
while a write waits for its fsync.

Index generations. The live lexical + vector pair is one *generation*. A reindex builds
generation n+1 beside n from the turn store while n keeps serving, catches up with the
writes made meanwhile, then switches: searches that started on n finish on n, and n is
closed and removed once the last of them is done. Which generation is live is recorded
durably (IndexSet.set_current), so a crash mid-rebuild restarts on the old one.

Purge after an erasure. A deletion makes a document unsearchable at once, but Tantivy
keeps its terms in the segment until a merge rewrites it, and the vector engine keeps the
vector in its segment file: both are the erased text in another form. So once an erasure
reached the live indexes, a rebuild (the same online reindex) follows `purge_delay_s`
later, coalescing the erasures made meanwhile; the old generation's files are deleted
when it switches. The bound on erased content in this replica's index files is therefore
purge_delay_s plus one rebuild (docs/security.md). The pending purge is recorded durably
(IndexSet.set_purge_pending): a restart before it ran runs it. Every replica purges its
own indexes, since each applies the feed's deletions itself.

Embedding models. Each generation's vector index holds one model's vectors (recorded with
the generation). A reindex may name another model: the new generation is then built with
every turn embedded again through the embedding service, while the old one serves with
the old model, and callers learn the live model from every Write and Search reply. A
query or write that still comes with the old model's vector meanwhile is embedded again
here (the projector does it for writes), so nothing is refused during a switch.

Replicas (cluster mode). Several replicas share the turn store; each projects it into
indexes of its own. A write waited for (`wait_searchable`, and Delete's wait) returns
once it is searchable here AND on every other live replica (`Replicas`), so the next
search finds it whichever replica answers; searches themselves never talk to the others.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import ParamSpec, TypeVar

from hippo_core.errors import FailedPrecondition, HippoError, InvalidArgument, NotFound
from hippo_retrieval import metrics
from hippo_retrieval.domain.models import (
    Cursor,
    EmbeddingModel,
    Mode,
    NewTurn,
    Scope,
    SessionStats,
    StoredTurn,
    UserStats,
    Vector,
)
from hippo_retrieval.domain.ports import (
    Embedder,
    IndexSet,
    LexicalIndex,
    Replicas,
    TurnStore,
    VectorIndex,
)
from hippo_retrieval.domain.projector import Projector
from hippo_retrieval.domain.retriever import FusionConfig, Retriever, SearchResult
from hippo_retrieval.domain.validation import (
    Limits,
    check_filter,
    check_limit,
    check_list,
    check_repairs,
    check_turns,
    check_vector,
    no_nul,
    require,
)

log = logging.getLogger(__name__)

P = ParamSpec("P")
T = TypeVar("T")

# How long Delete waits for both indexes to apply an erasure before answering. The erasure
# is already durable and invisible (search results are read back from the turn store);
# this only keeps the index files from holding erased vectors after Forget returns.
DELETE_VISIBLE_S = 5.0


@dataclass(frozen=True)
class ProjectionConfig:
    commit_interval_s: float = 0.5
    commit_every: int = 1000
    # Delay between an erasure reaching the indexes and the rebuild that purges their
    # files (module docstring); None: never (tests of other behaviour).
    purge_delay_s: float | None = 60.0
    # The metadata keys both indexes hold, as filter terms, and Search and List filter on
    # (settings.filter_keys). Declaring another one needs a reindex for older turns.
    filter_keys: frozenset[str] = frozenset()
    # Vectors worth an HNSW graph (settings.graph_min_points); 0: always search exactly.
    graph_min_points: int = 0
    graph_check_s: float = 30.0  # how often the projector's progress looks at the graph


GRAPH_RETRY_S = 600.0  # after a failed graph rebuild
# A rebuild fills the new indexes at half speed (it sleeps as long as each page took):
# searches on the live ones share the process's GIL with it.
REBUILD_PACE = 1.0


@dataclass(frozen=True)
class WriteResult:
    turns: list[tuple[StoredTurn, bool]]  # (stored turn, created now) in request order
    searchable: bool
    embedding_model: str = ""  # the live index's model (callers embed with it next)


@dataclass(frozen=True)
class Status:
    last_seq: int
    lexical_seq: int
    vector_seq: int
    vector_backend: str
    dimension: int
    turns: int
    generation: int
    tenant_turns: int = 0  # of the tenant asked about, if any
    embedding_model: str = ""
    vectors_outside_graph: int = 0
    rebuilding: bool = False
    lexical_backend: str = "tantivy"


@dataclass(frozen=True)
class ReindexProgress:
    applied: int
    last_seq: int
    done: bool
    embedded: int = 0  # turns embedded again for the new index's model
    embedding_model: str = ""


class _Generation:
    """One live pair of indexes, its projector and retriever, and the searches using it."""

    def __init__(
        self,
        number: int,
        store: TurnStore,
        lexical: LexicalIndex,
        vectors: VectorIndex,
        fusion: FusionConfig,
        projection: ProjectionConfig,
        on_progress: Callable[[int, int, int], None],
        on_deleted: Callable[[int], None],
        model: EmbeddingModel,
        legacy_model: str,
        embedder: Embedder | None,
    ) -> None:
        self.number = number
        self.model = model
        self.lexical = lexical
        self.vectors = vectors
        self.projector = Projector(
            store,
            lexical,
            vectors,
            commit_interval_s=projection.commit_interval_s,
            commit_every=projection.commit_every,
            filter_keys=projection.filter_keys,
            on_progress=on_progress,
            on_deleted=on_deleted,
            model=model,
            legacy_model=legacy_model,
            embedder=embedder,
        )
        # Deletions up to this seq cannot have left anything in these indexes: a rebuild
        # started after they committed never indexed the erased turns.
        self.purge_floor = 0
        self.retriever = Retriever(store, lexical, vectors, fusion)
        self.users = 0  # searches in flight, guarded by RetrievalService._lock

    def close_indexes(self) -> None:
        try:
            self.lexical.close()
        finally:
            self.vectors.close()


class RetrievalService:
    def __init__(
        self,
        store: TurnStore,
        indexes: IndexSet,
        *,
        fusion: FusionConfig,
        projection: ProjectionConfig,
        limits: Limits,
        threads: int = 4,
        replicas: Replicas | None = None,
        embedding: EmbeddingModel | None = None,
        embedder: Embedder | None = None,
    ) -> None:
        self._store = store
        # The model of generations made before models were recorded, and of vectors
        # stored without a name; `embedder` re-embeds for a generation of another model.
        self._legacy = embedding or EmbeddingModel("", limits.dimension)
        self._embedder = embedder
        self._replicas = replicas
        self._store_seq = -1  # the feed head at the last progress report (replicas only)
        self._indexes = indexes
        self._fusion = fusion
        self._projection = projection
        self._limits = limits
        self._pool = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="retrieval")
        self._lock = threading.Condition()
        self._live: _Generation | None = None
        self._reindexing = False
        self._purge_wanted = False  # an erasure reached the live files since the last rebuild
        self._purge_timer: threading.Timer | None = None
        self._closing = False
        self._graph_check_at = 0.0  # monotonic time of the next look at the live graph

    # -- lifecycle ---------------------------------------------------------------------

    def open(self, progress: Callable[[int], None] | None = None) -> int:
        """Open the live generation and apply what it missed (blocking: warm-up runs it
        off the event loop). Returns the number of changes applied while catching up."""
        number = self._indexes.current()
        # Leftovers of a rebuild that crashed before (n+1) or after (n-1) its switch.
        for stale in (number - 1, number + 1):
            if stale >= 1:
                self._indexes.remove(stale)
        live = self._generation(number)
        last = self._store.last_seq()
        if live.lexical.applied_seq() > last:
            # The store is behind what these indexes applied: it was restored from a backup
            # (or replaced). They hold turns it no longer has, and would skip the seqs it
            # hands out next as already applied: rebuild them from the store.
            log.warning(
                "indexes applied seq %d but the turn store ends at %d (restored?): rebuilding",
                live.lexical.applied_seq(),
                last,
            )
            live.close_indexes()
            self._indexes.remove(number)
            live = self._generation(number)
        applied = live.projector.catch_up(progress, wait_shared=True)
        if self._replicas is not None:
            # Announce, then catch up once more: a write committed before the announcement
            # is searchable here before this replica serves; the writer of a later one
            # sees this replica and waits for it.
            self._replicas.join(live.projector.visible_seq(), self._wake)
            applied += live.projector.catch_up(wait_shared=True)
        live.projector.start()
        self._live = live
        if self._indexes.purge_pending():
            self._want_purge()  # an erasure the previous run had not purged yet
        if self._replicas is not None:
            self._replicas.progress(live.projector.visible_seq())
        metrics.TURNS.set(self._store.size())
        log.info("indexes open: generation %d, %d changes caught up", number, applied)
        return applied

    def close(self) -> None:
        """Apply and commit what is pending, then close the indexes and the store."""
        with self._lock:
            self._closing = True
            if self._purge_timer is not None:
                self._purge_timer.cancel()  # still recorded: the next start purges
            while self._reindexing:  # a rebuild must not lose its indexes underneath
                self._lock.wait()
        live, self._live = self._live, None
        try:
            if self._replicas is not None:
                self._replicas.close()  # the others stop waiting for this replica now
            if live is not None:
                live.projector.close()
                live.close_indexes()
        finally:
            try:
                self._indexes.close()
            finally:
                self._pool.shutdown(wait=True)
                self._store.close()

    # -- use cases ---------------------------------------------------------------------

    async def write(
        self, tenant: str, turns: Sequence[NewTurn], wait_searchable: bool, timeout: float | None
    ) -> WriteResult:
        live = self._require_live()
        turns = [self._named(t, live.model) for t in turns]
        check_turns(tenant, turns, self._limits, live.model)
        if any(t.tenant != tenant for t in turns):
            raise InvalidArgument("turns", "every turn must belong to the request's tenant")
        if self._embedder is None and any(
            t.vector is not None and t.vector_model != live.model.name for t in turns
        ):
            raise self._no_embedder(live.model)
        stored = await self._run(self._store.append, turns)
        created = sum(1 for _, new in stored if new)
        metrics.WRITES.labels("created").inc(created)
        metrics.WRITES.labels("existing").inc(len(stored) - created)
        if created:
            metrics.TURNS.inc(created)
        live = self._require_live()
        live.projector.notify(urgent=wait_searchable)
        searchable = False
        if wait_searchable:
            searchable = await self._wait_visible(max(t.seq for t, _ in stored), timeout)
        return WriteResult(stored, searchable, self._require_live().model.name)

    async def search(
        self,
        scope: Scope,
        query: str,
        vector: Vector | None,
        mode: Mode,
        top_k: int,
        vector_model: str = "",
        query_repairs: Mapping[str, str] | None = None,
    ) -> SearchResult:
        require("tenant", scope.tenant)
        require("user_id", scope.user)
        check_filter(scope.metadata, self._projection.filter_keys)
        check_repairs(query_repairs or {})
        if mode in (Mode.HYBRID, Mode.LEXICAL) and not query.strip():
            raise InvalidArgument("query", f"is required in {mode.value} mode")
        if mode in (Mode.HYBRID, Mode.SEMANTIC) and vector is None:
            raise InvalidArgument("vector", f"is required in {mode.value} mode")
        with metrics.SEARCH_SECONDS.labels(mode.value).time(), self._using() as live:
            if vector is not None and vector_model and vector_model != live.model.name:
                vector = await self._query_vector(query, live.model)
            if vector is not None:
                check_vector("vector", vector, live.model.dimension)
            result = await self._run(
                live.retriever.search, scope, query, vector, mode, top_k, query_repairs
            )
        if not result.engine_fused:  # the engine's fusion does not say
            metrics.CANDIDATES.labels("lexical").observe(result.lexical_candidates)
            metrics.CANDIDATES.labels("semantic").observe(result.semantic_candidates)
        return replace(result, embedding_model=live.model.name)

    async def get(self, tenant: str, user: str, memory_ids: Sequence[str]) -> list[StoredTurn]:
        require("tenant", tenant)
        require("user_id", user)
        if not 1 <= len(memory_ids) <= self._limits.max_get:
            raise InvalidArgument(
                "memory_ids", f"must hold 1..{self._limits.max_get} ids, got {len(memory_ids)}"
            )
        return await self._run(self._store.get, tenant, user, memory_ids)

    async def update_metadata(
        self,
        tenant: str,
        user: str,
        memory_id: str,
        set_: Mapping[str, str],
        remove: Sequence[str],
        vector: Vector | None = None,
        vector_model: str = "",
    ) -> tuple[StoredTurn, bool]:
        """One turn's metadata changed (its text never is), re-indexed through the feed
        as a touch: the BM25 document and the filter terms are rebuilt from the new
        metadata, and the vector index takes the new vector when one is given."""
        require("tenant", tenant)
        require("user_id", user)
        require("memory_id", memory_id)
        if vector is not None:
            check_vector("vector", vector, self._require_live().model.dimension)
        result = await self._run(
            self._store.update_metadata,
            tenant,
            user,
            memory_id,
            set_,
            remove,
            vector,
            vector_model or (self._require_live().model.name if vector is not None else ""),
        )
        if result is None:
            raise NotFound(f"memory_id: no turn {memory_id!r} for this user")
        if result[1]:
            self._require_live().projector.notify()
        return result

    async def list_turns(
        self, scope: Scope, newest_first: bool, after: Cursor | None, limit: int
    ) -> tuple[list[StoredTurn], Cursor | None]:
        """A page of the scope's turns by (time_us, seq), and the cursor of its last turn
        when more follow (None: the last page). One row more than asked tells which."""
        check_list(scope, after, limit, self._limits)
        check_filter(scope.metadata, self._projection.filter_keys)
        rows = await self._run(
            self._store.list_turns,
            scope,
            newest_first=newest_first,
            after=after,
            limit=limit + 1,
        )
        page = rows[:limit]
        more = len(rows) > limit
        return page, Cursor(page[-1].time_us, page[-1].seq) if more else None

    async def list_sessions(
        self, tenant: str, user: str, after: str, limit: int
    ) -> tuple[list[SessionStats], str]:
        """A page of the user's sessions by id, and the last id when more follow ("")."""
        require("tenant", tenant)
        require("user_id", user)
        no_nul("after", after)
        check_limit(limit, self._limits)
        rows = await self._run(self._store.list_sessions, tenant, user, after, limit + 1)
        page = rows[:limit]
        return page, page[-1].session if len(rows) > limit else ""

    async def list_users(self, tenant: str, after: str, limit: int) -> tuple[list[UserStats], str]:
        """A page of the tenant's users by id, and the last id when more follow ("")."""
        require("tenant", tenant)
        no_nul("after", after)
        check_limit(limit, self._limits)
        rows = await self._run(self._store.list_users, tenant, after, limit + 1)
        page = rows[:limit]
        return page, page[-1].user if len(rows) > limit else ""

    async def delete(
        self,
        tenant: str,
        user: str,
        session: str | None,
        memory_ids: Sequence[str],
        timeout: float | None,
    ) -> list[str]:
        require("tenant", tenant)
        require("user_id", user)
        if session is not None:
            require("session_id", session)
        if len(memory_ids) > self._limits.max_memory_ids:
            raise InvalidArgument(
                "memory_ids", f"at most {self._limits.max_memory_ids} ids, got {len(memory_ids)}"
            )
        erased = await self._run(
            self._store.delete, tenant, user, session=session, memory_ids=memory_ids
        )
        if erased:
            metrics.DELETES.inc(len(erased))
            metrics.TURNS.dec(len(erased))
            wait = DELETE_VISIBLE_S if timeout is None else min(timeout, DELETE_VISIBLE_S)
            if not await self._wait_visible(self._store.last_seq(), wait):
                log.warning("delete: indexes had not applied the erasure within %.1f s", wait)
        return erased

    def status(self, tenant: str = "") -> Status:
        """The stores' state; with `tenant`, also how many turns that tenant stores."""
        live = self._require_live()
        lexical, vectors = live.lexical.applied_seq(), live.vectors.applied_seq()
        graph = live.vectors.graph_state()
        return Status(
            last_seq=self._store.last_seq(),
            lexical_seq=lexical,
            vector_seq=vectors,
            vector_backend=self._indexes.vector_backend,
            dimension=live.model.dimension,
            turns=self._store.size(),
            generation=live.number,
            tenant_turns=self._store.tenant_size(tenant) if tenant else 0,
            embedding_model=live.model.name,
            vectors_outside_graph=graph.outside if graph is not None else 0,
            rebuilding=self._reindexing,
            lexical_backend=self._indexes.lexical_backend,
        )

    async def reindex(self, embedding_model: str = "") -> AsyncIterator[ReindexProgress]:
        """Rebuild both indexes from the turn store beside the live ones, then switch;
        with `embedding_model` (another model than the live one), the new vector index
        holds that model's vectors. A caller that goes away does not stop it: the rebuild
        completes on its own."""
        if not self._indexes.local_files:
            raise FailedPrecondition(
                "stateless mode: both indexes are Qdrant collections every replica shares, "
                "and no replica's reindex can rebuild what the others search; "
                "docs/recall.md says how to rebuild them",
                reason="STATELESS",
            )
        model = await self._reindex_model(embedding_model)
        with self._lock:
            if self._reindexing:
                raise FailedPrecondition("a reindex is already running", reason="REINDEX_RUNNING")
            self._reindexing = True
        queue: asyncio.Queue[ReindexProgress | None] = asyncio.Queue()
        loop = asyncio.get_running_loop()

        def report(applied: int, done: bool = False, embedded: int = 0) -> None:
            item = ReindexProgress(applied, self._store.last_seq(), done, embedded, model.name)
            loop.call_soon_threadsafe(queue.put_nowait, item)

        job = loop.run_in_executor(self._pool, self._rebuild, report, False, model)
        # Scheduled after every report the rebuild made, so it arrives last.
        job.add_done_callback(lambda _: queue.put_nowait(None))
        while (item := await queue.get()) is not None:
            yield item
        await job  # raises what the rebuild raised

    # -- internals ---------------------------------------------------------------------

    @staticmethod
    def _named(turn: NewTurn, model: EmbeddingModel) -> NewTurn:
        """The turn with its vector's model named (empty: the live index's)."""
        if turn.vector is None:
            return replace(turn, vector_model="") if turn.vector_model else turn
        return turn if turn.vector_model else replace(turn, vector_model=model.name)

    def _no_embedder(self, model: EmbeddingModel) -> FailedPrecondition:
        return FailedPrecondition(
            f"the index holds vectors of {model.name or 'the configured model'} and this "
            "service has no embedding service to embed others with "
            "(HIPPO_RETRIEVAL_EMBEDDING_ADDR)",
            reason="EMBEDDING_MODEL",
        )

    async def _query_vector(self, query: str, model: EmbeddingModel) -> Vector:
        """The query embedded with the live model (its caller embedded it with another:
        it has not learnt of a switch yet)."""
        if self._embedder is None or not query.strip():
            raise self._no_embedder(model)
        embedder = self._embedder
        rows = await self._run(lambda: embedder.embed([query], model.name))
        metrics.QUERY_REEMBEDDED.inc()
        row: Vector = rows[0]
        return row

    async def _reindex_model(self, name: str) -> EmbeddingModel:
        """The model a reindex builds with: the live one, or `name` as the embedding
        service has it loaded (checked before anything starts)."""
        live = self._require_live().model
        if not name or name == live.name:
            return live
        if self._embedder is None:
            raise self._no_embedder(live)
        if self._indexes.shared_vectors:
            raise FailedPrecondition(
                "every replica searches one shared vector collection (cluster mode with a "
                "Qdrant server); its model cannot change by a replica's reindex: "
                "docs/recall.md says how to switch it",
                reason="EMBEDDING_MODEL",
            )
        embedder = self._embedder
        loaded = await self._run(embedder.models)
        for model in loaded:
            if model.name == name:
                return model
        names = ", ".join(m.name for m in loaded)
        raise InvalidArgument(
            "embedding_model", f"{name!r} is not loaded by the embedding service (it has {names})"
        )

    def _generation(self, number: int, model: EmbeddingModel | None = None) -> _Generation:
        model = model or self._indexes.embedding(number) or self._legacy
        lexical, vectors = self._indexes.open(number, model.dimension)

        def on_progress(store_seq: int, lexical_seq: int, vector_seq: int) -> None:
            self._progress(number, store_seq, lexical_seq, vector_seq)

        def on_deleted(seq: int) -> None:
            if seq > generation.purge_floor:
                self._want_purge()

        generation = _Generation(
            number,
            self._store,
            lexical,
            vectors,
            self._fusion,
            self._projection,
            on_progress,
            on_deleted,
            model,
            self._legacy.name,
            self._embedder,
        )
        generation.purge_floor = lexical.applied_seq()
        return generation

    def _want_purge(self) -> None:
        """An erasure reached the index files (on the projector's thread): record it, and
        arm the purge unless it is armed already (erasures meanwhile coalesce)."""
        delay = self._projection.purge_delay_s
        if delay is None or not self._indexes.local_files:
            return  # (stateless: no file here holds the erased; the server's optimizer)
        with self._lock:
            first = not self._purge_wanted
            self._purge_wanted = True
        if first:
            self._indexes.set_purge_pending(True)
        self._arm_purge(delay)

    def _arm_purge(self, delay: float) -> None:
        with self._lock:
            if self._closing or (self._purge_timer is not None and self._purge_timer.is_alive()):
                return
            timer = threading.Timer(delay, self._purge_due)
            timer.daemon = True
            self._purge_timer = timer
        timer.start()

    def _purge_due(self) -> None:
        """The delay is over: rebuild on the pool (a reindex running meanwhile is waited
        out, then the purge runs after it, as it may have read the feed too early)."""
        with self._lock:
            self._purge_timer = None
            if self._closing or not self._purge_wanted:
                return
            busy = self._reindexing
            if not busy:
                self._reindexing = True
        if busy:
            self._arm_purge(1.0)
            return
        try:
            self._pool.submit(self._rebuild, lambda *_: None, True)
        except RuntimeError:  # the pool is shutting down: the next start purges
            with self._lock:
                self._reindexing = False

    def _progress(self, number: int, store_seq: int, lexical_seq: int, vector_seq: int) -> None:
        """A projector step ended (on its thread)."""
        metrics.record_progress(store_seq, lexical_seq, vector_seq)
        live = self._live
        if live is not None and live.number == number:
            self._check_graph(live)
        if self._replicas is None or live is None or live.number != number:
            return  # a generation being rebuilt is not what this replica searches
        self._replicas.progress(min(lexical_seq, vector_seq))
        if store_seq != self._store_seq:
            # Other replicas write too: counting this replica's writes cannot give the
            # total, the store can (cheaply: its head keeps the count).
            self._store_seq = store_seq
            metrics.TURNS.set(self._store.size())

    def _check_graph(self, live: _Generation) -> None:
        """Every graph_check_s: start a background rebuild when enough of the live
        vectors are searched outside the graph (GraphState.due says how many)."""
        now = time.monotonic()
        if not self._projection.graph_min_points or now < self._graph_check_at:
            return
        self._graph_check_at = now + self._projection.graph_check_s
        state = live.vectors.graph_state()
        if state is None:
            return
        metrics.VECTORS_OUTSIDE_GRAPH.set(state.outside)
        if not state.due(self._projection.graph_min_points):
            return
        with self._lock:
            if self._closing or self._reindexing:
                return
            self._reindexing = True
        log.info(
            "%d of %d vectors are outside the graph: rebuilding in the background",
            state.outside,
            state.points,
        )
        try:
            self._pool.submit(self._rebuild, lambda *_: None, graph=True)
        except RuntimeError:  # the pool is shutting down
            with self._lock:
                self._reindexing = False

    def _build_graph(self, new: _Generation) -> None:
        """Give a generation being rebuilt its graph, when it holds enough vectors."""
        state = new.vectors.graph_state()
        minimum = self._projection.graph_min_points
        if state is None or not minimum or state.points < minimum:
            return
        start = time.monotonic()
        new.vectors.build_graph(lambda: self._closing)
        metrics.GRAPH_BUILD_SECONDS.observe(time.monotonic() - start)

    def _wake(self, urgent: bool) -> None:
        """Another replica wrote to the feed (urgent: and waits to see it searchable)."""
        live = self._live
        if live is not None:
            live.projector.notify(urgent=urgent)

    def _rebuild(
        self,
        report: Callable[..., None],
        purge: bool = False,
        model: EmbeddingModel | None = None,
        graph: bool = False,
    ) -> None:
        try:
            self._switch_to_new_generation(report, model)
        except BaseException:
            if not (purge or graph):
                raise  # the caller's Reindex reports it
            if self._closing:  # the next start takes it up again
                log.info("background rebuild stopped: the service is closing")
                return
            if graph:
                log.exception("rebuild for the vector graph failed; next try in 10 min")
                self._graph_check_at = time.monotonic() + GRAPH_RETRY_S
                return
            log.exception("purge after an erasure failed; retrying in 10 s")
            with self._lock:
                self._reindexing = False
            self._arm_purge(10.0)
        finally:
            with self._lock:
                self._reindexing = False
                self._lock.notify_all()  # a close() waits for the rebuild to end

    def _switch_to_new_generation(
        self, report: Callable[..., None], model: EmbeddingModel | None = None
    ) -> None:
        old = self._require_live()
        number = old.number + 1
        model = model or old.model
        self._indexes.remove(number)  # a half-built generation from an interrupted run
        self._indexes.set_embedding(number, model)
        # Every erasure committed by now is purged by this rebuild; one that reaches the
        # new indexes later (above the floor) asks for the next.
        floor = self._store.last_seq()
        with self._lock:
            wanted, self._purge_wanted = self._purge_wanted, False
        new = self._generation(number, model)
        new.purge_floor = floor
        try:
            applied = new.projector.catch_up(
                lambda total: report(total, False, new.projector.embedded), pace=REBUILD_PACE
            )
            self._build_graph(new)  # minutes at 100k vectors: then take what came meanwhile
            applied += new.projector.catch_up(pace=REBUILD_PACE)
            # The switch: the old projector stops, the new one takes the last writes,
            # starts its thread, and becomes live; then the record is made durable.
            old.projector.stop()
            applied += new.projector.catch_up()
            new.projector.start()
        except BaseException:
            with self._lock:
                self._purge_wanted = self._purge_wanted or wanted
            new.projector.stop()
            new.close_indexes()
            self._indexes.remove(number)
            old.projector.start()
            raise
        with self._lock:
            self._live = new
        self._indexes.set_current(number)
        metrics.REINDEXES.inc()
        with self._lock:  # searches that began on the old generation finish on it
            while old.users:
                self._lock.wait()
        old.close_indexes()
        self._indexes.remove(old.number)
        with self._lock:
            purged = not self._purge_wanted
        if purged:
            self._indexes.set_purge_pending(False)
        log.info(
            "reindex done: generation %d live (%s), %d changes applied, %d turns embedded",
            number,
            model.name or "the configured embedding model",
            applied,
            new.projector.embedded,
        )
        report(applied, True, new.projector.embedded)

    def _require_live(self) -> _Generation:
        live = self._live
        if live is None:
            raise FailedPrecondition("the indexes are not open")
        return live

    @contextmanager
    def _using(self) -> Iterator[_Generation]:
        with self._lock:
            live = self._require_live()
            live.users += 1
        try:
            yield live
        finally:
            with self._lock:
                live.users -= 1
                if not live.users:
                    self._lock.notify_all()

    async def _wait_visible(self, seq: int, timeout: float | None) -> bool:
        """Poll (without holding a thread) until `seq` is searchable here and on every
        other live replica, within `timeout`."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        end = start + (timeout if timeout is not None else 5.0)
        others = await self._ask_replicas(seq)
        while True:
            live = self._require_live()  # re-read: a reindex may switch generations
            here = live.projector.visible_seq() >= seq
            if here and (others is None or others >= seq):
                metrics.VISIBLE_WAIT.labels("visible").observe(loop.time() - start)
                return True
            if loop.time() >= end:
                metrics.VISIBLE_WAIT.labels("timeout").observe(loop.time() - start)
                return False
            if not here:
                live.projector.notify(urgent=True)
            await asyncio.sleep(0.01)
            if self._replicas is not None:
                others = self._replicas.others_visible()

    async def _ask_replicas(self, seq: int) -> int | None:
        """Ask the other replicas to make `seq` searchable now; the lowest seq they can
        search (None: there are none)."""
        if self._replicas is None:
            return None
        try:
            return await self._run(self._replicas.want, seq)
        except HippoError as exc:
            # The write is committed; only the hurry-up was lost. The others still get
            # there at their next batch, and their heartbeats tell when.
            log.warning("could not ask the other replicas to hurry: %s", exc)
            return self._replicas.others_visible()

    async def _run(self, fn: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, lambda: fn(*args, **kwargs))
