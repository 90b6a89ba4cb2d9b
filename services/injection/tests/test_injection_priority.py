"""Priorities end to end: the real injection service and model, requests marked
background over HTTP (`X-Hippo-Priority`, as the summariser's merges send it) and gRPC
(`x-hippo-priority` metadata), and an unmarked (interactive) one that overtakes them."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import grpc
from text_generation import AsyncClient

from hippo.injection.v1 import injection_pb2 as pb
from hippo.injection.v1 import injection_pb2_grpc
from hippo_core.testing import ServiceProcess, metric, scrape

PROMPT = "The capital of France is"
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"  # greedy, the model counts on: no early <eos>
BACKGROUND = {"X-Hippo-Priority": "background"}


async def _depth(
    server: ServiceProcess, priority: str, value: float, tasks: list[asyncio.Task[None]]
) -> None:
    end = time.monotonic() + 60
    while time.monotonic() < end:
        for task in tasks:
            if task.done():  # a request that should be waiting ended: say why
                task.result()
                raise AssertionError(f"{task.get_name()} ended while it should wait")
        samples = await asyncio.to_thread(scrape, server.metrics_url)
        if metric(samples, "hippo_injection_queue_depth", priority=priority) == value:
            return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{priority} queue depth never reached {value}")


async def test_an_interactive_generate_is_served_before_queued_background_ones(
    server: ServiceProcess,
) -> None:
    """Invariant: a request nobody marked waits only for the lease in progress, never for
    background requests that queued before it; a full background list refuses only
    background requests (429 with Retry-After), never the interactive one."""
    url = str(server.http)  # type: ignore[attr-defined]
    done: list[str] = []

    async def over_http(name: str, headers: dict[str, str]) -> None:
        client = AsyncClient(url, headers=headers, timeout=120)
        await client.generate(PROMPT, max_new_tokens=1)
        done.append(name)

    async with grpc.aio.insecure_channel(server.addr) as channel:
        stub = injection_pb2_grpc.InjectionServiceStub(channel)

        async def over_grpc(name: str) -> None:
            request = pb.GenerateRequest(prompt=PROMPT, max_new_tokens=1)
            call = stub.Generate(
                request, timeout=120, metadata=(("x-hippo-priority", "background"),)
            )
            async for _ in call:
                pass
            done.append(name)

        long = pb.GenerateRequest(prompt=COUNTING, max_new_tokens=400)
        holder = stub.Generate(long, timeout=120)
        await holder.read()  # its first token: it holds the model
        queued: list[asyncio.Task[None]] = []
        # One at a time, each waiting before the next is sent: they keep this order.
        for name, send in (
            ("merge1", over_http("merge1", BACKGROUND)),
            ("merge2", over_grpc("merge2")),
            ("merge3", over_http("merge3", BACKGROUND)),
        ):
            queued.append(asyncio.create_task(send, name=name))
            await _depth(server, "background", len(queued), queued)
        async with (
            aiohttp.ClientSession() as session,
            session.post(
                f"{url}/generate",
                json={"inputs": PROMPT, "parameters": {"max_new_tokens": 1}},
                headers=BACKGROUND,
            ) as refused,
        ):
            assert refused.status == 429
            assert int(refused.headers["Retry-After"]) >= 1
        chat = asyncio.create_task(over_http("chat", {}), name="chat")
        await _depth(server, "interactive", 1, [*queued, chat])
        holder.cancel()  # the model frees after the pass in progress
        await asyncio.wait_for(asyncio.gather(chat, *queued), timeout=120)
    assert done == ["chat", "merge1", "merge2", "merge3"]
    samples = await asyncio.to_thread(scrape, server.metrics_url)
    assert metric(samples, "hippo_injection_rejected_total", priority="background") >= 1
    assert metric(samples, "hippo_injection_queue_depth") == 0
