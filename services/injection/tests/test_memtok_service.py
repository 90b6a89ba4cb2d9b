"""The memtok use cases on the real model, in process: influence off leaves the reply
exactly the plain model's; on, the planned influences are what the audit body says and
they change the reply's distribution; a user's recorded mode applies when a request
names none. The gRPC edge without a store answers FAILED_PRECONDITION."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import numpy as np
import pytest
from memtok_fakes import BagEmbedder

from hippo.injection.v1 import injection_pb2 as pb
from hippo.injection.v1 import injection_pb2_grpc
from hippo_injection import convert
from hippo_injection.__main__ import build_pipeline, limits
from hippo_injection.adapters.engine import TransformersEngine
from hippo_injection.domain.memtok.pipeline import Mode
from hippo_injection.domain.memtok.service import MemtokService
from hippo_injection.domain.queue import ModelQueue
from hippo_injection.domain.service import InjectionService
from hippo_injection.domain.types import GenerateRequest, Prompt, ScoreRequest
from hippo_injection.settings import InjectionSettings

T0 = 1_760_000_000_000_000
FACT = "My daughter Ingrid is allergic to peanuts, so never order satay for her."
QUERY = "What should I never order for Ingrid?"


@pytest.fixture(params=["residual", "attend"])
async def services(
    engine: TransformersEngine, tmp_path: Path, request: pytest.FixtureRequest
) -> AsyncIterator[tuple[InjectionService, MemtokService]]:
    settings = InjectionSettings(
        data_dir=str(tmp_path), memtok_min_similarity=0.2, influence_route=request.param
    )
    queue = ModelQueue(4)
    memtok = MemtokService(build_pipeline(settings, engine, BagEmbedder()), queue)
    yield InjectionService(engine, queue, limits(settings)), memtok
    memtok.close()
    await queue.close()


async def _reply(service: InjectionService, request: GenerateRequest) -> list[int]:
    return [item.token.id async for item in service.generate(request)]


async def test_off_is_the_plain_model_and_on_applies_what_is_audited(
    services: tuple[InjectionService, MemtokService],
) -> None:
    service, memtok = services
    report = await memtok.write("t", "u", FACT, "", T0)
    assert {"Ingrid", "satay"} <= {w.word for w in report.written if w.outcome == "new"}
    prompt = Prompt(text=f"Question: {QUERY}\nAnswer:")
    plain = await _reply(service, GenerateRequest(prompt, max_new_tokens=8))

    off = await memtok.plan("t", "u", QUERY, None, T0)  # no request mode, none recorded
    assert off.mode is Mode.OFF and off.influences == [] and off.selected == []
    request = GenerateRequest(prompt, max_new_tokens=8, influences=tuple(off.influences))
    assert await _reply(service, request) == plain

    await memtok.set_user_mode("t", "u", Mode.ON)
    on = await memtok.plan("t", "u", QUERY, None, T0)  # the user's mode applies
    body = json.loads(convert.plan_response(on).audit_json)
    assert on.mode is Mode.ON and on.applied
    assert [a["memtok_id"] for a in body["influences"]] == [a.memtok_id for a in on.applied]
    disclosed = await memtok.plan("t", "u", QUERY, Mode.DISCLOSE_ONLY, T0)
    assert disclosed.influences == [] and disclosed.attendable is None
    assert [a.memtok_id for a in disclosed.applied] == [a.memtok_id for a in on.applied]
    plain_score = await service.score(ScoreRequest(prompt, " satay"))
    if memtok.pipeline.settings.route.value == "attend":
        # The chosen memtoks' stored states, attended: the answer becomes likelier.
        assert on.influences == [] and on.attendable is not None
        assert [e["route"] for e in body["influences"]] == ["attend"] * len(on.applied)
        assert [e["tokens"] for e in body["influences"]] == [s.tokens for s in on.attendable.states]
        attended = await service.score(ScoreRequest(prompt, " satay", attendable=on.attendable))
        assert attended.total > plain_score.total
        return
    assert on.influences and on.attendable is None
    for entry, influence in zip(body["influences"], on.influences, strict=True):
        assert entry["layer"] == influence.layer == 3
        assert entry["strength"] == pytest.approx(influence.strength, abs=1e-6)
        assert 0 < influence.strength <= 0.06 * 1.5
    moved = await service.score(ScoreRequest(prompt, " satay", influences=tuple(on.influences)))
    assert moved.total != plain_score.total  # the hooks were applied
    assert np.all([i.vector.dtype == np.float32 for i in on.influences])


def test_grpc_without_a_store_is_failed_precondition(
    stub: injection_pb2_grpc.InjectionServiceStub,
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        stub.PlanInfluence(pb.PlanInfluenceRequest(tenant="t", user_id="u", query="hi"), timeout=30)
    assert caught.value.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert "memtok" in (caught.value.details() or "")
