"""The SDK against a real local cluster (`hippo up` through the launcher), blocking and
asyncio: every cluster-backed SDK test lives here, so the cluster starts once."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from hippo_cli.cluster import LocalCluster, local_cluster
from hippo_client import (
    AsyncClient,
    Client,
    ExportFooter,
    ExportHeader,
    ImportResult,
    InvalidArgument,
    Memory,
    NotFound,
    Turn,
    Unauthenticated,
)

ROOT = Path(__file__).resolve().parents[3]
KEY = "hippo-local-dev-key"  # the key `hippo up` accepts (tenant `local`)
pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    with local_cluster(tmp_path_factory.mktemp("var")) as running:
        yield running


def test_the_blocking_client_round_trip(cluster: LocalCluster) -> None:
    with Client(cluster.gateway, KEY, timeout=30) as hippo:
        stored = hippo.remember(
            "sdk-alice",
            "s1",
            [
                Turn("user", "My build fails with ERR_CONNECTION_REFUSED", client_id="m1"),
                ("assistant", "Is the dev server running on port 3000?"),
            ],
            metadata={"app": "sdk-test"},
            wait_searchable=True,
        )
        assert stored.created == 2 and len(stored.memory_ids) == 2
        again = hippo.remember(
            "sdk-alice", "s1", [Turn("user", "My build fails with ERR_CONNECTION_REFUSED",
                                     client_id="m1")],
        )  # fmt: skip
        assert again.deduplicated == 1 and again.memory_ids[0] == stored.memory_ids[0]

        found = hippo.recall("sdk-alice", "ERR_CONNECTION_REFUSED", mode="lexical", top_k=5)
        top = found.hits[0].memory
        assert top.id == stored.memory_ids[0] and top.role == "user" and top.client_id == "m1"
        assert top.metadata == {"app": "sdk-test"} and top.time is not None
        assert found.hits[0].lexical_rank == 1 and found.query_repairs == {}
        slipped = hippo.recall("sdk-alice", "my buld fails", mode="lexical", top_k=5)
        assert slipped.query_repairs == {"buld": "build"}
        assert slipped.hits[0].memory.id == stored.memory_ids[0]
        only_assistant = hippo.recall("sdk-alice", "dev server port", roles=["assistant"])
        assert {h.memory.role for h in only_assistant} == {"assistant"}

        context = hippo.build_context("sdk-alice", "s2", "what was my build error?")
        assert stored.memory_ids[0] in context.memory_ids_used and context.audit_seq > 0
        assert {z.kind for z in context.zones} >= {"system", "memories", "query"}

        state = hippo.get_session("sdk-alice", "s1")
        assert [m.id for m in state.window] == list(stored.memory_ids) and state.version > 0

        reply = hippo.chat("sdk-alice", "s1", "Say hello to Bob.", max_new_tokens=8, timeout=180)
        pieces = list(reply)
        assert reply.start is not None and reply.end is not None
        assert reply.end.finish_reason in ("length", "eos_token", "stop_sequence")
        assert reply.end.user_memory_id and reply.end.audit_seq > 0
        assert "".join(pieces) == reply.text and 1 <= reply.end.generated_tokens <= 8
        assert pieces or reply.end.finish_reason == "eos_token"

        gone = hippo.forget("sdk-alice", session="s1")
        assert gone.memories_deleted >= 2 and gone.sessions_deleted == 1
        assert len(hippo.recall("sdk-alice", "ERR_CONNECTION_REFUSED", mode="lexical")) == 0
        assert hippo.get_session("sdk-alice", "s1").version == 0


async def test_the_async_client_round_trip(cluster: LocalCluster) -> None:
    async with AsyncClient(cluster.gateway, KEY, timeout=30) as hippo:
        stored = await hippo.remember(
            "sdk-bob", "s1", [("user", "My dog Rex hates thunder")], wait_searchable=True
        )
        found = await hippo.recall("sdk-bob", "Rex thunder", mode="lexical")
        assert found.hits[0].memory.id == stored.memory_ids[0]
        context = await hippo.build_context("sdk-bob", "s1", "what is my dog called?")
        assert context.prompt and context.tokens.total > 0
        state = await hippo.get_session("sdk-bob", "s1")
        assert state.window[0].text == "My dog Rex hates thunder"

        reply = hippo.chat("sdk-bob", "s1", "What is my dog called?", max_new_tokens=8, timeout=180)
        pieces = [piece async for piece in reply]
        assert reply.end is not None and reply.end.audit_seq > 0
        assert "".join(pieces) == reply.text

        entries = [e async for e in hippo.audit_entries("sdk-bob", page_size=2)]
        assert {"remember", "recall"} <= {e.event_type for e in entries}
        assert [e.seq for e in entries] == sorted(e.seq for e in entries)

        gone = await hippo.forget("sdk-bob")
        assert gone.memories_deleted >= 1
        assert len(await hippo.recall("sdk-bob", "Rex thunder", mode="lexical")) == 0


def test_listing_getting_and_paging_from_the_blocking_client(cluster: LocalCluster) -> None:
    when = datetime(2024, 6, 1, 12, 0, tzinfo=timezone.utc)
    with Client(cluster.gateway, KEY, timeout=30) as hippo:
        first = hippo.remember(
            "sdk-carol",
            "a",
            [Turn("user", f"turn {i}", time=when + timedelta(minutes=i)) for i in range(5)],
        )
        second = hippo.remember("sdk-carol", "b", [Turn("assistant", "later", time=when)])
        page = hippo.list_memories("sdk-carol", page_size=2)
        assert len(page) == 2 and page.next_page_token
        newest = [m.id for m in hippo.memories("sdk-carol", page_size=2)]
        # Newest first; "later" shares turn 0's time and was stored after it: it comes first.
        ids = list(first.memory_ids)
        assert newest == [*reversed(ids[1:]), second.memory_ids[0], ids[0]]
        oldest = [m.id for m in hippo.memories("sdk-carol", order="oldest", session="a")]
        assert oldest == list(first.memory_ids)
        users = [m.id for m in hippo.memories("sdk-carol", roles=["assistant"])]
        assert users == list(second.memory_ids)
        windowed = hippo.memories("sdk-carol", since=when + timedelta(minutes=1),
                                  until=when + timedelta(minutes=3))  # fmt: skip
        assert [m.text for m in windowed] == ["turn 2", "turn 1"]

        got = hippo.get_memory("sdk-carol", first.memory_ids[0])
        assert got.text == "turn 0" and got.session == "a" and got.time == when
        with pytest.raises(NotFound):
            hippo.get_memory("sdk-someone-else", first.memory_ids[0])

        sessions = list(hippo.sessions("sdk-carol", page_size=1))
        assert [(s.session, s.turn_count) for s in sessions] == [("a", 5), ("b", 1)]
        assert sessions[0].first_time == when and sessions[0].last_time == when + timedelta(
            minutes=4
        )
        carol = next(u for u in hippo.users() if u.user == "sdk-carol")
        assert (carol.turn_count, carol.session_count) == (6, 2)
        changed = hippo.update_metadata(
            "sdk-carol", first.memory_ids[0], set={"category": "test"}, remove=["absent"]
        )
        assert changed.memory.metadata == {"category": "test"} and changed.memory.text == "turn 0"
        with pytest.raises(InvalidArgument) as refused:
            hippo.update_metadata("sdk-carol", first.memory_ids[0])  # nothing to change
        assert refused.value.field == "set"
        history = list(hippo.history("sdk-carol", first.memory_ids[0]))
        assert {"remember", "read", "metadata"} <= {e.event_type for e in history}, history
        hippo.forget("sdk-carol")
        assert list(hippo.memories("sdk-carol")) == []


async def test_listing_from_the_async_client(cluster: LocalCluster) -> None:
    async with AsyncClient(cluster.gateway, KEY, timeout=30) as hippo:
        stored = await hippo.remember("sdk-dave", "s1", [("user", "one"), ("user", "two")])
        assert [m.id async for m in hippo.memories("sdk-dave", order="oldest", page_size=1)] == (
            list(stored.memory_ids)
        )
        assert (await hippo.get_memory("sdk-dave", stored.memory_ids[1])).text == "two"
        assert [s.session async for s in hippo.sessions("sdk-dave")] == ["s1"]
        assert "sdk-dave" in [u.user async for u in hippo.users()]
        page = await hippo.list_users(page_size=1)
        assert len(page) == 1
        # Export, forget, import: the same memories under the same ids; again: nothing new.
        items = [item async for item in hippo.export_user("sdk-dave")]
        records = [item for item in items if isinstance(item, Memory)]
        assert isinstance(items[0], ExportHeader) and isinstance(items[-1], ExportFooter)
        assert [m.id for m in records] == list(stored.memory_ids)
        await hippo.forget("sdk-dave")
        assert [m async for m in hippo.memories("sdk-dave")] == []
        assert await hippo.import_turns(records) == ImportResult(created=2, deduplicated=0)
        assert await hippo.import_turns(records) == ImportResult(created=0, deduplicated=2)
        assert [m.id async for m in hippo.memories("sdk-dave", order="oldest")] == (
            list(stored.memory_ids)
        )
        await hippo.forget("sdk-dave")


def test_an_invalid_argument_names_its_field(cluster: LocalCluster) -> None:
    with Client(cluster.gateway, KEY) as hippo, pytest.raises(InvalidArgument) as caught:
        hippo.recall("sdk-alice", "anything", top_k=101)
    assert caught.value.code == "INVALID_ARGUMENT" and caught.value.field == "top_k"
    assert "101" in caught.value.message


async def test_a_wrong_key_is_unauthenticated(cluster: LocalCluster) -> None:
    with Client(cluster.gateway, "not-a-key") as hippo, pytest.raises(Unauthenticated) as sync:
        hippo.recall("sdk-alice", "anything")
    assert sync.value.code == "UNAUTHENTICATED" and sync.value.reason == "UNKNOWN_API_KEY"
    async with AsyncClient(cluster.gateway, "not-a-key") as hippo:
        with pytest.raises(Unauthenticated):
            await hippo.get_session("sdk-alice", "s1")


def _examples(path: Path) -> list[str]:
    """The Python blocks of a doc that open a client themselves (the rest are fragments)."""
    blocks = re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.DOTALL)
    return [b for b in blocks if "hippo_client import" in b and "Client(" in b]


@pytest.mark.parametrize("doc", ["README.md", "docs/api.md"])
def test_the_documented_sdk_examples_run(cluster: LocalCluster, doc: str) -> None:
    examples = _examples(ROOT / doc)
    assert examples, f"{doc} has no SDK example"
    for source in examples:
        for local in ("127.0.0.1:50051", "localhost:50051"):
            source = source.replace(local, cluster.gateway)
        exec(compile(source, doc, "exec"), {"__name__": "__example__"})
