"""Merges as background work: the pause between a replica's merge LLM calls, and the
priority mark on its LLM (HTTP header) and CountTokens (gRPC metadata) calls."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Sequence

import grpc
import pytest
from tgi_double import TgiDouble

from hippo.injection.v1 import injection_pb2 as pb
from hippo.injection.v1 import injection_pb2_grpc
from hippo_summariser.adapters.tgi_llm import Generation, TgiLlm
from hippo_summariser.adapters.token_counter import GrpcTokenCounter
from hippo_summariser.domain.merge import PacedLlm
from hippo_summariser.domain.ports import Completion

PAUSE = 0.2
SLACK = 0.02  # timer resolution


class TimedLlm:
    """Records (start, end) of every call; each call takes `seconds`."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.calls: list[tuple[float, float]] = []

    async def complete(
        self, prompt: str, *, max_new_tokens: int, stop: Sequence[str]
    ) -> Completion:
        start = time.monotonic()
        await asyncio.sleep(self.seconds)
        self.calls.append((start, time.monotonic()))
        return Completion(text="ok", cut_by_length=False, tokens=1)


async def test_short_calls_start_a_pause_after_the_previous_one_ended() -> None:
    """Invariant: between the end of one merge LLM call and the start of the next there
    are at least pause_seconds, however many merges wait (here three at once)."""
    llm = TimedLlm(0.05)
    paced = PacedLlm(llm, PAUSE)
    await asyncio.gather(*(paced.complete("p", max_new_tokens=1, stop=()) for _ in range(3)))
    calls = sorted(llm.calls)
    for (_, end), (start, _) in itertools.pairwise(calls):
        assert start - end >= PAUSE - SLACK


async def test_long_concurrent_calls_start_a_pause_apart() -> None:
    """Calls longer than the pause may overlap (max_concurrent bounds them), but their
    starts are still spaced."""
    llm = TimedLlm(0.5)
    paced = PacedLlm(llm, PAUSE)
    await asyncio.gather(*(paced.complete("p", max_new_tokens=1, stop=()) for _ in range(2)))
    (first, _), (second, _) = sorted(llm.calls)
    assert PAUSE - SLACK <= second - first < 0.5


async def test_a_failing_call_is_followed_by_the_pause_too() -> None:
    class Failing(TimedLlm):
        async def complete(
            self, prompt: str, *, max_new_tokens: int, stop: Sequence[str]
        ) -> Completion:
            self.calls.append((time.monotonic(), time.monotonic()))
            raise RuntimeError("down")

    llm = Failing(0)
    paced = PacedLlm(llm, PAUSE)
    for _ in range(2):
        with pytest.raises(RuntimeError):
            await paced.complete("p", max_new_tokens=1, stop=())
    (_, end), (start, _) = llm.calls
    assert start - end >= PAUSE - SLACK


def test_merge_llm_calls_carry_the_background_mark() -> None:
    tgi = TgiDouble()
    tgi.respond = lambda prompt: " A note.\n"
    tgi.start()
    try:
        llm = TgiLlm(tgi.url, 10, Generation())
        asyncio.run(llm.complete("Summary: none yet.\nNote:", max_new_tokens=4, stop=["\n"]))
    finally:
        tgi.stop()
    assert tgi.headers[-1].get("X-Hippo-Priority") == "background"


class Recording(injection_pb2_grpc.InjectionServiceServicer):
    def __init__(self) -> None:
        self.metadata: list[dict[str, str]] = []

    async def CountTokens(
        self, request: pb.CountTokensRequest, context: grpc.aio.ServicerContext
    ) -> pb.CountTokensResponse:
        self.metadata.append({m.key: m.value for m in context.invocation_metadata() or ()})
        return pb.CountTokensResponse(tokens=1 + len(request.text.split()))


@pytest.fixture
async def injection() -> AsyncIterator[tuple[Recording, grpc.aio.Channel]]:
    recording = Recording()
    server = grpc.aio.server()
    injection_pb2_grpc.add_InjectionServiceServicer_to_server(recording, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        yield recording, channel
    await server.stop(0)


async def test_only_the_merge_workers_counts_are_marked_background(
    injection: tuple[Recording, grpc.aio.Channel],
) -> None:
    recording, channel = injection
    assert await GrpcTokenCounter(channel, 5, background=True).count(["a b"]) == [2]
    assert recording.metadata[-1].get("x-hippo-priority") == "background"
    assert await GrpcTokenCounter(channel, 5).count(["a b"]) == [2]  # Append's counter
    assert "x-hippo-priority" not in recording.metadata[-1]
