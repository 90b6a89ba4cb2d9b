"""Cluster mode as `make run-cluster` starts it: one PostgreSQL and two replicas of every
service, on loopback, through the launcher. While eight writers replay a chat archive
through the Memory API, a random replica of a random service is killed with SIGKILL every
few seconds (the launcher restarts it, as Kubernetes would). Afterwards every
acknowledged turn is stored exactly once, every retrieval replica's indexes find the
last turns, the audit chain verifies, no summary version went backwards and no merge was
lost or done twice, and no call failed for a caller that retries UNAVAILABLE."""

from __future__ import annotations

import asyncio
import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo.retrieval.v1 import retrieval_pb2, retrieval_pb2_grpc
from hippo_cli.cluster import LocalCluster, local_cluster
from hippo_cli.health import check
from hippo_cli.registry import SERVICES
from hippo_core.testing import metric, scrape

BIN = Path(sys.executable).parent
KEY = (("x-api-key", "hippo-local-dev-key"),)
TENANT = "local"
WRITERS = 8
SESSIONS, TURNS = 3, 8  # per writer: 24 turns, sent two per call
CHAOS_SECONDS = 60.0
KILL_EVERY = (3.0, 5.0)
# Writers 0 and 1 write long turns: their sessions outgrow the window, so merges run (and
# replicas die) during the chaos; the others' stay within it, so the merges left to settle
# on the CPU model afterwards stay few.
WINDOW_TOKENS = 160
LONG_WRITERS = (0, 1)
FULL_NAMES = {s.name: s.full_name for s in SERVICES}
ENV = {
    "HIPPO_SUMMARISER_WINDOW_TOKENS": str(WINDOW_TOKENS),
    "HIPPO_SUMMARISER_SUMMARY_TOKENS": "48",  # short merges on the CPU model
    "HIPPO_SUMMARISER_MERGE_INPUT_TOKENS": "256",
    # A killed replica's claimed merge moves to the other replica this fast.
    "HIPPO_SUMMARISER_CLAIM_LEASE_SECONDS": "5",
}


def text(user: int, session: int, turn: int) -> str:
    # A token no other turn has, so a lexical search finds exactly this turn.
    note = f"Note zq{user}s{session}t{turn}: dock {turn}."
    if user in LONG_WRITERS:
        note += f" The parcel for writer {user} leaves on Tuesday with the blue van and a receipt."
    return note


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory.mktemp("var"), ENV, cluster=True, replicas=2) as c:
        yield c


def _postgres(cluster: LocalCluster) -> str:
    line = next(x for x in cluster.banner.splitlines() if x.strip().startswith("postgres "))
    return line.split()[1]


def _hippo(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "hippo"), *args], env=cluster.env, capture_output=True, text=True, timeout=120
    )


def test_hippo_health_lists_every_replica(cluster: LocalCluster) -> None:
    result = _hippo(cluster, "health", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert set(report) == set(FULL_NAMES)
    for rows in report.values():
        assert len(rows) == 2 and all(r["status"] == "SERVING" for r in rows)
        assert rows[0]["addr"] != rows[1]["addr"]
    table = _hippo(cluster, "health").stdout
    assert "gateway-0" in table and "gateway-1" in table


def test_calls_spread_over_both_replicas_of_each_peer(cluster: LocalCluster) -> None:
    """Round-robin channels: the gateway's calls reach both embedding and both retrieval
    replicas, and a client's calls reach both gateways."""

    async def recalls() -> None:
        target = cluster.gateway
        options = [("grpc.lb_policy_name", "round_robin")]
        async with grpc.aio.insecure_channel(target, options=options) as channel:
            stub = memory_pb2_grpc.MemoryServiceStub(channel)
            for n in range(24):
                request = memory_pb2.RecallRequest(
                    scope=memory_pb2.Scope(user_id="spread"), query=f"question number {n}"
                )
                await stub.Recall(request, metadata=KEY, timeout=30)

    asyncio.run(recalls())
    for service, method in (("gateway", "Recall"), ("embedding", "Embed"), ("retrieval", "Search")):
        for endpoint in cluster.replicas[service]:
            served = metric(
                scrape(endpoint.metrics), "grpc_server_handled_total", grpc_method=method
            )
            assert served > 0, f"{endpoint.name} served no {method}"


@dataclass
class Run:
    acked: dict[str, str] = field(default_factory=dict)  # memory id -> text
    last: dict[int, tuple[str, str]] = field(default_factory=dict)  # writer -> (id, text)
    retried: int = 0
    failures: list[str] = field(default_factory=list)
    versions: dict[str, list[int]] = field(default_factory=dict)  # session -> seen versions
    kills: list[str] = field(default_factory=list)


async def _with_retries(run: Run, call: Any, request: Any, timeout: float) -> Any:
    """An idempotent call, retried on UNAVAILABLE only (the contract callers follow)."""
    wait, end = 0.05, time.monotonic() + 120
    while True:
        try:
            return await call(request, metadata=KEY, timeout=timeout)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE and time.monotonic() < end:
                run.retried += 1
                await asyncio.sleep(wait)
                wait = min(2 * wait, 1.0)
                continue
            run.failures.append(f"{exc.code().name}: {exc.details()}")
            return None


async def _writer(run: Run, stub: Any, n: int, until: float) -> None:
    """Replays this writer's conversation again and again until the chaos ends: the first
    pass stores, later passes are retries that must store nothing twice."""
    first = True
    while first or time.monotonic() < until:
        for s in range(1, SESSIONS + 1):
            for t in range(0, TURNS, 2):
                turns = []
                for k in (t, t + 1):
                    turn = memory_pb2.Turn(
                        role=memory_pb2.ROLE_USER if k % 2 == 0 else memory_pb2.ROLE_ASSISTANT,
                        text=text(n, s, k),
                        client_id=f"w{n}s{s}t{k}",
                    )
                    turn.time.FromMicroseconds(1_700_000_000_000_000 + (s * 100 + k) * 60_000_000)
                    turns.append(turn)
                request = memory_pb2.RememberRequest(
                    scope=memory_pb2.Scope(user_id=f"writer{n}", session_id=f"s{s}"), turns=turns
                )
                reply = await _with_retries(run, stub.Remember, request, 30)
                if reply is not None:
                    for memory_id, turn in zip(reply.memory_ids, turns, strict=True):
                        run.acked[memory_id] = turn.text
                    run.last[n] = (reply.memory_ids[-1], turns[-1].text)
                if first:
                    await asyncio.sleep(1.0)  # spread the first pass over the chaos
        first = False


async def _watch_sessions(run: Run, stub: Any, until: float) -> None:
    while time.monotonic() < until:
        for n in range(0, WRITERS, 2):
            for s in range(1, SESSIONS + 1):
                request = memory_pb2.GetSessionRequest(
                    scope=memory_pb2.Scope(user_id=f"writer{n}", session_id=f"s{s}")
                )
                try:
                    reply = await stub.GetSession(request, metadata=KEY, timeout=10)
                except grpc.aio.AioRpcError:
                    continue  # a killed replica; versions are checked on the answers
                run.versions.setdefault(f"writer{n}/s{s}", []).append(reply.version)
        await asyncio.sleep(0.5)


async def _killer(run: Run, cluster: LocalCluster, until: float) -> None:
    """Every few seconds, SIGKILL one replica of a service whose replicas all serve (so the
    service itself stays up); the launcher restarts it."""
    rng = random.Random(13)
    while time.monotonic() < until:
        await asyncio.sleep(rng.uniform(*KILL_EVERY))
        cluster.refresh()
        services = list(FULL_NAMES)
        rng.shuffle(services)
        for service in services:
            replicas = cluster.replicas[service]
            states = [await check(r.addr, FULL_NAMES[service], timeout=1) for r in replicas]
            if all(s == "SERVING" for s in states):
                victim = rng.choice(replicas)
                os.kill(victim.pid, signal.SIGKILL)
                run.kills.append(victim.name)
                break


async def _chaos(cluster: LocalCluster) -> Run:
    run = Run()
    until = time.monotonic() + CHAOS_SECONDS
    options = [("grpc.lb_policy_name", "round_robin")]
    async with grpc.aio.insecure_channel(cluster.gateway, options=options) as channel:
        stub = memory_pb2_grpc.MemoryServiceStub(channel)
        await asyncio.gather(
            *(_writer(run, stub, n, until) for n in range(WRITERS)),
            _watch_sessions(run, stub, until),
            _killer(run, cluster, until),
        )
    return run


async def _all_serving(cluster: LocalCluster, timeout: float) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        cluster.refresh()
        states = [
            await check(r.addr, FULL_NAMES[name], timeout=2)
            for name, group in cluster.replicas.items()
            for r in group
        ]
        if all(s == "SERVING" for s in states):
            return
        await asyncio.sleep(1)
    raise AssertionError(f"not every replica is SERVING again: {cluster.replicas}")


async def _found_on_every_replica(cluster: LocalCluster, last: dict[int, tuple[str, str]]) -> None:
    """Each retrieval replica, asked directly, finds every writer's last turn by its
    unique word: every replica's projection converged on the shared feed."""
    end = time.monotonic() + 90
    for replica in cluster.replicas["retrieval"]:
        async with grpc.aio.insecure_channel(replica.addr) as channel:
            stub = retrieval_pb2_grpc.RetrievalServiceStub(channel)
            for n, (memory_id, turn_text) in sorted(last.items()):
                word = next(w for w in turn_text.split() if w.startswith("zq"))
                while True:
                    request = retrieval_pb2.SearchRequest(
                        tenant=TENANT,
                        user_id=f"writer{n}",
                        query=word,
                        mode=memory_pb2.RECALL_MODE_LEXICAL,
                        top_k=1,
                    )
                    reply = await stub.Search(request, timeout=10)
                    if reply.hits and reply.hits[0].memory.memory_id == memory_id:
                        break
                    assert time.monotonic() < end, f"{replica.name} never found writer{n}'s turn"
                    await asyncio.sleep(0.5)


def _merges_settled(cluster: LocalCluster, url: str, timeout: float) -> None:
    """Every session back within its window: no merge left pending on any replica."""
    end = time.monotonic() + timeout
    while True:
        cluster.refresh()
        pending = sum(
            metric(scrape(r.metrics), "hippo_summariser_merges_pending")
            for r in cluster.replicas["summariser"]
        )
        with psycopg.connect(url) as conn:
            over = conn.execute(
                "SELECT count(*) FROM (SELECT 1 FROM hippo_summariser.turns WHERE state = "
                "'window' GROUP BY tenant, user_id, session_id "
                "HAVING sum(coalesce(tokens, 0)) > %s OR bool_or(tokens IS NULL)) AS s",
                (WINDOW_TOKENS,),
            ).fetchone()
        if pending == 0 and over is not None and over[0] == 0:
            return
        assert time.monotonic() < end, f"merges not settled: {pending} pending, {over} over budget"
        time.sleep(2)


@pytest.mark.timeout(900)  # a minute of chaos, then merges settling on the CPU model
def test_replicas_killed_under_load_lose_nothing(cluster: LocalCluster) -> None:
    started = time.monotonic()
    run = asyncio.run(_chaos(cluster))
    print(
        f"chaos over after {time.monotonic() - started:.0f} s: {len(run.kills)} kills "
        f"({', '.join(run.kills)}), {run.retried} retried calls",
        file=sys.stderr,
    )
    assert run.kills, "nothing was killed"
    assert run.failures == [], run.failures
    asyncio.run(_all_serving(cluster, timeout=180))
    url = _postgres(cluster)

    # Every acknowledged turn is stored, exactly once, with its text.
    expected = WRITERS * SESSIONS * TURNS
    assert len(run.acked) == expected
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT memory_id, text FROM hippo_retrieval.turns WHERE tenant = %s", (TENANT,)
        ).fetchall()
    stored = Counter(memory_id for memory_id, _ in rows)
    assert stored.most_common(1)[0][1] == 1
    mine = {m: t for m, t in rows if m in run.acked}
    assert mine == run.acked

    # Every retrieval replica's indexes converged.
    asyncio.run(_found_on_every_replica(cluster, run.last))

    # No summary version went backwards, whichever replica answered.
    assert run.versions
    for session, seen in run.versions.items():
        assert seen == sorted(seen), f"{session}: {seen}"

    # Merges: none lost (every session is back within its window, none pending), none done
    # twice (one audit entry per committed version), and each recorded in the audit log.
    _merges_settled(cluster, url, timeout=600)
    print(f"merges settled after {time.monotonic() - started:.0f} s", file=sys.stderr)
    with psycopg.connect(url) as conn:
        row = conn.execute(
            "SELECT coalesce(sum(merges), 0) FROM hippo_summariser.sessions WHERE tenant = %s",
            (TENANT,),
        ).fetchone()
    committed = int(row[0]) if row else 0
    assert committed > 0, "no merge ran during the test"
    print(f"{committed} merges committed", file=sys.stderr)
    end = time.monotonic() + 120
    while len(entries := _merge_entries(cluster)) < committed:
        assert time.monotonic() < end, f"{len(entries)} merge entries for {committed} merges"
        time.sleep(2)
    assert len(entries) == committed and len(set(entries)) == len(entries), entries

    # The chain verifies after concurrent appends from every audit replica.
    result = _hippo(cluster, "audit", "verify", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    assert json.loads(result.stdout)["ok"] is True


def _merge_entries(cluster: LocalCluster) -> list[tuple[str, int]]:
    """(session, version) of every `merge` entry in the audit log, for the test's users."""
    out: list[tuple[str, int]] = []
    for n in range(WRITERS):
        result = _hippo(cluster, "audit", "show", "--user", f"writer{n}", "--json")
        assert result.returncode == 0, result.stderr
        for line in result.stdout.splitlines():
            entry = json.loads(line)
            if entry["event_type"] == "merge":
                out.append((f"writer{n}/{entry['session_id']}", int(entry["body"]["version"])))
    return out
