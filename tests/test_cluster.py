"""The local cluster through the launcher, as `make run` starts it, and the CLI against it."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import locomo_sample
import pytest

from hippo_cli.cluster import LocalCluster, local_cluster
from hippo_cli.registry import SERVICES
from hippo_core.listen import reserve_port
from hippo_core.testing import service_children

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    # Index files are rebuilt 1 s after an erasure (default 60 s), for the canary test.
    env = {"HIPPO_RETRIEVAL_PURGE_DELAY_SECONDS": "1"}
    with local_cluster(tmp_path_factory.mktemp("var"), env) as running:
        yield running
    stopped = "\n".join(running.shutdown)
    for spec in SERVICES:
        assert f"{spec.name} stopped (exit code 0)" in stopped, stopped


def _hippo(
    cluster: LocalCluster | dict[str, str], *args: str, stdin: str = ""
) -> subprocess.CompletedProcess[str]:
    env = cluster.env if isinstance(cluster, LocalCluster) else cluster
    return subprocess.run(
        [str(BIN / "hippo"), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        input=stdin,
    )


def test_banner_shows_endpoints_and_a_first_example(cluster: LocalCluster) -> None:
    for name, addr in cluster.addrs.items():
        assert f"{name:<13} grpc {addr}" in cluster.banner
    assert "hippo remember" in cluster.banner and "MemoryServiceStub" in cluster.banner
    openai = cluster.env["HIPPO_GATEWAY_OPENAI_PORT"]  # the fixture turns every port on
    assert f"OpenAI-compatible API http://127.0.0.1:{openai}/v1" in cluster.banner
    assert f"grpc.insecure_channel('{cluster.gateway}')" in cluster.banner
    assert "('x-api-key', 'hippo-local-dev-key')" in cluster.banner  # the key that works


def test_hippo_health_reports_every_service_serving(cluster: LocalCluster) -> None:
    result = _hippo(cluster, "health", "--json")
    assert result.returncode == 0, result.stdout + result.stderr
    report = json.loads(result.stdout)
    assert set(report) == {spec.name for spec in SERVICES}
    assert all(len(rows) == 1 and rows[0]["status"] == "SERVING" for rows in report.values())


def test_hippo_embed_prints_vectors_and_similarity(cluster: LocalCluster) -> None:
    result = _hippo(
        cluster,
        "embed",
        "--json",
        "I love hiking",
        "Trekking in the hills is my passion",
        "Tax forms",
    )
    assert result.returncode == 0, result.stderr
    vectors = json.loads(result.stdout)["vectors"]
    assert len(vectors) == 3 and len(vectors[0]) == 384
    dot = lambda a, b: sum(x * y for x, y in zip(a, b, strict=True))  # noqa: E731
    assert dot(vectors[0], vectors[1]) > dot(vectors[0], vectors[2])
    table = _hippo(cluster, "embed", "hello world")
    assert "384" in table.stdout and "|v|=1.000" in table.stdout


def test_remember_recall_forget_from_the_terminal(cluster: LocalCluster) -> None:
    stored = _hippo(
        cluster, "remember", "--user", "alice", "--session", "s1", "--json",
        "--client-id", "m1", "--client-id", "m2",
        "I moved to Lisbon in May", "My build fails with ERR_CONNECTION_REFUSED",
    )  # fmt: skip
    assert stored.returncode == 0, stored.stderr
    assert json.loads(stored.stdout)["created"] == 2
    again = _hippo(
        cluster,
        "remember",
        "--user",
        "alice",
        "--session",
        "s1",
        "--client-id",
        "m1",
        "I moved to Lisbon in May",
    )
    assert "stored 0, already stored 1" in again.stdout

    table = _hippo(cluster, "recall", "ERR_CONNECTION_REFUSED", "--user", "alice")
    assert table.returncode == 0, table.stderr
    lines = table.stdout.splitlines()
    assert lines[0].split() == ["#", "fused", "bm25", "vec", "date", "text"]
    assert "ERR_CONNECTION_REFUSED" in lines[1]
    as_json = _hippo(cluster, "recall", "Lisbon", "--user", "alice", "--mode", "lexical", "--json")
    hits = [json.loads(line) for line in as_json.stdout.splitlines()]
    assert hits[0]["client_id"] == "m1" and hits[0]["lexical_rank"] == 1
    assert hits[0]["semantic_rank"] == 0 and "time" in hits[0]
    slipped = _hippo(cluster, "recall", "when did I move to lisbn", "--user", "alice")
    assert slipped.stdout.splitlines()[0] == "(typing slips repaired: lisbn -> lisbon)"
    assert "Lisbon" in slipped.stdout.splitlines()[2]

    forgot = _hippo(cluster, "forget", "--user", "alice", "--yes")
    assert "erased 2 memories" in forgot.stdout
    empty = _hippo(cluster, "recall", "Lisbon", "--user", "alice")
    assert "no memories found" in empty.stdout


def test_replay_a_locomo_file_then_batch_recall_and_reindex(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    sample = {
        "sample_id": "demo-1",
        "conversation": {
            "speaker_a": "Ana",
            "speaker_b": "Ben",
            "session_1_date_time": "1:56 pm on 8 May, 2023",
            "session_1": [
                {"speaker": "Ana", "dia_id": "D1:1", "text": "I adopted a greyhound named Comet."},
                {"speaker": "Ben", "dia_id": "D1:2", "text": "Congrats! Greyhounds are sweet."},
            ],
            "session_2_date_time": "9:00 am on 2 June, 2023",
            "session_2": [
                {
                    "speaker": "Ben",
                    "dia_id": "D2:1",
                    "text": "Look what I baked!",
                    "blip_caption": "a photo of a lemon tart",
                },
            ],
        },
        "qa": [
            {
                "question": "What pet did Ana adopt?",
                "answer": "a greyhound",
                "evidence": ["D1:1"],
                "category": 4,
            }
        ],
    }
    data = tmp_path / "demo.json"
    data.write_text(json.dumps([sample]))
    first = _hippo(cluster, "replay", str(data))
    assert first.returncode == 0, first.stderr
    assert "3 turns of 1 conversations: 3 stored, 0 already stored" in first.stdout
    again = _hippo(cluster, "replay", str(data))
    assert "0 stored, 3 already stored" in again.stdout  # dia_ids are client ids

    queries = tmp_path / "queries.jsonl"
    queries.write_text(
        json.dumps({"user": "demo-1", "query": "What pet did Ana adopt?", "top_k": 2}) + "\n"
        + json.dumps({"user": "demo-1", "query": "tart", "mode": "lexical"}) + "\n"
    )  # fmt: skip
    batch = _hippo(cluster, "recall", "--batch", str(queries))
    assert batch.returncode == 0, batch.stderr
    answers = [json.loads(line) for line in batch.stdout.splitlines()]
    assert answers[0]["hits"][0]["client_id"] == "D1:1" and len(answers[0]["hits"]) <= 2
    assert answers[0]["hits"][0]["time"].startswith("2023-05-08T13:56")
    assert answers[1]["hits"][0]["client_id"] == "D2:1"  # found by its picture's caption

    rebuilt = _hippo(cluster, "reindex")
    assert rebuilt.returncode == 0, rebuilt.stderr
    assert "the new indexes are live" in rebuilt.stdout
    after = _hippo(cluster, "recall", "--batch", str(queries))
    assert [json.loads(x)["hits"][0]["client_id"] for x in after.stdout.splitlines()] == [
        "D1:1",
        "D2:1",
    ]


def test_cli_errors_are_readable(cluster: LocalCluster) -> None:
    result = _hippo(cluster, "embed", "x" * 9000)
    assert result.returncode == 3
    assert "INVALID_ARGUMENT: texts[0]: at most 8192 characters, got 9000" in result.stderr
    bad = _hippo(cluster, "recall", "q", "--user", "no spaces allowed")
    assert bad.returncode == 3
    assert "INVALID_ARGUMENT: scope.user_id: may only hold [A-Za-z0-9._:@-]" in bad.stderr
    wrong_key = _hippo({**cluster.env, "HIPPO_CLI_API_KEY": "nope"}, "recall", "q", "--user", "u")
    assert wrong_key.returncode == 3 and "UNAUTHENTICATED: unknown API key" in wrong_key.stderr


def test_health_fails_when_nothing_listens() -> None:
    env = {**os.environ, "HIPPO_CLI_EMBEDDING_ADDR": f"127.0.0.1:{reserve_port()}"}
    result = _hippo(env, "health")
    assert result.returncode == 1 and "UNREACHABLE" in result.stdout


def _stubs(cluster: LocalCluster):  # type: ignore[no-untyped-def]
    import grpc

    from hippo.injection.v1 import injection_pb2_grpc
    from hippo.memory.v1 import memory_pb2_grpc

    gateway = grpc.insecure_channel(cluster.gateway)
    injection = grpc.insecure_channel(cluster.addrs["injection"])
    return (
        memory_pb2_grpc.MemoryServiceStub(gateway),
        injection_pb2_grpc.InjectionServiceStub(injection),
        (gateway, injection),
    )


KEY = (("x-api-key", "hippo-local-dev-key"),)


def test_build_context_counts_exactly_and_places_memories_first_query_last(
    cluster: LocalCluster,
) -> None:
    from hippo.injection.v1 import injection_pb2
    from hippo.memory.v1 import memory_pb2 as pb

    memory, injection, channels = _stubs(cluster)
    try:
        old = pb.Scope(user_id="ctx-user", session_id="old")
        now = pb.Scope(user_id="ctx-user", session_id="now")
        sister = pb.Turn(
            role=pb.ROLE_USER, text="My sister Lena lives in Porto.", metadata={"speaker": "Ana"}
        )
        memory.Remember(
            pb.RememberRequest(scope=old, turns=[sister], wait_searchable=True),
            metadata=KEY,
            timeout=30,
        )
        memory.Remember(
            pb.RememberRequest(
                scope=now,
                turns=[
                    pb.Turn(role=pb.ROLE_USER, text="I am planning a trip next month."),
                    pb.Turn(role=pb.ROLE_ASSISTANT, text="Nice! Where are you going?"),
                ],
                wait_searchable=True,
            ),
            metadata=KEY, timeout=30,
        )  # fmt: skip
        query = "Where does my sister live?"
        built = memory.BuildContext(
            pb.BuildContextRequest(scope=now, query=query, token_budget=512),
            metadata=KEY,
            timeout=60,
        )
        assert built.tokens.budget == 512 and 0 < built.tokens.total <= 512
        # What was used is in the audit log, and the note is written from that entry.
        assert built.audit_seq > 0 and "Memories used: " in built.disclosure_note
        assert built.memory_ids_used[0] in built.disclosure_note
        exact = injection.CountTokens(
            injection_pb2.CountTokensRequest(text=built.prompt), timeout=30
        )
        assert exact.tokens == built.tokens.total  # the prompt as counted is the prompt returned
        kinds = [z.kind for z in built.zones]
        assert kinds[0] == pb.ZONE_KIND_SYSTEM and kinds[-1] == pb.ZONE_KIND_QUERY
        assert kinds.index(pb.ZONE_KIND_MEMORIES) < kinds.index(pb.ZONE_KIND_WINDOW)
        memories = next(z for z in built.zones if z.kind == pb.ZONE_KIND_MEMORIES)
        assert "Lena lives in Porto" in memories.text and 'speaker="Ana"' in memories.text
        window = next(z for z in built.zones if z.kind == pb.ZONE_KIND_WINDOW)
        assert len(window.memory_ids) == 2 and not set(window.memory_ids) & set(
            built.memory_ids_used
        )
        assert built.prompt.index("Lena lives in Porto") < built.prompt.index("planning a trip")
        assert built.prompt.rstrip().rfind(query) > built.prompt.find("Nice! Where are you going?")
        with pytest.raises(Exception) as err:
            memory.BuildContext(
                pb.BuildContextRequest(scope=now, query=query, token_budget=100),
                metadata=KEY,
                timeout=60,
            )
        assert "token_budget" in str(err.value)
    finally:
        for channel in channels:
            channel.close()


def test_chat_streams_a_reply_and_remembers_the_exchange(cluster: LocalCluster) -> None:
    from hippo.memory.v1 import memory_pb2 as pb

    memory, _, channels = _stubs(cluster)
    try:
        scope = pb.Scope(user_id="chat-user", session_id="s1")
        events = list(
            memory.Chat(
                pb.ChatRequest(
                    scope=scope,
                    message="Say hello to Bob.",
                    params=pb.GenerationParameters(max_new_tokens=8),
                ),
                metadata=KEY,
                timeout=120,
            )
        )
        kinds = [e.WhichOneof("event") for e in events]
        assert kinds[0] == "start" and kinds[-1] == "end" and set(kinds[1:-1]) <= {"token"}
        tokens = [e.token for e in events if e.WhichOneof("event") == "token"]
        assert [t.index for t in tokens] == list(range(len(tokens)))
        end = events[-1].end
        start = events[0].start
        assert "Influence: off." in start.disclosure_note
        assert end.audit_seq > 0  # the exchange's entry: what ReportOutcome refers to
        assert end.finish_reason in ("length", "eos_token", "stop_sequence")
        assert 1 <= end.generated_tokens <= 8 and end.user_memory_id
        reply = "".join(t.text for t in tokens).strip()
        state = memory.GetSession(pb.GetSessionRequest(scope=scope), metadata=KEY, timeout=30)
        texts = [r.text for r in state.window]
        assert texts[0] == "Say hello to Bob."
        if reply:
            assert texts[1] == reply and state.window[1].memory_id == end.assistant_memory_id
        assert state.version > 0 and state.window_tokens > 0
    finally:
        for channel in channels:
            channel.close()


def test_hippo_context_prints_the_zones(cluster: LocalCluster) -> None:
    _hippo(cluster, "remember", "--user", "zed", "--session", "a", "The blue door is locked.")
    result = _hippo(cluster, "context", "which door is locked?", "--user", "zed", "--session", "b")
    assert result.returncode == 0, result.stderr
    for zone in ("system", "memories", "query"):
        assert f"── {zone} (" in result.stdout
    assert "The blue door is locked." in result.stdout


def test_chat_with_influence_on_runs_the_memtok_pipeline(cluster: LocalCluster) -> None:
    from google.protobuf import json_format

    from hippo.memory.v1 import memory_pb2 as pb

    memory, _, channels = _stubs(cluster)
    try:
        scope = pb.Scope(user_id="influence-user", session_id="s1")

        def chat(message: str, mode: int) -> list[pb.ChatResponse]:
            request = pb.ChatRequest(
                scope=scope,
                message=message,
                params=pb.GenerationParameters(max_new_tokens=4),
                influence=mode,  # type: ignore[arg-type]
            )
            return list(memory.Chat(request, metadata=KEY, timeout=180))

        fact = "My daughter Ingrid is allergic to peanuts, so never order satay for her."
        chat(fact, pb.INFLUENCE_MODE_ON)
        events = chat("What should I never order for Ingrid?", pb.INFLUENCE_MODE_ON)
        assert events[-1].WhichOneof("event") == "end"
        note = events[0].start.disclosure_note
        assert "Influence search:" in note
        off = chat("Hello there.", pb.INFLUENCE_MODE_UNSPECIFIED)  # the default: off
        assert "Influence: off." in off[0].start.disclosure_note
        entries = memory.ListAuditEntries(
            pb.ListAuditEntriesRequest(scope=pb.Scope(user_id="influence-user"), page_size=1000),
            metadata=KEY,
            timeout=30,
        ).entries
        kinds = [e.event_type for e in entries]
        assert kinds.count("influence") == 2 and kinds.count("memtok_write") == 2
        first_write = json_format.MessageToDict(entries[kinds.index("memtok_write")].body)
        assert any(w["outcome"] == "new" for w in first_write["writes"])
        plan = json_format.MessageToDict(
            [e for e in entries if e.event_type == "influence"][-1].body
        )
        assert plan["influence_mode"] == "on" and plan["shortlist"] > 0
        ended = [i.memtok_id for i in events[-1].end.influences]
        assert ended == [a["memtok_id"] for a in plan["influences"]]  # ChatEnd says the same
        for applied in plan["influences"]:  # the note names exactly what the entry applied
            assert applied["memtok_id"] in note
        if plan["influences"]:  # the default route: the memtoks' stored states attended
            assert "Memories attended: " in note
            assert all(a["route"] == "attend" for a in plan["influences"])
        # The words are in the sealed per-user part, which the user's own read decrypts.
        public = {k: v for k, v in plan.items() if k != "private"}
        assert "Ingrid" not in str(public) and "Ingrid" in plan["private"]["selected"]
        assert "satay" not in str({k: v for k, v in first_write.items() if k != "private"})
        assert "satay" in first_write["private"]["words"].values()
        # Per user: recorded once, it applies to requests that name no mode.
        result = _hippo(cluster, "memtok", "mode", "--user", "influence-user", "disclose_only")
        assert result.returncode == 0, result.stderr
        assert "influence for local/influence-user: disclose_only" in result.stdout
        again = chat("What should I never order for Ingrid?", pb.INFLUENCE_MODE_UNSPECIFIED)
        assert "Influence search:" in again[0].start.disclosure_note
        assert "Memories attended: " not in again[0].start.disclosure_note
    finally:
        for channel in channels:
            channel.close()


def test_hippo_seed_writes_a_locomo_archive_into_the_memtok_store(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    data = locomo_sample.write(tmp_path / "archive.json", conversations=3)
    result = _hippo(cluster, "seed", str(data), "--limit", "2", "--holdout", "1")
    assert result.returncode == 0, result.stderr
    assert "4 operator turns of 2 conversations" in result.stdout
    assert "memtoks created" in result.stdout and "held back: conv-" in result.stdout
    # Forgetting a user reaches the memtok store: their words go, and a retry erases nothing.
    gone = _hippo(cluster, "forget", "--user", "conv-0", "--yes")
    assert gone.returncode == 0, gone.stderr
    erased = int(gone.stdout.splitlines()[0].split(", ")[-1].split()[0])
    assert erased > 0, gone.stdout
    again = _hippo(cluster, "forget", "--user", "conv-0", "--yes")
    assert again.stdout.splitlines()[0].endswith(", 0 memtoks"), again.stdout


def _files_holding(root: Path, needles: list[bytes]) -> dict[str, list[str]]:
    """Every file under `root` whose bytes hold one of `needles` (read in overlapping
    chunks: the model weights under var/ are large)."""
    found: dict[str, list[str]] = {}
    overlap = max(len(n) for n in needles)
    for path in sorted(root.rglob("*")):
        if not path.is_file() or path.is_symlink():
            continue
        tail = b""
        with path.open("rb") as f:
            while chunk := f.read(1 << 22):
                window = tail + chunk
                for needle in needles:
                    if needle in window:
                        found.setdefault(str(path.relative_to(root)), []).append(needle.decode())
                tail = window[-overlap:]
    return {k: sorted(set(v)) for k, v in found.items()}


def test_a_forgotten_canary_is_in_no_file_and_no_service(cluster: LocalCluster) -> None:
    """Erasure is complete: a canary planted through every RPC that takes text
    (Remember's text and metadata, Recall, BuildContext, Chat with influence on, so the
    memtok store and the audit's sealed parts, ReportOutcome's note) is, after Forget of
    the user, in no file under var/ (stores, their WALs, index segments, the spool, logs)
    and answered by no service: not recalled, no window or summary, no memtok, not
    cached by the embedding service, no readable audit body."""
    import grpc

    from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc
    from hippo.memory.v1 import memory_pb2 as pb

    tag = uuid.uuid4().hex[:10]
    words = [f"zq{tag}", f"Vq{tag}x"]  # lower case, and mixed case (analysers fold it)
    canary = f"my locker code is {words[0]} and the dog is {words[1]}"
    needles = [w.encode() for w in words] + [words[1].lower().encode()]
    user = f"canary-{tag}"
    scope = pb.Scope(user_id=user, session_id="s1")
    memory, _, channels = _stubs(cluster)
    try:
        memory.Remember(
            pb.RememberRequest(
                scope=scope,
                turns=[pb.Turn(role=pb.ROLE_USER, text=canary, metadata={"tag": words[0]})],
                wait_searchable=True,
            ),
            metadata=KEY,
            timeout=60,
        )
        for mode in (pb.RECALL_MODE_HYBRID, pb.RECALL_MODE_LEXICAL, pb.RECALL_MODE_SEMANTIC):
            hits = memory.Recall(
                pb.RecallRequest(scope=scope, query=canary, mode=mode), metadata=KEY, timeout=30
            ).hits
            assert hits and words[0] in hits[0].memory.text
        built = memory.BuildContext(
            pb.BuildContextRequest(scope=scope, query=f"what is {words[1]}?"),
            metadata=KEY,
            timeout=60,
        )
        assert words[0] in built.prompt
        events = list(
            memory.Chat(
                pb.ChatRequest(
                    scope=scope,
                    message=f"Remember that {words[1]} likes {words[0]} biscuits.",
                    params=pb.GenerationParameters(max_new_tokens=2),
                    influence=pb.INFLUENCE_MODE_ON,
                ),
                metadata=KEY,
                timeout=180,
            )
        )
        seq = events[-1].end.audit_seq
        memory.ReportOutcome(
            pb.ReportOutcomeRequest(
                scope=scope, audit_seq=seq, kind=pb.OUTCOME_KIND_CORRECTED, note=canary
            ),
            metadata=KEY,
            timeout=30,
        )
        held = _files_holding(cluster.data_dir, needles)
        assert held, "the canary was planted nowhere: the test would prove nothing"

        gone = memory.Forget(pb.ForgetRequest(user_id=user), metadata=KEY, timeout=60)
        assert gone.memories_deleted >= 3 and gone.sessions_deleted == 1, gone
        assert gone.memtoks_deleted >= 1 and gone.cache_entries_dropped >= 1, gone
        assert gone.audit_key_destroyed, gone
        with grpc.insecure_channel(cluster.addrs["embedding"]) as channel:
            # Asked before anything below embeds the canary again (a Recall would).
            embed = embedding_pb2_grpc.EmbeddingServiceStub(channel).Embed
            assert embed(embedding_pb2.EmbedRequest(texts=[canary]), timeout=30).cached == 0

        # Index files are rebuilt without the erased documents after the purge delay.
        deadline = time.monotonic() + 90
        while (held := _files_holding(cluster.data_dir, needles)) and time.monotonic() < deadline:
            time.sleep(1)
        assert held == {}, held

        for mode in (pb.RECALL_MODE_HYBRID, pb.RECALL_MODE_LEXICAL, pb.RECALL_MODE_SEMANTIC):
            request = pb.RecallRequest(scope=scope, query=canary, mode=mode, top_k=100)
            assert not memory.Recall(request, metadata=KEY, timeout=30).hits
        session = memory.GetSession(pb.GetSessionRequest(scope=scope), metadata=KEY, timeout=30)
        assert not session.window and not session.summary
        entries = memory.ListAuditEntries(
            pb.ListAuditEntriesRequest(scope=pb.Scope(user_id=user), page_size=1000),
            metadata=KEY,
            timeout=30,
        ).entries
        assert entries and all(w not in str(e) for e in entries for w in words)
        again = list(
            memory.Chat(
                pb.ChatRequest(
                    scope=pb.Scope(user_id=user, session_id="s2"),
                    message=f"What does {words[1]} like?",
                    params=pb.GenerationParameters(max_new_tokens=1),
                    influence=pb.INFLUENCE_MODE_ON,
                ),
                metadata=KEY,
                timeout=180,
            )
        )
        assert not again[-1].end.influences  # no memtok of the forgotten user is left
        assert all(w not in again[0].start.disclosure_note for w in words)
    finally:
        for channel in channels:
            channel.close()


def test_a_crashed_service_is_restarted_not_the_whole_cluster(cluster: LocalCluster) -> None:
    """SIGKILL one service of `make run`: the launcher logs it, restarts it on the same
    port and data dir after a backoff, the others keep running, and what was stored
    before the crash is found after it. (Last in this module: it kills a service.)"""
    assert cluster.launcher is not None
    stored = _hippo(cluster, "remember", "--user", "crash", "--session", "s", "a durable walrus")
    assert stored.returncode == 0, stored.stderr
    before = service_children(cluster.launcher.pid)
    assert {"hippo_retrieval", "hippo_gateway"} <= set(before), before
    os.kill(before["hippo_retrieval"], 9)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        now = service_children(cluster.launcher.pid)
        health = _hippo(cluster, "health", "--json")
        pid = now.get("hippo_retrieval")
        if pid not in (None, before["hippo_retrieval"]) and health.returncode == 0:
            break
        time.sleep(1)
    else:
        pytest.fail(f"retrieval was not restarted: {now} {health.stdout}")
    assert now["hippo_gateway"] == before["hippo_gateway"]  # the others kept running
    assert cluster.launcher.poll() is None
    # SERVING to a fresh channel; the gateway's own channel reconnects within its
    # reconnect cap (1 s), so the first Recall may still meet UNAVAILABLE.
    until = time.monotonic() + 10
    while True:
        found = _hippo(cluster, "recall", "walrus", "--user", "crash", "--mode", "lexical")
        if found.returncode == 0 or time.monotonic() > until:
            break
        assert "UNAVAILABLE" in found.stderr, found.stderr
        time.sleep(0.5)
    assert "a durable walrus" in found.stdout, found.stdout + found.stderr


def _json_lines(out: str) -> list[dict[str, object]]:
    return [json.loads(x) for x in out.splitlines() if x.strip()]


def test_cli_memory_commands_end_to_end(cluster: LocalCluster, tmp_path: Path) -> None:
    """remember from stdin, list with filters, get, sessions, users, recall with filters,
    export, forget, import: what an application developer does from the terminal."""
    user = f"cli-{uuid.uuid4().hex[:8]}"
    at = "2024-06-01T10:00:00"
    typed = _hippo(cluster, "remember", "--user", user, "--session", "s1", "--json",
                   "--time", at, "-", stdin="I keep bees on the roof\n")  # fmt: skip
    assert typed.returncode == 0, typed.stderr
    bee = json.loads(typed.stdout)["memory_ids"][0]
    for session, role, at, text in [
        ("s1", "assistant", "2024-06-01T10:01:00", "How many hives do you keep?"),
        ("s2", "user", "2024-07-01T09:00:00", "The honey harvest was twelve jars"),
    ]:
        done = _hippo(cluster, "remember", "--user", user, "--session", session,
                      "--role", role, "--time", at, text)  # fmt: skip
        assert done.returncode == 0, done.stderr

    listed = _json_lines(_hippo(cluster, "list", "--user", user, "--json").stdout)
    assert [m["text"] for m in listed] == [
        "The honey harvest was twelve jars",
        "How many hives do you keep?",
        "I keep bees on the roof",
    ]
    oldest = _hippo(cluster, "list", "--user", user, "--json", "--oldest-first", "--limit", "1")
    assert [m["memory_id"] for m in _json_lines(oldest.stdout)] == [bee]
    mine = _hippo(cluster, "list", "--user", user, "--json", "--role", "user",
                  "--since", "2024-06-15")  # fmt: skip
    assert [m["text"] for m in _json_lines(mine.stdout)] == ["The honey harvest was twelve jars"]

    got = _hippo(cluster, "get", "--user", user, bee, "--json")
    assert json.loads(got.stdout)["text"] == "I keep bees on the roof"
    missing = _hippo(cluster, "get", "--user", user, "no-such-memory")
    assert missing.returncode == 3 and "NOT_FOUND" in missing.stderr
    changed = _hippo(cluster, "meta", "--user", user, bee, "--set", "category=hobby",
                     "--set", "k=a=b", "--json")  # fmt: skip
    assert changed.returncode == 0, changed.stderr
    assert json.loads(changed.stdout)["metadata"] == {"category": "hobby", "k": "a=b"}
    dropped = _hippo(cluster, "meta", "--user", user, bee, "--remove", "k", "--json")
    assert json.loads(dropped.stdout)["metadata"] == {"category": "hobby"}
    assert json.loads(_hippo(cluster, "get", "--user", user, bee, "--json").stdout)["metadata"] == {
        "category": "hobby"
    }
    assert _hippo(cluster, "meta", "--user", user, bee).returncode == 2  # nothing to change

    sessions = _json_lines(_hippo(cluster, "sessions", "--user", user, "--json").stdout)
    assert [(s["session_id"], s["turn_count"]) for s in sessions] == [("s1", 2), ("s2", 1)]
    # The summariser's state versions, one call for the page: s1 took two appends.
    versions = {s["session_id"]: s["summary_version"] for s in sessions}
    assert versions["s1"] > versions["s2"] > 0, versions
    users = _json_lines(_hippo(cluster, "users", "--json").stdout)
    assert {"user_id": user, "turn_count": 3, "session_count": 2}.items() <= next(
        u for u in users if u["user_id"] == user
    ).items()

    def recall(*extra: str) -> list[str]:
        out = _hippo(cluster, "recall", "--user", user, "--json", "--mode", "lexical",
                     "bees hives honey", *extra)  # fmt: skip
        assert out.returncode == 0, out.stderr
        return [str(h["text"]) for h in _json_lines(out.stdout)]

    for _ in range(50):  # searchable within about a second
        if len(recall()) == 3:
            break
        time.sleep(0.2)
    assert len(recall()) == 3
    assert recall("--role", "assistant") == ["How many hives do you keep?"]
    assert recall("--until", "2024-06-02") and "twelve jars" not in " ".join(
        recall("--until", "2024-06-02")
    )

    dump = tmp_path / "export.jsonl"
    exported = _hippo(cluster, "export", "--user", user, "-o", str(dump))
    assert exported.returncode == 0, exported.stderr
    lines = _json_lines(dump.read_text())
    assert next(iter(lines[0])) == "header" and next(iter(lines[-1])) == "footer"
    assert lines[-1]["footer"] == {"memories": "3", "sessions": "2"}
    forgot = _hippo(cluster, "forget", "--user", user, "--yes")
    assert forgot.returncode == 0, forgot.stderr
    assert _hippo(cluster, "list", "--user", user, "--json").stdout == ""
    imported = _hippo(cluster, "import", str(dump))
    assert imported.returncode == 0, imported.stderr
    assert "imported 3 records, 0 already stored" in imported.stdout
    again = _hippo(cluster, "list", "--user", user, "--json")
    assert [m["memory_id"] for m in _json_lines(again.stdout)] == [m["memory_id"] for m in listed]
    twice = _hippo(cluster, "import", str(dump))
    assert "imported 0 records, 3 already stored" in twice.stdout


def test_cli_imports_a_locomo_archive_idempotently(cluster: LocalCluster, tmp_path: Path) -> None:
    archive = locomo_sample.write(tmp_path / "archive.json", conversations=1)
    prefix = f"imp{uuid.uuid4().hex[:6]}-"
    first = _hippo(cluster, "import", "--user-prefix", prefix, str(archive))
    assert first.returncode == 0, first.stderr
    created = int(first.stdout.split()[1])
    assert created > 0 and "0 already stored" in first.stdout
    again = _hippo(cluster, "import", "--user-prefix", prefix, str(archive))
    assert f"imported 0 records, {created} already stored" in again.stdout
    users = _json_lines(_hippo(cluster, "users", "--json").stdout)
    assert any(str(u["user_id"]).startswith(prefix) for u in users)


def test_cli_exit_codes_usage_server_and_a_hint_when_nothing_answers(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    version = _hippo(cluster, "--version")
    assert version.returncode == 0 and version.stdout.startswith("hippo, version ")
    usage = _hippo(cluster, "list", "--user", "u", "--since", "yesterday")
    assert usage.returncode == 2 and "ISO 8601" in usage.stderr
    meta = _hippo(cluster, "recall", "--user", "u", "q", "--meta", "no-equals-sign")
    assert meta.returncode == 2 and "key=value" in meta.stderr
    not_export = tmp_path / "junk.jsonl"
    not_export.write_text('{"header": {"format_version": 1}}\n')
    assert _hippo(cluster, "import", str(not_export)).returncode == 2  # no footer
    closed = f"127.0.0.1:{reserve_port()}"
    down = _hippo(cluster, "--gateway", closed, "--timeout", "3", "users")
    assert down.returncode == 3 and "UNAVAILABLE" in down.stderr
    assert "hint:" in down.stderr and "--gateway" in down.stderr
    wrong = _hippo(cluster, "--api-key", "not-a-key", "users")
    assert wrong.returncode == 3 and "UNAUTHENTICATED" in wrong.stderr


def test_the_buf_curl_examples_of_the_mem0_page_run(cluster: LocalCluster) -> None:
    """docs/coming-from-mem0-zep.md's calls without the SDK, as written, against the
    cluster (its address for the documented one): Remember, Recall, ListMemories and
    ExportUser over server reflection."""
    doc = (BIN.parent.parent / "docs" / "coming-from-mem0-zep.md").read_text()
    found = re.search(r"## Without the SDK.*?```sh\n(.*?)```", doc, flags=re.DOTALL)
    assert found, "the page has no buf curl block"
    script = found.group(1).replace("127.0.0.1:50051", cluster.gateway)
    script = script.replace(".venv/bin/buf", str(BIN / "buf"))
    run = subprocess.run(
        ["bash", "-euo", "pipefail", "-c", script], capture_output=True, text=True, timeout=120
    )
    assert run.returncode == 0, run.stderr
    assert '"memoryIds"' in run.stdout  # Remember
    assert run.stdout.count("I am allergic to nuts") >= 3  # Recall, ListMemories, the export
    assert '"header"' in run.stdout and '"footer"' in run.stdout  # ExportUser's stream
