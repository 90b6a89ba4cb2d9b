"""Replicas sharing one database: store instances (and whole merge workers) as replicas on
one PostgreSQL (and, where it means the same, two processes' stores on one SQLite file).
Claims never give one session to two replicas; a replica that stops renewing is taken
over and its late commit changes nothing; no merge is done twice or at the same time; the
audit outbox of a replica that died is delivered by another, each event once."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import psycopg
import pytest
from summariser_fakes import WordCounter
from summariser_harness import Store, Stores
from test_summariser_audit import Sink
from tgi_double import echo

from hippo_core.errors import Unavailable
from hippo_core.outbox import DrainConfig, Outbox
from hippo_summariser import metrics
from hippo_summariser.adapters import postgres_store
from hippo_summariser.domain import audit
from hippo_summariser.domain.merge import MergeConfig, Merger
from hippo_summariser.domain.models import (
    Claim,
    MergeEvent,
    MergeOutcome,
    Role,
    SessionKey,
    TurnIn,
)
from hippo_summariser.domain.ports import Completion
from hippo_summariser.domain.service import Budgets, SummariserService
from hippo_summariser.domain.summarise import SummaryConfig

KEY = SessionKey("acme", "u1", "s1")
WINDOW = 60


def exchange(i: int) -> list[TurnIn]:
    return [
        TurnIn(f"q{i}", Role.USER, f"question {i} about item number {i}", i, "Ada"),
        TurnIn(f"a{i}", Role.ASSISTANT, f"answer {i} mentions code X{i}", i, "Bot"),
    ]


@pytest.fixture
def pg(postgres_url: str, tmp_path: Path) -> Iterator[Stores]:
    """Replicas on one PostgreSQL (what only PostgreSQL does: SKIP LOCKED, owners)."""
    made = Stores("postgres", tmp_path, postgres_url)
    yield made
    made.close()


def test_replicas_claiming_at_once_never_get_the_same_session(pg: Stores) -> None:
    replicas = [pg.make(f"replica-{i}") for i in range(3)]
    keys = [SessionKey("acme", "u1", f"s{i}") for i in range(30)]
    for key in keys:
        replicas[0].append(key, exchange(0), 1)
    got: dict[int, list[SessionKey]] = {i: [] for i in range(len(replicas))}
    start = threading.Barrier(len(replicas))

    def claim_all(i: int) -> None:
        start.wait()
        order = keys if i % 2 == 0 else list(reversed(keys))
        for key in order:
            if replicas[i].claim(key, 30).held:
                got[i].append(key)

    threads = [threading.Thread(target=claim_all, args=(i,)) for i in range(len(replicas))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    claimed = [k for held in got.values() for k in held]
    assert sorted(claimed) == sorted(keys)  # each session: exactly one replica
    for i, held in got.items():
        others = [r for j, r in enumerate(replicas) if j != i]
        for key in held:
            assert all(r.claim(key, 30) is Claim.BUSY for r in others)


def test_a_claim_skips_a_session_being_written_instead_of_waiting(pg: Stores) -> None:
    """FOR UPDATE SKIP LOCKED: a replica never queues behind another's write; the
    writer schedules the merge its write calls for."""
    store = pg.make()
    store.append(KEY, exchange(0), 1)
    with psycopg.connect(pg.url) as writer:  # another replica, mid-transaction
        writer.execute(
            f"SELECT 1 FROM {postgres_store.SCHEMA}.sessions WHERE session_id = 's1' FOR UPDATE"
        )
        started = time.monotonic()
        assert store.claim(KEY, 30) is Claim.BUSY
        assert time.monotonic() - started < 2
    assert store.claim(KEY, 30) is Claim.TAKEN


class Partitioned:
    """A replica cut off from the database for its lease renewals (a stall, a network
    partition): everything else reaches the real store."""

    def __init__(self, store: Store) -> None:
        self._store = store

    def renew(self, key: SessionKey, lease_seconds: float) -> bool:
        raise Unavailable("session store: the database is unavailable")

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


class Gate:
    """An LLM that holds every call until `open` is set."""

    def __init__(self) -> None:
        self.open = asyncio.Event()
        self.entered = asyncio.Event()

    async def complete(
        self, prompt: str, *, max_new_tokens: int, stop: Sequence[str]
    ) -> Completion:
        self.entered.set()
        await self.open.wait()
        return Completion(echo(prompt), False, 1)


class OneAtATime:
    """An LLM shared by every replica that records how many merges it served at once."""

    def __init__(self) -> None:
        self.now = 0
        self.most = 0
        self.calls = 0

    async def complete(
        self, prompt: str, *, max_new_tokens: int, stop: Sequence[str]
    ) -> Completion:
        self.now += 1
        self.calls += 1
        self.most = max(self.most, self.now)
        try:
            await asyncio.sleep(0.02)
            return Completion(echo(prompt), False, 1)
        finally:
            self.now -= 1


class Recorder:
    def __init__(self) -> None:
        self.events: list[MergeEvent] = []

    async def on_merge(self, event: MergeEvent) -> None:
        self.events.append(event)


def replica(
    store: Any, llm: object, lease: float = 30.0, observer: Recorder | None = None
) -> SummariserService:
    counter = WordCounter()
    config = MergeConfig(
        window_tokens=WINDOW,
        low_water_tokens=40,
        max_input_tokens=1000,
        summary=SummaryConfig(summary_tokens=400, style="extend"),
        backoff_initial_seconds=0.01,
        backoff_max_seconds=0.05,
        drain_seconds=0.1,
        claim_lease_seconds=lease,
    )
    merger = Merger(store, counter, llm, config, observer, jitter=lambda: 1.0)  # type: ignore[arg-type]
    return SummariserService(store, counter, merger, Budgets(WINDOW, 400, 30.0))


async def test_a_replica_that_stops_renewing_is_taken_over_and_its_late_merge_changes_nothing(
    stores: Stores,
) -> None:
    gate = Gate()
    stalled = replica(Partitioned(stores.make("stalled")), gate, lease=1.0)
    taker_log = Recorder()
    taker = replica(stores.make("taker"), OneAtATime(), lease=1.0, observer=taker_log)
    await taker.resume()  # sweeps for orphans every half lease
    for i in range(6):
        await stalled.append(KEY, exchange(i))
    await gate.entered.wait()  # the stalled replica holds the claim, mid-merge
    view = await taker.get(KEY)
    assert view.merge_pending and view.session.summary == ""
    # Its lease runs out (no renewal reaches the database): the taker's sweep takes the
    # session over and merges it.
    view = await taker.flush(KEY, 10)
    assert not view.merge_pending and view.session.summary
    assert taker_log.events and view.session.stats.merges == len(taker_log.events)
    before = view.session
    gate.open.set()  # the stalled replica wakes and tries to commit its merge
    await stalled.flush(KEY, 2)
    after = (await taker.get(KEY)).session
    assert after.summary == before.summary and after.version == before.version
    assert after.stats.merges == before.stats.merges
    await stalled.close()
    await taker.close()


async def test_replicas_never_merge_a_session_at_once_nor_twice_and_versions_only_grow(
    stores: Stores,
) -> None:
    llm = OneAtATime()
    logs = [Recorder(), Recorder()]
    replicas = [replica(stores.make(f"r{i}"), llm, observer=logs[i]) for i in range(2)]
    seen: list[int] = []
    done = asyncio.Event()
    busy_before = metrics.CLAIMS.labels("busy")._value.get()

    async def watch() -> None:
        while not done.is_set():
            for r in replicas:
                seen.append((await r.get(KEY)).session.version)
            await asyncio.sleep(0)

    async def write(k: int) -> None:
        for i in range(k, 40, 2):
            await replicas[k].append(KEY, exchange(i))
            await asyncio.sleep(0.005)

    watcher = asyncio.create_task(watch())
    await asyncio.gather(write(0), write(1))
    for r in replicas:
        await r.flush(KEY, 30)
    view = await replicas[0].flush(KEY, 30)
    done.set()
    await watcher
    session = view.session
    assert not view.merge_pending
    assert llm.most == 1  # never two merges of the session at once, over both replicas
    events = sorted((e for log in logs for e in log.events), key=lambda e: e.version)
    # The replicas did contend: one found the session held by the other.
    assert metrics.CLAIMS.labels("busy")._value.get() > busy_before
    merged = [m for e in events for m in e.merged_memory_ids]
    assert len(merged) == len(set(merged)) == session.stats.turns_merged  # none twice
    assert len(events) == session.stats.merges
    assert len({e.version for e in events}) == len(events)
    assert session.turns_total == 80
    assert session.stats.turns_merged + len(session.window) == 80
    assert seen == sorted(seen)  # no reader, on either replica, saw a version go back
    for r in replicas:
        await r.close()


async def test_the_outbox_of_a_replica_that_died_is_delivered_by_another_each_event_once(
    pg: Stores,
) -> None:
    dead, alive = pg.make("dead"), pg.make("alive")
    sink = Sink()
    sink.up = True
    config = DrainConfig(batch=2, retry_min_seconds=0.01, retry_max_seconds=0.02, poll_seconds=0.1)

    def drainer(store: Store) -> Outbox[MergeEvent]:
        return Outbox(
            audit.OUTBOX,
            pg.outbox(store),
            deliver=audit.deliverer(sink),
            encode=audit.encode,
            decode=audit.decode,
            config=config,
        )

    dead_session = SessionKey("acme", "u1", "dead")
    dead.append(dead_session, exchange(0) + exchange(1), 1)
    assert dead.claim(dead_session, 30).held
    dead_box = pg.outbox(dead)  # its drainer never ran: it died right after committing
    for n in range(2):
        session = dead.load(dead_session)
        assert session is not None
        seq = session.window[0].seq
        event = MergeEvent(
            dead_session, 0, (session.window[0].memory_id,), 1, 0, 0, 0, 1.0, 1.0, 1, False,
            0.1, f"dead-{n}", 1,
        )  # fmt: skip
        assert dead.commit_merge(
            dead_session,
            session.summary_rev,
            [seq],
            MergeOutcome("s", 1, 0, 0, 0, 1, False, 0),
            1,
            event,
        )
    box = drainer(alive)
    await box.start()
    assert await box.drained(5)
    assert sink.appended == []  # the dead replica's lease still stands: not adopted yet
    dead_box.close()  # its lease on its rows ends with its connection
    box.notify()
    for _ in range(100):
        if len(sink.appended) == 2:
            break
        await asyncio.sleep(0.05)
    assert await box.drained(5)
    assert sink.appended == ["dead-0", "dead-1"]  # in order, once
    await box.close()


def test_an_erasure_in_postgresql_is_followed_by_vacuum(pg: Stores) -> None:
    """The deleted rows' old versions hold the erased text until VACUUM reclaims them:
    Forget runs it on the tables it touched (what else remains: docs/sessions.md)."""
    store = pg.make()
    store.append(KEY, exchange(0), 1)
    query = (
        "SELECT relname FROM pg_stat_user_tables WHERE schemaname = %s AND last_vacuum IS NOT NULL"
    )
    with psycopg.connect(pg.url, autocommit=True) as conn:
        assert conn.execute(query, (postgres_store.SCHEMA,)).fetchall() == []
        assert store.forget("acme", "u1", None, []).sessions_deleted == 1
        vacuumed = {str(r[0]) for r in conn.execute(query, (postgres_store.SCHEMA,))}
    assert vacuumed == {"turns", "sessions", "merge_claims"}
    assert not pg.holds("question 0")


class BusyOnce:
    """The real store, except that its first claim finds the session row busy, and the
    write that made it busy schedules the session again meanwhile (as an Append of this
    very process does when it commits while the worker is asking)."""

    def __init__(self, store: Store, loop: asyncio.AbstractEventLoop) -> None:
        self._store = store
        self._loop = loop
        self.merger: Merger | None = None
        self.busy = 0

    def claim(self, key: SessionKey, lease_seconds: float) -> Claim:
        if self.busy == 0:
            self.busy += 1
            assert self.merger is not None
            merger = self.merger

            async def schedule() -> None:
                merger.schedule(key)

            asyncio.run_coroutine_threadsafe(schedule(), self._loop).result(5)
            return Claim.BUSY
        return self._store.claim(key, lease_seconds)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)


async def test_a_schedule_landing_while_the_claim_finds_the_row_busy_is_not_lost(
    stores: Stores,
) -> None:
    """Regression: the worker's claim skipped the row its own process was writing, and
    that write's schedule() found the worker still running; the worker must ask again
    instead of ending with the session unmerged."""
    store = BusyOnce(stores.make(), asyncio.get_running_loop())
    svc = replica(store, OneAtATime())
    store.merger = svc._merger
    result = await svc.append(KEY, [t for i in range(6) for t in exchange(i)])
    assert result.merge_pending
    assert await svc._merger.idle(KEY, 10)  # no Flush: it would schedule by itself
    assert store.busy == 1
    view = await svc.get(KEY)
    assert view.session.summary and not view.merge_pending
    await svc.close()
