"""Nothing acknowledged is lost: restarts, the LLM down, kill -9 mid-merge (then a restart,
or another replica, takes the merge over), two writers (two processes on one store:
replicas), graceful shutdown with a merge in flight. The kill and the replica tests run
on both engines (a SQLite file, PostgreSQL)."""

from __future__ import annotations

import os
import re
import signal
import threading
from pathlib import Path

import pytest
from summariser_harness import (
    Injection,
    append,
    engine_settings,
    exchange,
    flush,
    get,
    ready,
    stub,
    summariser,
)
from tgi_double import TgiDouble

from hippo_core.testing import metric, scrape


def test_the_summary_survives_a_restart(
    tmp_path: Path, injection: Injection, tgi: TgiDouble
) -> None:
    data = tmp_path / "data"
    with summariser(data, injection.addr, tgi.url) as proc:
        s = stub(ready(proc))
        for i in range(6):
            append(s, exchange(i))
        before = flush(s)
        assert before.summary and before.merge_stats.merges >= 1
        assert proc.terminate() == 0
    with summariser(data, injection.addr, tgi.url) as proc:
        after = get(stub(ready(proc)))
    assert after.summary == before.summary
    assert after.version == before.version
    assert [t.memory_id for t in after.window] == [t.memory_id for t in before.window]
    assert after.merge_stats == before.merge_stats


def test_llm_down_append_works_state_is_readable_and_the_merge_follows_its_return(
    tmp_path: Path, injection: Injection, tgi: TgiDouble
) -> None:
    tgi.stop()
    with summariser(tmp_path / "data", injection.addr, tgi.url) as proc:
        s = stub(ready(proc))
        for i in range(6):
            assert append(s, exchange(i)).appended == 2
        state = flush(s, timeout=3)
        assert state.merge_pending and state.summary == ""
        assert len(state.window) == 12 and all(t.tokens > 0 for t in state.window)
        samples = scrape(proc.metrics_url)
        assert metric(samples, "hippo_summariser_llm_errors_total", kind="unavailable") >= 1
        tgi.start()  # back on the same address
        state = flush(s)
        assert not state.merge_pending and state.summary
        assert state.merge_stats.merges >= 1 and state.merge_stats.llm_failures >= 1
        assert state.window_tokens <= state.window_budget


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_kill_9_mid_merge_loses_nothing_and_the_merge_resumes_after_a_restart(
    engine: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    injection: Injection,
    tgi: TgiDouble,
) -> None:
    """The killed process's claim outlives it until its lease runs out (1 s here); then
    the restarted process (a new owner) takes the merge over."""
    data = tmp_path / "data"
    settings = {"claim_lease_seconds": "1", **engine_settings(engine, request)}
    tgi.released.clear()  # every merge waits in the LLM
    with summariser(data, injection.addr, tgi.url, **settings) as proc:
        s = stub(ready(proc))
        for i in range(6):
            append(s, exchange(i))
        assert tgi.received.wait(30)  # a merge is in flight
        os.kill(proc.process.pid, signal.SIGKILL)
        proc.process.wait()
    tgi.received.clear()
    with summariser(data, injection.addr, tgi.url, **settings) as proc:
        s = stub(ready(proc))
        assert tgi.received.wait(30)  # taken over, and held again
        state = get(s)
        assert [t.memory_id for t in state.window] == [
            t.memory_id for i in range(6) for t in exchange(i)
        ]
        assert state.summary == "" and state.merge_pending
        tgi.released.set()
        state = flush(s)
        assert state.summary and not state.merge_pending
        assert state.merge_stats.turns_merged + len(state.window) == 12
        samples = scrape(proc.metrics_url)
        assert metric(samples, "hippo_summariser_claims_total", result="taken_over") >= 1


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_a_replica_killed_mid_merge_is_taken_over_by_another(
    engine: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    injection: Injection,
    tgi: TgiDouble,
) -> None:
    """Two replicas on one store; the one merging dies with SIGKILL. The survivor, which
    never restarts, takes the merge over once the lease runs out and commits it; every
    turn is still there, merged once."""
    data = tmp_path / "data"
    settings = {"claim_lease_seconds": "1", **engine_settings(engine, request)}
    tgi.released.clear()
    with (
        summariser(data, injection.addr, tgi.url, **settings) as doomed,
        summariser(data, injection.addr, tgi.url, **settings) as survivor,
    ):
        s = stub(ready(doomed))
        other = stub(ready(survivor))
        for i in range(6):
            append(s, exchange(i))  # the doomed replica schedules and claims the merge
        assert tgi.received.wait(30)
        assert len(tgi.requests) == 1  # one replica merges the session, not both
        tgi.received.clear()
        os.kill(doomed.process.pid, signal.SIGKILL)
        doomed.process.wait()
        assert tgi.received.wait(30)  # the survivor's sweep took it over
        tgi.released.set()
        state = flush(other)
        assert state.summary and not state.merge_pending
        assert state.turns_total == 12
        assert state.merge_stats.turns_merged + len(state.window) == 12
        assert state.merge_stats.merges >= 1
        samples = scrape(survivor.metrics_url)
        assert metric(samples, "hippo_summariser_claims_total", result="taken_over") >= 1


@pytest.mark.parametrize("engine", ["sqlite", "postgres"])
def test_two_writers_on_one_session_lose_nothing(
    engine: str,
    request: pytest.FixtureRequest,
    tmp_path: Path,
    injection: Injection,
    tgi: TgiDouble,
) -> None:
    """Two processes (replicas) on one store, each appending half the turns of one
    session at once: the claim lets one merge at a time, the compare-and-set keeps every
    merge once."""
    data = tmp_path / "data"
    settings = engine_settings(engine, request)
    with (
        summariser(data, injection.addr, tgi.url, **settings) as one,
        summariser(data, injection.addr, tgi.url, **settings) as two,
    ):
        stubs = [stub(ready(one)), stub(ready(two))]
        errors: list[BaseException] = []

        def writer(k: int) -> None:
            try:
                for i in range(k, 24, 2):
                    append(stubs[k], exchange(i))
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=writer, args=(k,)) for k in (0, 1)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert not errors
        flush(stubs[0])
        state = flush(stubs[1])
        state = flush(stubs[0])  # whichever merged last, both are idle now
        assert not state.merge_pending
        assert state.turns_total == 48
        assert state.merge_stats.turns_merged + len(state.window) == 48
        window_ids = [t.memory_id for t in state.window]
        assert len(set(window_ids)) == len(window_ids)
        # Merged turns are in the summary at most once (no merge was applied twice; the
        # summary keeps what fits its budget, newest first), window turns not at all.
        # (The two writers interleave freely: merge order is commit order, not i.)
        merged = [i for i in range(24) if f"q{i}" not in window_ids]
        for i in merged:
            assert state.summary.count(f"ZX-{7000 + i}.") <= 1
        mentioned = {int(n) - 7000 for n in re.findall(r"ZX-(\d+)", state.summary)}
        assert mentioned and mentioned <= set(merged)


def test_sigterm_with_a_merge_in_flight_stops_cleanly_and_keeps_the_turns(
    tmp_path: Path, injection: Injection, tgi: TgiDouble
) -> None:
    data = tmp_path / "data"
    tgi.released.clear()
    with summariser(data, injection.addr, tgi.url, drain_seconds="0.5") as proc:
        s = stub(ready(proc))
        for i in range(6):
            append(s, exchange(i))
        assert tgi.received.wait(30)
        assert proc.terminate(timeout=30) == 0
        assert '"event": "stopped"' in proc.log_text()
    tgi.released.set()
    with summariser(data, injection.addr, tgi.url) as proc:
        state = flush(stub(ready(proc)))
    assert state.merge_stats.turns_merged + len(state.window) == 12
    assert state.summary and not state.merge_pending
