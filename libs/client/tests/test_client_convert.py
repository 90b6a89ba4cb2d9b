"""The SDK's requests and results: plain Python in, the proto's fields out, and back."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import datetime, timedelta, timezone

import pytest
from google.protobuf import struct_pb2

from hippo.memory.v1 import memory_pb2 as pb
from hippo_client import InvalidArgument, Turn, calls, convert, types

UTC = timezone.utc


def test_remember_maps_pairs_and_turns_and_merges_metadata() -> None:
    when = datetime(2024, 6, 1, 12, 30)  # naive: taken as UTC
    call = calls.remember(
        "alice",
        "s1",
        [
            ("user", "My build fails"),
            Turn("assistant", "Is the server up?", time=when, client_id="m2",
                 metadata={"speaker": "Bot"}),
        ],
        metadata={"speaker": "Alice", "app": "demo"},
        wait_searchable=True,
    )  # fmt: skip
    request = call.request
    assert call.method == "Remember"
    assert request.scope == pb.Scope(user_id="alice", session_id="s1")
    assert [t.role for t in request.turns] == [pb.ROLE_USER, pb.ROLE_ASSISTANT]
    assert dict(request.turns[0].metadata) == {"speaker": "Alice", "app": "demo"}
    assert dict(request.turns[1].metadata) == {"speaker": "Bot", "app": "demo"}  # turn's wins
    assert not request.turns[0].HasField("time")
    assert request.turns[1].time.ToDatetime(tzinfo=UTC) == when.replace(tzinfo=UTC)
    assert request.turns[1].client_id == "m2" and request.wait_searchable


def test_remember_makes_a_key_per_call_so_its_retries_are_idempotent() -> None:
    first = calls.remember("u", "s", [("user", "a")])
    second = calls.remember("u", "s", [("user", "a")])
    assert first.request.idempotency_key.startswith("sdk-") and first.idempotent
    assert first.request.idempotency_key != second.request.idempotency_key
    assert (
        calls.remember("u", "s", [("user", "a")], idempotency_key="k1").request.idempotency_key
        == "k1"
    )
    # No key at all: idempotent only when every turn has a client id (the proto's rule).
    assert not calls.remember("u", "s", [("user", "a")], idempotency_key="").idempotent
    with_ids = calls.remember("u", "s", [Turn("user", "a", client_id="c")], idempotency_key="")
    assert with_ids.idempotent and with_ids.request.idempotency_key == ""


def test_unknown_enum_names_are_refused_naming_the_parameter() -> None:
    with pytest.raises(InvalidArgument) as caught:
        calls.remember("u", "s", [("user", "a"), ("robot", "b")])
    assert caught.value.field == "turns[1].role" and "'robot'" in caught.value.message
    with pytest.raises(InvalidArgument) as mode:
        calls.recall("u", "q", mode="fuzzy")  # type: ignore[arg-type]
    assert mode.value.field == "mode"


def test_recall_maps_filters() -> None:
    since = datetime(2024, 1, 1, tzinfo=UTC)
    until = datetime(2024, 2, 1, tzinfo=timezone(timedelta(hours=2)))
    request = calls.recall(
        "alice", "lisbon", session="s1", top_k=5, mode="lexical", since=since, until=until,
        roles=["user", "tool"],
    ).request  # fmt: skip
    assert request.scope.session_id == "s1" and request.top_k == 5
    assert request.mode == pb.RECALL_MODE_LEXICAL
    assert request.time_range.start.ToDatetime(tzinfo=UTC) == since
    assert request.time_range.end.ToDatetime(tzinfo=UTC) == until
    assert list(request.roles) == [pb.ROLE_USER, pb.ROLE_TOOL]
    plain = calls.recall("alice", "lisbon", roles="user").request  # type: ignore[arg-type]
    assert list(plain.roles) == [pb.ROLE_USER] and not plain.HasField("time_range")
    assert plain.scope.session_id == "" and plain.top_k == 10


def test_forget_targets() -> None:
    assert calls.forget("u").request.WhichOneof("target") == "user_id"
    session = calls.forget("u", session="s").request
    assert session.session == pb.Scope(user_id="u", session_id="s")
    ids = calls.forget("u", memory_ids=["m1", "m2"]).request
    assert list(ids.memory_ids.memory_ids) == ["m1", "m2"] and ids.memory_ids.scope.user_id == "u"
    with pytest.raises(InvalidArgument):  # not "forget the whole user"
        calls.forget("u", memory_ids=[])


def test_chat_request_and_idempotency_of_the_rest() -> None:
    request = calls.chat_request(
        "u", "s", "hi", max_new_tokens=8, temperature=0.5, stop="\n", influence="disclose_only"
    )
    assert request.params.max_new_tokens == 8 and list(request.params.stop) == ["\n"]
    assert request.influence == pb.INFLUENCE_MODE_DISCLOSE_ONLY
    assert calls.chat_request("u", "s", "hi").influence == pb.INFLUENCE_MODE_UNSPECIFIED
    outcome = calls.report_outcome("u", 7, "corrected", note="it was Porto")
    assert not outcome.idempotent and outcome.request.kind == pb.OUTCOME_KIND_CORRECTED
    assert outcome.result(pb.ReportOutcomeResponse(audit_seq=9)) == 9
    assert calls.build_context("u", "s", "q", layout="chronological").request.layout == (
        pb.CONTEXT_LAYOUT_CHRONOLOGICAL
    )
    assert all(
        c.idempotent
        for c in (calls.recall("u", "q"), calls.forget("u"), calls.get_session("u", "s"),
                  calls.verify_audit(), calls.list_audit_entries("u"))
    )  # fmt: skip


def _record(**fields: object) -> pb.MemoryRecord:
    return pb.MemoryRecord(
        memory_id="m1",
        scope=pb.Scope(user_id="alice", session_id="s1"),
        role=pb.ROLE_ASSISTANT,
        text="hello",
        client_id="c1",
        metadata={"speaker": "Bot"},
        sequence=3,
        **fields,  # type: ignore[arg-type]
    )


def test_results_convert_to_dataclasses() -> None:
    stamp = convert.timestamp(datetime(2024, 6, 1, tzinfo=UTC))
    reply = pb.RecallResponse(
        hits=[pb.Hit(memory=_record(time=stamp), fused_score=0.5, lexical_rank=1)],
        lexical_candidates=4,
        query_repairs={"reserch": "research"},
    )
    result = convert.recall_result(reply)
    (hit,) = result
    assert len(result) == 1 and result.lexical_candidates == 4
    assert result.query_repairs == {"reserch": "research"}
    assert hit.memory.id == "m1" and hit.memory.role == "assistant"
    assert hit.memory.time == datetime(2024, 6, 1, tzinfo=UTC) and hit.memory.sequence == 3
    assert hit.memory.metadata == {"speaker": "Bot"} and hit.semantic_rank == 0
    assert convert.memory(_record()).time is None  # unset stays unset

    state = convert.session("alice", "s1", pb.GetSessionResponse(window=[_record()], version=2))
    assert state.window[0].text == "hello" and state.version == 2 and state.updated is None

    end = convert.chat_end(
        pb.ChatEnd(finish_reason="length", audit_seq=5,
                   influences=[pb.AppliedInfluence(memtok_id="t", layer=3, strength=0.25)])
    )  # fmt: skip
    assert end.finish_reason == "length" and end.influences[0].layer == 3

    context = convert.context(
        pb.BuildContextResponse(
            messages=[pb.ChatMessage(role=pb.ROLE_SYSTEM, text="rules")],
            zones=[pb.ContextZone(kind=pb.ZONE_KIND_MEMORIES, text="x", memory_ids=["m1"])],
            tokens=pb.TokenCounts(budget=2048, total=100),
            audit_seq=11,
        )
    )
    assert context.messages[0].role == "system" and context.zones[0].kind == "memories"
    assert context.zones[0].memory_ids == ("m1",) and context.tokens.budget == 2048

    body = struct_pb2.Struct()
    body.update({"k": 1, "private": "erased"})
    page = convert.audit_page(
        pb.ListAuditEntriesResponse(
            entries=[pb.AuditEntry(seq=1, event_type="remember", user_id="alice", body=body)],
            next_page_token="t2",
        )
    )
    assert page.next_page_token == "t2" and page.items[0].body == {"k": 1.0, "private": "erased"}
    assert page.items[0].user == "alice" and page.items[0].time is None


def test_a_role_added_by_a_newer_server_passes_through() -> None:
    assert convert.role_out(pb.ROLE_TOOL) == "tool"
    assert convert.role_out(0) == "unspecified"
    assert convert.role_out(42) == "role_42"


def test_listing_requests_carry_filters_order_and_tokens() -> None:
    since = datetime(2024, 6, 1, tzinfo=UTC)
    call = calls.list_memories(
        "alice", session="s1", since=since, roles=["user"], metadata={"agent_id": "chef"},
        order="oldest", page_size=5, page_token="t",
    )  # fmt: skip
    request = call.request
    assert call.method == "ListMemories" and call.idempotent
    assert request.order == pb.LIST_ORDER_OLDEST_FIRST and request.page_token == "t"
    assert dict(request.metadata) == {"agent_id": "chef"} and list(request.roles) == [pb.ROLE_USER]
    assert request.time_range.start.ToDatetime(tzinfo=UTC) == since
    assert not request.time_range.HasField("end")
    with pytest.raises(InvalidArgument) as caught:
        calls.list_memories("alice", order="sideways")  # type: ignore[arg-type]
    assert caught.value.field == "order"
    recall = calls.recall("alice", "q", metadata={"speaker": "Bob"}).request
    assert dict(recall.metadata) == {"speaker": "Bob"}
    update = calls.update_metadata("alice", "m1", set={"k": "v"}, remove="old").request
    assert dict(update.set) == {"k": "v"} and list(update.remove) == ["old"]


def test_export_items_and_import_batches_round_trip() -> None:
    record = pb.MemoryRecord(
        memory_id="m1", scope=pb.Scope(user_id="alice", session_id="s1"), role=pb.ROLE_USER,
        text="hi", metadata={"speaker": "Alice"}, sequence=9,
    )  # fmt: skip
    record.time.FromSeconds(1_700_000_000)
    items = [
        convert.export_item(pb.ExportUserResponse(header=pb.ExportHeader(format_version=1,
                                                                         user_id="alice",
                                                                         audit_seq=7))),
        convert.export_item(pb.ExportUserResponse(memory=record)),
        convert.export_item(pb.ExportUserResponse(session=pb.ExportedSession(
            session=pb.SessionInfo(session_id="s1", turn_count=1), summary="S", version=3))),
        convert.export_item(pb.ExportUserResponse(footer=pb.ExportFooter(memories=1, sessions=1))),
        convert.export_item(pb.ExportUserResponse()),  # an item kind this SDK does not know
    ]  # fmt: skip
    header, memory, session, footer, unknown = items
    assert isinstance(header, types.ExportHeader) and header.audit_seq == 7
    assert isinstance(memory, types.Memory) and memory.id == "m1"
    assert isinstance(session, types.ExportedSession) and session.summary == "S"
    assert session.session.turn_count == 1 and session.version == 3
    assert isinstance(footer, types.ExportFooter) and footer.memories == 1 and unknown is None

    batches = list(calls.import_batches([memory] * 5, batch_size=2))
    assert [len(b.records) for b in batches] == [2, 2, 1]
    back = batches[0].records[0]
    assert back.memory_id == "m1" and back.scope.session_id == "s1" and back.role == pb.ROLE_USER
    assert back.time.seconds == 1_700_000_000 and dict(back.metadata) == {"speaker": "Alice"}
    assert back.sequence == 0  # the store assigns its own
    with pytest.raises(InvalidArgument):
        calls.import_batches([memory], batch_size=257)


def test_an_upload_keeps_the_error_raised_while_building_a_request() -> None:
    def broken() -> Iterator[int]:
        yield 1
        raise InvalidArgument("role: 'robot' is not one", field="role")

    upload = calls.Upload(broken())
    assert list(upload) == [1] and isinstance(upload.error, InvalidArgument)
