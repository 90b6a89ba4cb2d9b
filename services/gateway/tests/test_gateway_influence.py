"""Chat with the memtok pipeline (issue 8), over doubles of its ports: influence off
streams the plain model and asks the store nothing; on, the reply comes from the
influenced generation; the audit entries carry the pipeline's public body, its words
only in the sealed part; the disclosure note is written from the same body."""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping, Sequence
from typing import Any

import pytest
from test_gateway_context import FakeRecall, FakeSessions, WordTokenizer

from hippo_core.errors import FailedPrecondition, ResourceExhausted, Unimplemented
from hippo_gateway.domain import disclosure
from hippo_gateway.domain.audit_events import AuditEvent
from hippo_gateway.domain.chat import ChatService, Finished, Influence, Started, Token
from hippo_gateway.domain.context import ContextBuilder, ContextConfig
from hippo_gateway.domain.models import (
    Generation,
    InfluencePlan,
    Piece,
    Remembered,
    SessionState,
    TurnIn,
)

BODY = {
    "influence_mode": "on",
    "selected": [0.8, 0.7],
    "shortlist": 3,
    "top_similarity": 0.91,
    "llm2_kept": 3,
    "influences": [{"memtok_id": "k1", "layer": 3, "strength": 0.05, "similarity": 0.91}],
    "skipped": [{"memtok_id": "k2", "reason": "below_min_similarity"}],
    "promoted": 0,
    "writes": [],
}
PRIVATE = {"selected": ["Ingrid", "order"], "words": {"k1": "satay"}, "promoted": []}
ATTENDED = {
    "memtok_id": "k1", "layer": 6, "strength": 0.05, "similarity": 0.91,
    "route": "attend", "tokens": 7,
}  # fmt: skip


class Recorder:
    def __init__(self) -> None:
        self.events: list[AuditEvent] = []

    def fingerprint(self, tenant: str, user: str, text: str) -> str:
        return "fp"

    async def record(self, event: AuditEvent, *, wait: bool = False) -> int:
        self.events.append(event)
        return len(self.events)


class Memory:
    def __init__(self, room: int = 1000) -> None:
        self.turns: list[TurnIn] = []
        self.room = room  # turns the tenant may still store

    async def admit_turns(self, tenant: str, count: int) -> None:
        if count > self.room:
            raise ResourceExhausted("over quota", retry_after=None, quota=("t", "max_stored_turns"))

    async def remember(self, tenant: str, user: str, session: str, turns: Sequence[TurnIn]) -> Any:
        self.turns += turns
        return Remembered([f"id{i}" for i in range(len(turns))], [True] * len(turns), 0)


class Llm:
    def __init__(self, words: list[str]) -> None:
        self.words = words
        self.prompts: list[str] = []

    async def stream(self, prompt: str, params: Generation) -> AsyncIterator[Piece]:
        self.prompts.append(prompt)
        for i, w in enumerate(self.words):
            last = i == len(self.words) - 1
            yield Piece(w, "eos_token" if last else "", len(self.words) if last else 0)


class Influencer(Llm):
    def __init__(self, mode: str | None = "on", fail: bool = False, attend: bool = False) -> None:
        super().__init__([" influenced"])
        self.attend = attend  # plans on the attend route: stored states, no vectors
        self.recorded_mode = mode
        self.fail = fail
        self.asked: list[str | None] = []
        self.writes: list[tuple[str, str]] = []
        self.streamed: list[InfluencePlan] = []

    async def plan(self, tenant: str, user: str, query: str, mode: str | None) -> InfluencePlan:
        self.asked.append(mode)
        if self.attend:
            chosen = mode or self.recorded_mode or "off"
            body = {**BODY, "influence_mode": chosen, "influences": [ATTENDED]}
            return InfluencePlan(chosen, body, PRIVATE, (), b"states" if chosen == "on" else b"")
        if self.fail:
            raise FailedPrecondition("injection: this deployment has no memtok store")
        chosen = mode or self.recorded_mode or "off"
        if chosen == "off":
            return InfluencePlan("off", {"influence_mode": "off", "influences": []})
        body = {**BODY, "influence_mode": chosen}
        vectors = ((b"\0" * 8, 3, 0.05),) if chosen == "on" else ()
        return InfluencePlan(chosen, body, PRIVATE, vectors)

    async def stream(  # type: ignore[override]
        self, prompt: str, params: Generation, plan: InfluencePlan
    ) -> AsyncIterator[Piece]:
        assert plan.applies
        self.streamed.append(plan)
        async for piece in super().stream(prompt, params):
            yield piece

    async def write(
        self, tenant: str, user: str, query: str, reply: str
    ) -> tuple[Mapping[str, Any], Mapping[str, Any]]:
        self.writes.append((query, reply))
        return {"writes": [{"outcome": "new", "memtok_id": "k9", "count": 1}]}, {
            "words": {"k9": "Ingrid"}
        }


def chat(influencer: Influencer | None) -> tuple[ChatService, Recorder, Llm]:
    recorder = Recorder()
    builder = ContextBuilder(
        FakeRecall([]),  # type: ignore[arg-type]
        FakeSessions(SessionState([], "", 0)),
        WordTokenizer(),
        ContextConfig(instructions="be brief", default_budget=512),
        recorder=recorder,  # type: ignore[arg-type]
    )
    llm = Llm([" plain", " reply"])
    return ChatService(Memory(), builder, llm, influencer), recorder, llm  # type: ignore[arg-type]


async def run(service: ChatService, influence: str) -> list[Any]:
    return [e async for e in service.chat("t", "u", "s", "what for Ingrid?", influence=influence)]


def reply(events: list[Any]) -> str:
    return "".join(e.text for e in events if isinstance(e, Token))


@pytest.mark.parametrize("recorded", [None, "off"])
async def test_off_is_the_plain_model_and_writes_nothing(recorded: str | None) -> None:
    plain, _, _ = chat(None)
    baseline = reply(await run(plain, Influence.DEFAULT))
    influencer = Influencer(recorded)
    service, recorder, _llm = chat(influencer)
    for mode in (Influence.DEFAULT, Influence.OFF):
        events = await run(service, mode)
        assert reply(events) == baseline == " plain reply"
        assert isinstance(events[0], Started) and events[0].note.endswith("Influence: off.")
    assert influencer.asked == [None]  # OFF asked: the store is not even consulted
    assert influencer.writes == [] and influencer.prompts == []
    kinds = [e.event_type for e in recorder.events]
    assert "influence" not in kinds and "memtok_write" not in kinds


async def test_on_generates_with_influence_and_audits_every_step() -> None:
    influencer = Influencer(None)
    service, recorder, llm = chat(influencer)
    events = await run(service, Influence.ON)
    assert reply(events) == " influenced" and llm.prompts == []
    assert influencer.writes == [("what for Ingrid?", "influenced")]
    by_kind = {e.event_type: e for e in recorder.events}
    plan = by_kind["influence"]
    assert plan.body == BODY and plan.private == PRIVATE
    assert "satay" not in str(plan.body) and "Ingrid" not in str(plan.body)
    written = by_kind["memtok_write"]
    assert written.private == {"words": {"k9": "Ingrid"}} and "Ingrid" not in str(written.body)
    exchange = by_kind["chat"]
    assert exchange.body == {
        "context_seq": recorder.events.index(by_kind["context"]) + 1,
        "finish_reason": "eos_token",
        "generated_tokens": 1,
        "influence_mode": "on",
        "influences": BODY["influences"],  # what was applied
    }
    assert exchange.memory_ids == ("id0", "id1") and exchange.private is None
    started = events[0]
    assert isinstance(started, Started)
    assert started.note == disclosure.note([by_kind["context"], plan])  # the same entries
    assert started.note.splitlines()[-2:] == [
        "Influence search: 2 query words selected, shortlist 3 (top similarity 0.91), "
        "LLM2 kept 3; skipped: 1 below min similarity.",
        "Influence applied: k1 (layer 3, strength 0.05).",
    ]
    end = events[-1]
    assert isinstance(end, Finished)
    assert [(i["memtok_id"], i["source_words"], i["strength"]) for i in end.influences] == [
        ("k1", "satay", 0.05)
    ]


async def test_the_users_recorded_mode_applies_when_the_request_names_none() -> None:
    influencer = Influencer("disclose_only")
    service, recorder, llm = chat(influencer)
    events = await run(service, Influence.DEFAULT)
    assert reply(events) == " plain reply" and llm.prompts  # disclosed, not applied
    assert influencer.asked == [None]
    assert "Influence selected, not applied: k1" in events[0].note
    assert [e.event_type for e in recorder.events].count("influence") == 1


async def test_no_store_is_off_by_default_and_an_error_when_asked() -> None:
    service, _, _ = chat(Influencer(fail=True))
    assert reply(await run(service, Influence.DEFAULT)) == " plain reply"
    with pytest.raises(FailedPrecondition):
        await run(service, Influence.ON)
    bare, _, _ = chat(None)
    with pytest.raises(Unimplemented):
        await run(bare, Influence.ON)


@pytest.mark.parametrize("mode", ["on", "disclose_only"])
async def test_the_attend_route_generates_with_the_plans_states_and_says_so(mode: str) -> None:
    """A plan with stored states and no vectors is still an influenced generation (the
    states go to Generate untouched); the note names the memories attended."""
    influencer = Influencer(mode, attend=True)
    service, _, llm = chat(influencer)
    events = await run(service, Influence.DEFAULT)
    note = events[0].note
    if mode == "on":
        assert reply(events) == " influenced" and llm.prompts == []
        assert [p.attendable for p in influencer.streamed] == [b"states"]
        assert note.splitlines()[-1] == "Memories attended: k1 (from layer 6, 7 tokens)."
    else:
        assert reply(events) == " plain reply" and influencer.streamed == []
        assert (
            note.splitlines()[-1] == "Memories selected, not attended: k1 (from layer 6, 7 tokens)."
        )
    assert "Influence applied" not in note


def test_the_note_shows_small_strengths() -> None:
    applied = [{"memtok_id": "k", "layer": 3, "strength": 0.0047}]
    body = {"influence_mode": "on", "influences": applied}
    event = AuditEvent("t", "influence", "u", "s", body=body)
    assert disclosure.note(event) == "Influence applied: k (layer 3, strength 0.0047)."


async def test_a_tenant_at_its_stored_turn_quota_is_refused_before_generating() -> None:
    """Chat stores the exchange after the reply: a tenant that could not store it is
    refused first, so no generation is spent on a reply that would be thrown away."""
    service, recorder, llm = chat(None)
    service._memory = Memory(room=1)  # type: ignore[assignment]
    with pytest.raises(ResourceExhausted):
        await run(service, Influence.DEFAULT)
    assert llm.prompts == [] and recorder.events == []


async def test_the_grpc_influencer_passes_the_plans_states_to_generate_untouched() -> None:
    """The adapter over a loopback gRPC server standing in for the injection service:
    PlanInfluenceResponse.attendable comes back byte for byte in GenerateRequest."""
    import grpc

    from hippo.injection.v1 import injection_pb2 as ipb
    from hippo.injection.v1 import injection_pb2_grpc
    from hippo_gateway.adapters.influence_client import GrpcInfluencer

    attendable = ipb.Attendable(from_layer=6, states=[b"record-1", b"record-2"])
    received: list[ipb.GenerateRequest] = []

    class Injection(injection_pb2_grpc.InjectionServiceServicer):
        async def PlanInfluence(self, request: Any, context: Any) -> ipb.PlanInfluenceResponse:
            return ipb.PlanInfluenceResponse(
                mode=ipb.INFLUENCE_MODE_ON,
                audit_json='{"influence_mode": "on", "influences": []}',
                attendable=attendable,
            )

        async def Generate(self, request: Any, context: Any) -> AsyncIterator[Any]:
            received.append(request)
            yield ipb.GenerateResponse(
                token=ipb.Token(text="ok"),
                finish=ipb.Finish(reason=ipb.FINISH_REASON_EOS_TOKEN, generated_tokens=1),
            )

    server = grpc.aio.server()
    injection_pb2_grpc.add_InjectionServiceServicer_to_server(Injection(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            influencer = GrpcInfluencer(channel, 5.0)
            plan = await influencer.plan("t", "u", "query", "on")
            assert plan.applies and plan.influences == ()
            pieces = [p async for p in influencer.stream("prompt", Generation(), plan)]
            assert [p.text for p in pieces] == ["ok"]
            none = InfluencePlan("on", {}, {}, ())
            assert not none.applies
    finally:
        await server.stop(None)
    assert received[0].attendable == attendable
