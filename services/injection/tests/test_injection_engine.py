"""The influence mechanism on a tiny random Gemma 3 and on the real Gemma 3 270M."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import torch

from hippo_injection.adapters import hooks, sampling
from hippo_injection.adapters.engine import TransformersEngine
from hippo_injection.domain.queue import ModelQueue
from hippo_injection.domain.service import InjectionService
from hippo_injection.domain.types import (
    Attendable,
    GenerateRequest,
    Influence,
    MemoryStates,
    Positions,
    Prompt,
    Sampling,
    ScoreRequest,
    ValueVectorRequest,
)
from hippo_injection.domain.validation import Limits

LIMITS = Limits(
    context_length=512,
    max_new_tokens=64,
    max_stop_sequences=4,
    max_stop_chars=32,
    max_influences=4,
    max_strength=64.0,
    max_memories=4,
    max_memory_tokens=256,
    max_value_scale=8.0,
    max_baseline_texts=32,
)


def _hook_count(engine: TransformersEngine) -> int:
    return sum(len(layer._forward_hooks) for layer in engine.layers)


def _plain_last_logits(engine: TransformersEngine, ids: list[int]) -> torch.Tensor:
    """The model without any of our code: one forward pass, the last row of logits."""
    with torch.inference_mode():
        out = engine.model(input_ids=torch.tensor([ids]), logits_to_keep=1)
    return out.logits[0, -1].float()


def _random_vector(engine: TransformersEngine, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(engine.info.hidden_size).astype(np.float32)


@pytest.fixture
def spy(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """Counts hook registrations and removals made through `hooks.install`."""
    counts = {"added": 0, "removed": 0}
    real_register = torch.nn.Module.register_forward_hook

    def register(self: torch.nn.Module, hook: object, *args: object, **kwargs: object) -> object:
        handle = real_register(self, hook, *args, **kwargs)  # type: ignore[arg-type]
        if isinstance(hook, hooks.InfluenceHook):
            counts["added"] += 1
            real_remove = handle.remove

            def remove() -> None:
                counts["removed"] += 1
                real_remove()

            handle.remove = remove  # type: ignore[method-assign]
        return handle

    monkeypatch.setattr(torch.nn.Module, "register_forward_hook", register)
    yield counts


def _service(engine: TransformersEngine) -> InjectionService:
    return InjectionService(engine, ModelQueue(max_waiting=4), LIMITS)


async def _collect(service: InjectionService, request: GenerateRequest) -> list[object]:
    return [item async for item in service.generate(request)]


# -- tiny model: mechanics -------------------------------------------------------------


def test_no_influence_gives_bit_identical_logits_tiny(tiny_engine: TransformersEngine) -> None:
    ids = [2, 6, 8, 9, 10]
    run = tiny_engine.open(ids, [], Attendable(), Sampling())
    ours = run.forward(ids, 1)[-1]
    run.close()
    assert torch.equal(ours, _plain_last_logits(tiny_engine, ids))


def test_hook_handles_tensor_and_tuple_layer_outputs() -> None:
    state = hooks.RunState(prompt_len=2)
    delta = hooks.Delta(torch.ones(3), Positions.ALL)
    hook = hooks.InfluenceHook([delta], state)
    hidden = torch.zeros(1, 4, 3)
    assert torch.equal(hook(torch.nn.Identity(), (), hidden), torch.ones(1, 4, 3))
    out = hook(torch.nn.Identity(), (), (hidden, "attn"))  # transformers 4.x shape
    assert isinstance(out, tuple) and out[1] == "attn" and torch.equal(out[0], torch.ones(1, 4, 3))


@pytest.mark.parametrize(
    ("positions", "offset", "expected"),
    [
        (Positions.PROMPT, 0, [1, 1, 0, 0]),  # a score pass: 2 prompt + 2 continuation
        (Positions.GENERATED, 0, [0, 0, 1, 1]),
        (Positions.ALL, 0, [1, 1, 1, 1]),
        (Positions.PROMPT, 5, [0, 0, 0, 0]),  # decode steps after a 2-token prompt
        (Positions.GENERATED, 5, [1, 1, 1, 1]),
    ],
)
def test_hook_adds_only_at_the_chosen_positions(
    positions: Positions, offset: int, expected: list[int]
) -> None:
    state = hooks.RunState(prompt_len=2, offset=offset)
    hook = hooks.InfluenceHook([hooks.Delta(torch.ones(3), positions)], state)
    out = hook(torch.nn.Identity(), (), torch.zeros(1, 4, 3))
    assert out[0, :, 0].tolist() == expected


async def test_hooks_added_and_removed_once_per_request(
    tiny_engine: TransformersEngine, spy: dict[str, int]
) -> None:
    vector = _random_vector(tiny_engine)
    influences = (Influence(vector, 1, 2.0), Influence(vector, 1, -1.0), Influence(vector, 3, 1.0))
    request = GenerateRequest(Prompt(text="the cat sat"), max_new_tokens=5, influences=influences)
    items = await _collect(_service(tiny_engine), request)
    assert len(items) == 5
    assert spy == {"added": 2, "removed": 2}  # one hook per influenced layer, per request
    assert _hook_count(tiny_engine) == 0


async def test_hooks_removed_when_generation_fails(
    tiny_engine: TransformersEngine, spy: dict[str, int], monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = {"n": 0}
    real_choose = sampling.choose

    def failing(*args: object, **kwargs: object) -> tuple[int, float]:
        calls["n"] += 1
        if calls["n"] == 3:
            raise RuntimeError("sampler broke")
        return real_choose(*args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sampling, "choose", failing)
    request = GenerateRequest(
        Prompt(text="the cat"),
        max_new_tokens=8,
        influences=(Influence(_random_vector(tiny_engine), 2, 1.0),),
    )
    with pytest.raises(RuntimeError, match="sampler broke"):
        await _collect(_service(tiny_engine), request)
    assert spy == {"added": 1, "removed": 1} and _hook_count(tiny_engine) == 0


async def test_hooks_removed_when_the_caller_cancels(
    tiny_engine: TransformersEngine, spy: dict[str, int]
) -> None:
    service = _service(tiny_engine)
    request = GenerateRequest(
        Prompt(text="the dog ran"),
        max_new_tokens=60,
        influences=(Influence(_random_vector(tiny_engine), 0, 1.0),),
    )
    first = asyncio.Event()

    async def consume() -> None:
        async for _ in service.generate(request):
            first.set()

    task = asyncio.create_task(consume())
    await first.wait()
    assert _hook_count(tiny_engine) == 1  # installed while the request runs
    task.cancel()
    await asyncio.gather(task, return_exceptions=True)
    assert spy == {"added": 1, "removed": 1} and _hook_count(tiny_engine) == 0
    # The model is clean for the next request: bit-identical to the plain model again.
    ids = [2, 6, 7]
    run = tiny_engine.open(ids, [], Attendable(), Sampling())
    assert torch.equal(run.forward(ids, 1)[-1], _plain_last_logits(tiny_engine, ids))
    run.close()


def test_one_memory_as_attendable_positions_equals_it_as_a_prefix(
    tiny_engine: TransformersEngine,
) -> None:
    """A lone memory at value scale 1 is exactly its tokens before the prompt's <bos>."""
    memory, prompt = "the cat sat on the mat", [2, 14, 15]
    run = tiny_engine.open(prompt, [], Attendable((memory,)), Sampling())
    ours = run.forward(prompt, 1)[-1]
    run.close()
    prefixed = [2, *tiny_engine.tokenize(memory), *prompt]
    torch.testing.assert_close(ours, _plain_last_logits(tiny_engine, prefixed))
    hidden = tiny_engine.open(prompt, [], Attendable((memory,), value_scale=0.0), Sampling())
    muted = hidden.forward(prompt, 1)[-1]
    hidden.close()
    assert not torch.allclose(muted, ours)


def _last(engine: TransformersEngine, prompt: list[int], attendable: Attendable) -> torch.Tensor:
    run = engine.open(prompt, [], attendable, Sampling())
    try:
        return run.forward(prompt, 1)[-1]
    finally:
        run.close()


@pytest.mark.parametrize("from_layer", [0, 1])
def test_stored_memory_states_are_attended_as_the_memories_read_now(
    tiny_engine: TransformersEngine, from_layer: int
) -> None:
    """States computed once (positions from 0) and attached later, each after the ones
    before it, give what reading the same memories at request time gives: the keys are
    rotated to their positions. float16 storage: close, not bit-equal."""
    memories, prompt = ("the cat sat on the mat", "a dog ran home"), [2, 14, 15]
    read = _last(tiny_engine, prompt, Attendable(memories, from_layer=from_layer))
    states = tuple(tiny_engine.memory_states(m, from_layer) for m in memories)
    stored = _last(tiny_engine, prompt, Attendable(from_layer=from_layer, states=states))
    torch.testing.assert_close(stored, read, atol=2e-3, rtol=2e-3)
    # Mixed: the first read now, the second stored: the same positions, the same result.
    mixed = Attendable(memories[:1], from_layer=from_layer, states=states[1:])
    torch.testing.assert_close(_last(tiny_engine, prompt, mixed), read, atol=2e-3, rtol=2e-3)
    # Order matters (positions): the memories swapped are not the same context.
    swapped = _last(tiny_engine, prompt, Attendable(from_layer=from_layer, states=states[::-1]))
    assert not torch.allclose(swapped, read, atol=2e-3, rtol=2e-3)


def test_memory_states_keep_values_only_from_their_layer(tiny_engine: TransformersEngine) -> None:
    layers = len(tiny_engine.layers)
    states = tiny_engine.memory_states("the cat sat on the mat", 1)
    n = 1 + len(tiny_engine.tokenize("the cat sat on the mat"))
    assert states.tokens == n and states.from_layer == 1
    assert states.keys.shape[:3] == (layers, states.keys.shape[1], n)
    assert states.values.shape[0] == layers - 1
    assert states.keys.dtype == states.values.dtype == np.float16
    assert states.nbytes == states.keys.nbytes + states.values.nbytes
    with pytest.raises(ValueError, match="from_layer"):
        tiny_engine.memory_states("x", layers)


def test_stored_states_of_another_model_or_shape_are_refused(
    tiny_engine: TransformersEngine,
) -> None:
    states = tiny_engine.memory_states("the cat sat on the mat", 0)
    other = MemoryStates("another-model", 0, states.keys, states.values)
    with pytest.raises(ValueError, match="another-model"):
        tiny_engine.open([2, 14], [], Attendable(states=(other,)), Sampling())
    short = MemoryStates(states.model_id, 0, states.keys[:1], states.values[:1])
    with pytest.raises(ValueError, match="layers"):
        tiny_engine.open([2, 14], [], Attendable(states=(short,)), Sampling())


def test_attending_stored_states_leaves_weights_and_the_next_request_untouched(
    tiny_engine: TransformersEngine,
) -> None:
    before = {k: v.clone() for k, v in tiny_engine.model.state_dict().items()}
    prompt = [2, 6, 7]
    states = (tiny_engine.memory_states("the cat sat on the mat", 1),)
    kept = states[0].keys.copy()
    changed = _last(tiny_engine, prompt, Attendable(from_layer=1, states=states))
    assert not torch.equal(changed, _plain_last_logits(tiny_engine, prompt))
    assert np.array_equal(states[0].keys, kept)  # the stored states are not modified
    assert all(torch.equal(v, before[k]) for k, v in tiny_engine.model.state_dict().items())
    assert torch.equal(
        _last(tiny_engine, prompt, Attendable()), _plain_last_logits(tiny_engine, prompt)
    )


# -- the real Gemma 3 270M -------------------------------------------------------------


def test_no_influence_gives_bit_identical_logits_real(engine: TransformersEngine) -> None:
    ids = [engine.bos_id, *engine.tokenize("The capital of France is")]
    plain = _plain_last_logits(engine, ids)
    run = engine.open(ids, [], Attendable(), Sampling())
    ours = run.forward(ids, 1)[-1]
    run.close()
    assert torch.equal(ours, plain)
    # ... and still after a request that did carry an influence.
    vector = _random_vector(engine)
    influenced = engine.open(ids, [Influence(vector, 9, 4.0)], Attendable(), Sampling())
    changed = influenced.forward(ids, 1)[-1]
    influenced.close()
    again = engine.open(ids, [], Attendable(), Sampling())
    assert torch.equal(again.forward(ids, 1)[-1], plain) and not torch.equal(changed, plain)
    again.close()


def test_stored_states_attend_as_reading_the_memories_real(engine: TransformersEngine) -> None:
    """Gemma 3's two rotary bases (local and global layers) both move the stored keys to
    their positions: stored and read memories give the same next-token logits, to
    float16's precision."""
    memories = ("My sister Ana lives in Porto and teaches violin.", "The boat is called Osprey.")
    prompt = [engine.bos_id, *engine.tokenize("Question: Where does my sister live?\nAnswer:")]
    read = _last(engine, prompt, Attendable(memories, from_layer=6))
    states = tuple(engine.memory_states(m, 6) for m in memories)
    stored = _last(engine, prompt, Attendable(from_layer=6, states=states))
    assert float((read - stored).abs().max()) < 0.02
    assert int(read.argmax()) == int(stored.argmax())


async def test_a_value_vector_measurably_shifts_the_next_token_distribution(
    engine: TransformersEngine,
) -> None:
    service = InjectionService(engine, ModelQueue(4), LIMITS)
    layer = 6
    made = await service.make_value_vector(
        ValueVectorRequest(
            "My favourite colour is teal.", layer, subtract_baseline=True, scale_to_layer_norm=True
        )
    )
    assert made.vector.shape == (640,)
    assert made.norm == pytest.approx(engine.info.layer_mean_norms[layer], rel=1e-4)
    ids = [engine.bos_id, *engine.tokenize("Question: What is my favourite colour?\nAnswer:")]

    def distribution(strength: float) -> torch.Tensor:
        influences = [Influence(made.vector, layer, strength)] if strength else []
        run = engine.open(ids, influences, Attendable(), Sampling())
        logits = run.forward(ids, 1)[-1]
        run.close()
        return torch.log_softmax(logits, dim=-1)

    plain, pushed = distribution(0.0), distribution(2.0)
    kl = float((plain.exp() * (plain - pushed)).sum())
    assert kl > 0.05, kl
    assert torch.equal(plain, distribution(0.0))  # deterministic: the shift is the vector


async def test_score_agrees_with_greedy_generation(engine: TransformersEngine) -> None:
    service = InjectionService(engine, ModelQueue(4), LIMITS)
    prompt = Prompt(text="The capital of France is")
    items = [item async for item in service.generate(GenerateRequest(prompt, max_new_tokens=4))]
    text = "".join(item.token.text for item in items)  # type: ignore[attr-defined]
    scored = await service.score(ScoreRequest(prompt, text))
    assert scored.greedy_match
    generated = [item.token.logprob for item in items]  # type: ignore[attr-defined]
    if list(scored.token_ids) == [item.token.id for item in items]:  # type: ignore[attr-defined]
        np.testing.assert_allclose(scored.logprobs, generated, atol=0.05)


def test_bfloat16_engine_keeps_the_plain_models_logits(model_dir: Path) -> None:
    """The GPU default: same cache, loaded as bf16; no influence, no change."""
    bf16 = TransformersEngine.load(model_dir, "bfloat16", "cpu", threads=1)
    assert bf16.info.dtype == "bfloat16" and len(bf16.info.layer_mean_norms) == 18
    ids = [bf16.bos_id, *bf16.tokenize("Hello")]
    run = bf16.open(ids, [], Attendable(), Sampling())
    assert torch.equal(run.forward(ids, 1)[-1], _plain_last_logits(bf16, ids))
    run.close()
