"""The per-query influence pipeline on the tiny random model (hook mechanics, fast):
what it selects, what it applies, what it skips and why, and that its audit body is
exactly what was applied."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from memtok_fakes import close, obs, open_store

from hippo_injection.adapters.engine import TransformersEngine
from hippo_injection.domain.memtok.pipeline import (
    InfluencePipeline,
    Mode,
    PipelineSettings,
    Route,
)
from hippo_injection.domain.memtok.policy import Policy
from hippo_injection.domain.memtok.store import MemtokStore
from hippo_injection.domain.types import Positions

T0 = 1_760_000_000_000_000
QUERY = "the cat sat on the mat"


@pytest.fixture
def store(
    tmp_path: Path, engine_url: str, tiny_engine: TransformersEngine
) -> Iterator[MemtokStore]:
    from memtok_fakes import FakeValues

    values = FakeValues("tiny-gemma3", layer=1, hidden=tiny_engine.info.hidden_size)
    s = open_store(tmp_path, Policy(min_rank=0.0, min_similarity=0.35), values, url=engine_url)
    yield s
    close(s)


def _pipeline(engine: TransformersEngine, store: MemtokStore, **kw: object) -> InfluencePipeline:
    settings = PipelineSettings(layer=1, llm2_layer=1, select_share=1.0, **kw)  # type: ignore[arg-type]
    return InfluencePipeline(engine, store, settings)


def test_off_selects_nothing(tiny_engine: TransformersEngine, store: MemtokStore) -> None:
    store.admit("t", "u", [obs("cat", context="the")], T0)
    plan = _pipeline(tiny_engine, store).plan("t", "u", QUERY, T0, Mode.OFF)
    assert plan.applied == [] and plan.influences == [] and plan.selected == []
    assert plan.audit_body()["influences"] == []


def test_empty_store_injects_nothing(tiny_engine: TransformersEngine, store: MemtokStore) -> None:
    plan = _pipeline(tiny_engine, store).plan("t", "u", QUERY, T0, Mode.ON)
    assert plan.selected  # LLM1 still picked words
    assert plan.shortlist == 0 and plan.influences == []
    assert plan.skipped == [{"reason": "empty_store"}]


def test_thin_store_injects_nothing(tiny_engine: TransformersEngine, store: MemtokStore) -> None:
    # Only unrelated words: every similarity is below the minimum.
    store.admit("t", "u", [obs("dog", context="a"), obs("hello", context="ran")], T0)
    plan = _pipeline(tiny_engine, store).plan("t", "u", QUERY, T0, Mode.ON)
    assert plan.shortlist == 2 and plan.influences == [] and plan.applied == []
    assert {s["reason"] for s in plan.skipped} == {"below_min_similarity"}


def test_applied_influences_match_the_audit_body(
    tiny_engine: TransformersEngine, store: MemtokStore
) -> None:
    store.admit("t", "u", [obs("cat", context="the"), obs("mat", context="on the")], T0)
    store.admit("t", "u", [obs("cat", context="the")], T0 + 1)  # count 2
    store.admit("t", "u", [obs("dog", context="a")], T0)
    pipeline = _pipeline(tiny_engine, store)
    plan = pipeline.plan("t", "u", QUERY, T0 + 1, Mode.ON)
    body = plan.audit_body()
    assert body["influence_mode"] == "on" and body["shortlist"] == 3
    assert body["llm2_kept"] == 3
    applied = body["influences"]
    words = plan.private_body()["words"]
    assert isinstance(applied, list) and isinstance(words, dict)
    assert {words[a["memtok_id"]] for a in applied} == {"cat", "mat"}
    assert "cat" not in json.dumps(body) and "mat" not in json.dumps(body)  # ids only
    items = {m.id: m for m in store.items.by_user("t", "u")}
    assert len(plan.influences) == len(applied)
    for entry, influence in zip(applied, plan.influences, strict=True):
        item = items[entry["memtok_id"]]
        assert influence.layer == entry["layer"] == 1
        assert influence.positions is Positions.ALL
        assert influence.strength == pytest.approx(entry["strength"], abs=1e-6)
        np.testing.assert_array_equal(influence.vector, item.value)
        assert entry["count"] == item.count
    cat = next(a for a in applied if words[a["memtok_id"]] == "cat")
    mat = next(a for a in applied if words[a["memtok_id"]] == "mat")
    assert cat["count"] == 2 and cat["strength"] > 0 and mat["strength"] > 0
    skipped = [s for s in body["skipped"] if isinstance(s, dict)]  # type: ignore[union-attr]
    assert [s["reason"] for s in skipped] == ["below_min_similarity"]  # the dog


def test_disclose_only_selects_but_applies_nothing(
    tiny_engine: TransformersEngine, store: MemtokStore
) -> None:
    store.admit("t", "u", [obs("cat", context="the")], T0)
    plan = _pipeline(tiny_engine, store).plan("t", "u", QUERY, T0, Mode.DISCLOSE_ONLY)
    assert [a.word for a in plan.applied] == ["cat"] and plan.influences == []


def test_max_inject_and_decay(tiny_engine: TransformersEngine, store: MemtokStore) -> None:
    store.admit("t", "u", [obs("cat", context="the"), obs("mat", context="on the")], T0)
    pipeline = _pipeline(tiny_engine, store, max_inject=1)
    plan = pipeline.plan("t", "u", QUERY, T0, Mode.ON)
    assert len(plan.applied) == 1
    assert [s["reason"] for s in plan.skipped] == ["over_max_inject"]
    later = pipeline.plan("t", "u", QUERY, T0 + 30 * 86_400_000_000, Mode.ON)
    assert later.applied[0].strength == pytest.approx(plan.applied[0].strength / 2, rel=1e-6)


def test_llm2_stops_at_the_middle_layer(tiny_engine: TransformersEngine) -> None:
    calls: list[int] = []
    hooks = [
        layer.register_forward_hook(lambda m, a, o, i=i: calls.append(i))
        for i, layer in enumerate(tiny_engine.layers)
    ]
    try:
        ids = [tiny_engine.bos_id, *tiny_engine.tokenize("cat mat dog the cat")]
        scores = tiny_engine.span_attention(ids, [(1, 2), (2, 3), (3, 4)], (4, 6), 1)
    finally:
        for h in hooks:
            h.remove()
    assert calls == [0, 1] and len(scores) == 3 and all(s >= 0 for s in scores)
    assert tiny_engine.model.config._attn_implementation == "sdpa"  # restored


def test_write_admits_query_words_and_buffers_reply_words(
    tiny_engine: TransformersEngine, store: MemtokStore
) -> None:
    pipeline = _pipeline(tiny_engine, store)
    report = pipeline.write("t", "u", "the cat sat", "a dog ran", T0)
    assert {w.word for w in report.written if w.outcome == "new"} == {"the", "cat", "sat"}
    assert report.buffered == 3 and sorted(store.buffered("t", "u")) == ["a", "dog", "ran"]
    plan = pipeline.plan("t", "u", "hello dog", T0 + 1, Mode.DISCLOSE_ONLY)
    assert plan.audit_body()["promoted"] == 1 and plan.private_body()["promoted"] == ["dog"]
    dog = next(m for m in store.items.by_user("t", "u") if m.word == "dog")
    assert dog.source.value == "model"


def test_write_promotes_echoed_reply_words_when_no_plan_ran(
    tiny_engine: TransformersEngine, store: MemtokStore
) -> None:
    pipeline = _pipeline(tiny_engine, store)
    pipeline.write("t", "u", "the cat sat", "a dog ran", T0)
    report = pipeline.write("t", "u", "hello dog", "", T0 + 1)
    assert report.promoted == ["dog"] and store.buffered("t", "u") == []
    sources = {(m.word, m.source.value) for m in store.items.by_user("t", "u")}
    assert ("dog", "model") in sources and ("hello", "operator") in sources
    assert not any(word == "ran" for word, _ in sources)  # not echoed: discarded


def test_salience_passes_leave_the_model_as_it_was(tiny_engine: TransformersEngine) -> None:
    from hippo_injection.domain.types import Attendable

    ids = [tiny_engine.bos_id, *tiny_engine.tokenize("the cat sat on")]
    cont = tiny_engine.tokenize("the mat")
    before = tiny_engine.score(ids, cont, [], Attendable())
    tiny_engine.token_salience(ids)
    tiny_engine.span_attention(ids, [(1, 3)], (3, 5), 2)
    assert tiny_engine.score(ids, cont, [], Attendable()) == before  # bit-identical
    assert tiny_engine.model.config._attn_implementation == "sdpa"


# -- the attend route (issue 20) ----------------------------------------------------------


@pytest.fixture
def attending(
    tmp_path: Path, engine_url: str, tiny_engine: TransformersEngine
) -> Iterator[MemtokStore]:
    """A store that keeps each item's states, made by the tiny model itself."""
    from memtok_fakes import FakeValues

    from hippo_injection.domain.memtok.values import EngineStates

    values = FakeValues("tiny-gemma3", layer=1, hidden=tiny_engine.info.hidden_size)
    s = open_store(
        tmp_path,
        Policy(min_rank=0.0, min_similarity=0.35),
        values,
        url=engine_url,
        attend=EngineStates(tiny_engine, 1),  # type: ignore[arg-type]
    )
    yield s
    close(s)


def test_the_attend_route_attaches_the_winners_stored_states(
    tiny_engine: TransformersEngine, attending: MemtokStore
) -> None:
    attending.admit("t", "u", [obs("cat", context="the"), obs("mat", context="on the")], T0)
    attending.admit("t", "u", [obs("dog", context="a")], T0)
    plan = _pipeline(tiny_engine, attending, route=Route.ATTEND).plan("t", "u", QUERY, T0, Mode.ON)
    assert plan.influences == []  # no residual influence on this route
    assert plan.attendable is not None and plan.attendable.from_layer == 1
    body = plan.audit_body()
    applied = body["influences"]
    assert isinstance(applied, list) and len(applied) == 2
    stored = attending.items.states("t", "u", [a["memtok_id"] for a in applied])
    assert len(plan.attendable.states) == len(applied)
    for entry, states in zip(applied, plan.attendable.states, strict=True):
        assert entry["route"] == "attend" and entry["layer"] == 1
        assert entry["tokens"] == states.tokens
        assert np.array_equal(states.keys, stored[entry["memtok_id"]].keys)
    # Through PlanInfluenceResponse and back as Generate's `attendable` (the gateway
    # passes it on untouched): the very same states.
    from hippo_injection import convert

    wire = convert.plan_response(plan).attendable
    back = convert._attendable(wire)
    assert back.from_layer == 1 and len(back.states) == len(plan.attendable.states)
    for sent, got in zip(plan.attendable.states, back.states, strict=True):
        assert np.array_equal(sent.keys, got.keys) and np.array_equal(sent.values, got.values)
    # Disclosed only: the same choice, nothing attached.
    shown = _pipeline(tiny_engine, attending, route=Route.ATTEND).plan(
        "t", "u", QUERY, T0, Mode.DISCLOSE_ONLY
    )
    assert [a.memtok_id for a in shown.applied] == [a["memtok_id"] for a in applied]
    assert shown.attendable is None and shown.influences == []


def test_the_attend_route_caps_tokens(
    tiny_engine: TransformersEngine, attending: MemtokStore
) -> None:
    attending.admit("t", "u", [obs("cat", context="the"), obs("mat", context="on the")], T0)
    tight = _pipeline(tiny_engine, attending, route=Route.ATTEND, attend_tokens=3)
    plan = tight.plan("t", "u", QUERY, T0, Mode.ON)
    assert len(plan.applied) == 1 and plan.attendable is not None
    assert sum(s.tokens for s in plan.attendable.states) <= 3
    assert [s["reason"] for s in plan.skipped] == ["over_attend_tokens"]


def test_items_stored_before_states_were_kept_are_skipped_not_attended(
    tmp_path: Path, engine_url: str, tiny_engine: TransformersEngine
) -> None:
    from memtok_fakes import FakeValues

    from hippo_injection.domain.memtok.values import EngineStates

    values = FakeValues("tiny-gemma3", layer=1, hidden=tiny_engine.info.hidden_size)
    policy = Policy(min_rank=0.0, min_similarity=0.35)
    plain = open_store(tmp_path, policy, values, url=engine_url)
    plain.admit("t", "u", [obs("cat", context="the")], T0)
    close(plain)
    s = open_store(tmp_path, policy, values, url=engine_url, attend=EngineStates(tiny_engine, 1))  # type: ignore[arg-type]
    try:
        plan = _pipeline(tiny_engine, s, route=Route.ATTEND).plan("t", "u", QUERY, T0, Mode.ON)
        assert plan.applied == [] and plan.attendable is None
        assert [x["reason"] for x in plan.skipped] == ["no_states"]
        assert s.rebuild() == 1  # `hippo memtok rebuild` computes them
        again = _pipeline(tiny_engine, s, route=Route.ATTEND).plan("t", "u", QUERY, T0, Mode.ON)
        assert again.attendable is not None and len(again.attendable.states) == 1
    finally:
        close(s)


def test_the_attend_route_needs_the_store_to_keep_states() -> None:
    from pydantic import ValidationError

    from hippo_injection.settings import InjectionSettings

    with pytest.raises(ValidationError, match="memtok_attend_layer"):
        InjectionSettings(influence_route="attend", memtok_attend_layer=-1)
    chosen = InjectionSettings()  # the defaults: attend, from layer 6
    assert (chosen.influence_route, chosen.memtok_attend_layer) == ("attend", 6)
    assert InjectionSettings(influence_route="residual", memtok_attend_layer=-1)
