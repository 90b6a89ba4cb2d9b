"""Domain rules without a real model: prompt format, text streaming, validation, queue."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from hippo_core.errors import InvalidArgument, ResourceExhausted, Unavailable
from hippo_injection.domain import prompt, validation
from hippo_injection.domain.queue import ModelQueue
from hippo_injection.domain.text import IncrementalDecoder, stop_hit
from hippo_injection.domain.types import (
    Attendable,
    Influence,
    Message,
    ModelInfo,
    Prompt,
    Role,
    Sampling,
)

INFO = ModelInfo(
    "m",
    layers=18,
    hidden_size=640,
    dtype="bfloat16",
    device="cpu",
    vocab_size=1000,
    layer_mean_norms=(1.0,) * 18,
)
LIMITS = validation.Limits(
    context_length=128,
    max_new_tokens=64,
    max_stop_sequences=2,
    max_stop_chars=8,
    max_influences=2,
    max_strength=8.0,
    max_memories=2,
    max_memory_tokens=32,
    max_value_scale=4.0,
    max_baseline_texts=4,
)


def test_messages_render_with_gemma_turn_markers() -> None:
    text = prompt.render(
        Prompt(
            messages=(
                Message(Role.SYSTEM, "Be brief."),
                Message(Role.USER, "Hi"),
                Message(Role.ASSISTANT, "Hello."),
                Message(Role.USER, "Name?"),
            )
        )
    )
    assert text == (
        "<start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n"
        "<start_of_turn>model\nHello.<end_of_turn>\n"
        "<start_of_turn>user\nName?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    assert prompt.render(Prompt(text="raw")) == "raw"


@pytest.mark.parametrize(
    ("messages", "fragment"),
    [
        ((), "at least 1 user or assistant message"),
        ((Message(Role.USER, "a"), Message(Role.SYSTEM, "s")), "may only come first"),
        ((Message(Role.SYSTEM, "s"), Message(Role.ASSISTANT, "a")), "followed by a user one"),
    ],
)
def test_bad_conversations_are_refused(messages: tuple[Message, ...], fragment: str) -> None:
    with pytest.raises(InvalidArgument, match=fragment) as caught:
        prompt.render_messages(messages)
    assert caught.value.field == "messages"


def test_incremental_decoder_pieces_concatenate_to_the_whole() -> None:
    # A byte-level toy: ids are UTF-8 bytes, so "é" arrives in two tokens.
    def decode(ids: list[int]) -> str:  # type: ignore[type-arg]
        return bytes(ids).decode("utf-8", errors="replace")

    target = "a é!"
    decoder = IncrementalDecoder(decode, list(b"xx"))
    pieces = [decoder.push(b) for b in target.encode()]
    assert "".join(pieces) == target
    assert pieces[2] == "" and pieces[3] == "é"  # held until the character completes


def test_stop_sequence_found_inside_the_last_token() -> None:
    assert stop_hit("Paris.\n", 2, [".\n"])
    assert stop_hit("Paris.\nThe", 5, ["."])  # TGI's end-anchored rule would miss this
    assert not stop_hit("Paris. The", 4, ["."])  # the stop came with an earlier token
    assert not stop_hit("Paris", 5, [])


def _influence(**changes: object) -> Influence:
    base: dict[str, object] = {"vector": np.ones(640, np.float32), "layer": 3, "strength": 1.0}
    return Influence(**{**base, **changes})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("influence", "field", "fragment"),
    [
        (
            _influence(vector=np.ones(639, np.float32)),
            "influences[0].vector",
            "must hold 640 float32 values (2560 bytes), got 639",
        ),
        (
            _influence(vector=np.full(640, np.nan, np.float32)),
            "influences[0].vector",
            "NaN or inf at index 0",
        ),
        (
            _influence(vector=np.r_[np.ones(5), np.inf, np.ones(634)].astype(np.float32)),
            "influences[0].vector",
            "NaN or inf at index 5",
        ),
        (_influence(layer=18), "influences[0].layer", "must be 0 to 17, got 18"),
        (_influence(strength=8.5), "influences[0].strength", "within ±8, got 8.5"),
        (_influence(strength=float("nan")), "influences[0].strength", "finite number"),
    ],
)
def test_bad_influences_name_the_field_and_limit(
    influence: Influence, field: str, fragment: str
) -> None:
    with pytest.raises(InvalidArgument) as caught:
        validation.influences([influence], INFO, LIMITS)
    assert caught.value.field == field and fragment in caught.value.problem


def test_limits_on_counts_sampling_and_memories() -> None:
    with pytest.raises(InvalidArgument, match="at most 2 per request, got 3"):
        validation.influences([_influence()] * 3, INFO, LIMITS)
    with pytest.raises(InvalidArgument, match="must be 1 to 64, got 65"):
        validation.generation(65, (), 10, LIMITS)
    with pytest.raises(InvalidArgument, match="exceed the context length of 128"):
        validation.generation(64, (), 65, LIMITS)
    with pytest.raises(InvalidArgument, match="at most 2 sequences, got 3"):
        validation.generation(1, ("a", "b", "c"), 10, LIMITS)
    with pytest.raises(InvalidArgument, match=r"top_p: must be in \(0, 1\], got 1.5"):
        validation.sampling(Sampling(top_p=1.5), INFO.vocab_size)
    with pytest.raises(InvalidArgument, match="temperature"):
        validation.sampling(Sampling(temperature=0.0), INFO.vocab_size)
    with pytest.raises(InvalidArgument, match="at most 32 tokens in all, got 40"):
        validation.attendable(Attendable(("x",)), 40, INFO, LIMITS)
    with pytest.raises(InvalidArgument, match="value_scale: must be 0 to 4, got 5"):
        validation.attendable(Attendable(("x",), value_scale=5.0), 3, INFO, LIMITS)


async def test_queue_runs_one_request_at_a_time_then_refuses() -> None:
    queue = ModelQueue(max_waiting=1)
    release = asyncio.Event()
    order: list[str] = []

    async def hold(name: str) -> None:
        async with queue.lease():
            order.append(name)
            await release.wait()

    first = asyncio.create_task(hold("first"))
    await asyncio.sleep(0.01)
    second = asyncio.create_task(hold("second"))
    await asyncio.sleep(0.01)
    assert queue.waiting == 1 and order == ["first"]
    with pytest.raises(
        ResourceExhausted, match=r"1 interactive requests waiting \(max_waiting=1\)"
    ):
        async with queue.lease():
            pass
    release.set()
    await asyncio.gather(first, second)
    assert order == ["first", "second"]
    await queue.close()
    with pytest.raises(Unavailable):
        async with queue.lease():
            pass


async def test_a_waiter_that_gives_up_leaves_the_wait_list() -> None:
    queue = ModelQueue(max_waiting=1)
    release = asyncio.Event()

    async def hold() -> None:
        async with queue.lease():
            await release.wait()

    holder = asyncio.create_task(hold())
    await asyncio.sleep(0.01)
    waiter = asyncio.create_task(hold())
    await asyncio.sleep(0.01)
    waiter.cancel()
    await asyncio.gather(waiter, return_exceptions=True)
    assert queue.waiting == 0
    release.set()
    await holder
    await queue.close()
