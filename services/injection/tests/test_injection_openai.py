"""The OpenAI-compatible HTTP API (/v1) through the real `openai` client, against the real
injection service and model on loopback (tiny max_tokens: the CPU model is slow)."""

from __future__ import annotations

import asyncio
import json
import ssl
import time
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import openai
import pytest
from openai import AsyncOpenAI, OpenAI

from hippo.injection.v1 import injection_pb2 as pb
from hippo.injection.v1 import injection_pb2_grpc
from hippo_core.certs import Authority
from hippo_core.errors import Unavailable
from hippo_core.settings import TlsSettings
from hippo_core.testing import ServiceProcess, metric, scrape
from hippo_injection.domain.service import InjectionService
from hippo_injection.web.openai import OpenAiHttpApi
from hippo_injection.web.openai_convert import StopHoldback, cut_at_stop
from hippo_injection.web.tgi import TgiHttpApi

PROMPT = "The capital of France is"
COUNTING = "1, 2, 3, 4, 5, 6, 7, 8,"  # greedy, the model counts on: no early <eos>
MESSAGES = [
    {"role": "system", "content": "You answer in one short sentence."},
    {"role": "user", "content": "What is the capital of France?"},
]


def _client(server: ServiceProcess) -> OpenAI:
    base = f"{server.http}/v1"  # type: ignore[attr-defined]
    return OpenAI(base_url=base, api_key="unused", timeout=120, max_retries=0)


def _grpc_text(server: ServiceProcess, tokens: int, **request: object) -> str:
    with grpc.insecure_channel(server.addr) as channel:
        stub = injection_pb2_grpc.InjectionServiceStub(channel)
        replies = list(
            stub.Generate(pb.GenerateRequest(max_new_tokens=tokens, **request), timeout=120)  # type: ignore[arg-type]
        )
    return str(replies[-1].finish.generated_text)


def test_models_lists_the_served_model(server: ServiceProcess) -> None:
    (model,) = _client(server).models.list().data
    assert model.id == "google/gemma-3-270m" and model.owned_by == "hippo"


def test_completion_is_greedy_at_temperature_0_and_matches_grpc(server: ServiceProcess) -> None:
    reply = _client(server).completions.create(
        model="google/gemma-3-270m", prompt=PROMPT, max_tokens=4, temperature=0
    )
    (choice,) = reply.choices
    assert reply.object == "text_completion" and reply.model == "google/gemma-3-270m"
    assert choice.finish_reason in ("length", "stop")
    assert reply.usage is not None and 0 < reply.usage.completion_tokens <= 4
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    assert choice.text == _grpc_text(server, 4, prompt=PROMPT)


def test_completion_stream_and_stop_sequences(server: ServiceProcess) -> None:
    """OpenAI's rule: the text ends before the stop sequence, streamed or not."""
    client = _client(server)
    full = client.completions.create(prompt=COUNTING, model="m", max_tokens=6, temperature=0)
    assert full.choices[0].text.startswith(" 9")  # " 9, 10," on the 270M base model
    stopped = client.completions.create(
        prompt=COUNTING, model="m", max_tokens=6, temperature=0, stop=[", 1"]
    )
    (choice,) = stopped.choices
    assert choice.finish_reason == "stop" and choice.text == " 9"
    assert choice.model_extra is not None and choice.model_extra["stop_reason"] == ", 1"
    chunks = list(
        client.completions.create(
            prompt=COUNTING,
            model="m",
            max_tokens=6,
            temperature=0,
            stop=[", 1"],
            stream=True,
            stream_options={"include_usage": True},
        )
    )
    texts = [c.choices[0].text for c in chunks if c.choices]
    assert "".join(texts) == " 9"
    finishes = [c.choices[0].finish_reason for c in chunks if c.choices]
    assert finishes[-1] == "stop" and set(finishes[:-1]) == {None}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens >= 3


def test_chat_completion_renders_the_prompt_format(server: ServiceProcess) -> None:
    reply = _client(server).chat.completions.create(
        model="m",
        messages=MESSAGES,
        max_tokens=5,
        temperature=0,  # type: ignore[arg-type]
    )
    (choice,) = reply.choices
    assert reply.object == "chat.completion" and choice.message.role == "assistant"
    # The same rendering as Generate's messages (gemma-turns-v1).
    with grpc.insecure_channel(server.addr) as channel:
        stub = injection_pb2_grpc.InjectionServiceStub(channel)
        request = pb.GenerateRequest(
            messages=[
                pb.ChatMessage(role=pb.ROLE_SYSTEM, content=MESSAGES[0]["content"]),
                pb.ChatMessage(role=pb.ROLE_USER, content=MESSAGES[1]["content"]),
            ],
            max_new_tokens=5,
        )
        replies = list(stub.Generate(request, timeout=120))
    assert choice.message.content == replies[-1].finish.generated_text
    assert reply.usage is not None and reply.usage.prompt_tokens == replies[-1].finish.prompt_tokens


async def test_chat_completion_stream_with_the_async_client(server: ServiceProcess) -> None:
    client = AsyncOpenAI(base_url=f"{server.http}/v1", api_key="x", max_retries=0)  # type: ignore[attr-defined]
    plain = await client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        max_tokens=3,
        temperature=0,  # type: ignore[arg-type]
    )
    stream = await client.chat.completions.create(
        model="m",
        messages=MESSAGES,
        max_tokens=3,
        temperature=0,
        stream=True,  # type: ignore[arg-type]
    )
    chunks = [c async for c in stream]
    assert chunks[0].choices[0].delta.role == "assistant"
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks)
    assert text == plain.choices[0].message.content
    assert chunks[-1].choices[0].finish_reason == plain.choices[0].finish_reason
    await client.close()


def test_bad_requests_get_400_in_openai_error_shape(server: ServiceProcess) -> None:
    client = _client(server)
    with pytest.raises(openai.BadRequestError) as caught:
        client.completions.create(model="m", prompt=PROMPT, max_tokens=5000)
    assert caught.value.status_code == 400
    assert caught.value.body == {
        "message": "max_new_tokens: must be 1 to 1024, got 5000",
        "type": "invalid_request_error",
        "param": "max_new_tokens",
        "code": None,
    }
    with pytest.raises(openai.BadRequestError, match="n: is not supported"):
        client.completions.create(model="m", prompt=PROMPT, max_tokens=1, n=2)
    with pytest.raises(openai.BadRequestError, match=r"messages\[0\]\.role"):
        client.chat.completions.create(
            model="m",
            messages=[{"role": "tool", "content": "x", "tool_call_id": "1"}],  # type: ignore[list-item]
            max_tokens=1,
        )
    with pytest.raises(openai.BadRequestError, match="max_new_tokens"):
        client.completions.create(model="m", prompt=PROMPT, max_tokens=5000, stream=True)
    # Not JSON at all: the same shape, from the route itself.
    request = urllib.request.Request(
        f"{server.http}/v1/completions",  # type: ignore[attr-defined]
        data=b"{not json",
        headers={"Content-Type": "application/json"},
    )
    with pytest.raises(urllib.error.HTTPError) as raw:
        urllib.request.urlopen(request, timeout=30)
    assert raw.value.code == 400
    body = json.loads(raw.value.read())
    assert body["error"]["type"] == "invalid_request_error" and body["error"]["param"] == "body"


async def test_a_full_queue_is_429_with_retry_after(server: ServiceProcess) -> None:
    """The fixture's host lets one request run and one wait: the next one gets 429 with
    Retry-After, in OpenAI's shape, and the openai client raises RateLimitError."""
    async with grpc.aio.insecure_channel(server.addr) as channel:
        stub = injection_pb2_grpc.InjectionServiceStub(channel)

        async def hold() -> None:
            request = pb.GenerateRequest(prompt=COUNTING, max_new_tokens=200)
            async for _ in stub.Generate(request, timeout=120):
                pass

        tasks = [asyncio.create_task(hold()) for _ in range(2)]
        try:
            end = time.monotonic() + 60
            while True:
                samples = await asyncio.to_thread(scrape, server.metrics_url)
                if metric(samples, "hippo_injection_queue_depth", priority="interactive") == 1:
                    break
                assert time.monotonic() < end, "the second request never waited"
                await asyncio.sleep(0.05)
            client = AsyncOpenAI(base_url=f"{server.http}/v1", api_key="x", max_retries=0)  # type: ignore[attr-defined]
            with pytest.raises(openai.RateLimitError) as caught:
                await client.completions.create(model="m", prompt=PROMPT, max_tokens=1)
            assert int(caught.value.response.headers["Retry-After"]) >= 1
            assert caught.value.body["type"] == "rate_limit_error"  # type: ignore[index]
            assert caught.value.body["code"] == "rate_limit_exceeded"  # type: ignore[index]
            await client.close()
        finally:
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)


def test_stop_holdback_never_sends_a_stop_sequence() -> None:
    """A stop sequence that arrives over several tokens is held back, then dropped."""
    holdback = StopHoldback(["END"])
    assert holdback.push("abc E") == "abc "
    assert holdback.push("N") == ""
    assert holdback.finish("D and more") == ("", "END")
    other = StopHoldback(["END"])
    assert other.push("E") == "" and other.push("x") == "Ex"
    assert other.finish("!") == ("!", None)
    assert cut_at_stop("a.b;c", [";", "."]) == ("a", ".")


async def test_under_tls_the_v1_routes_keep_the_tgi_routes_callers(tmp_path: Path) -> None:
    """No model is loaded: a caller past the TLS check gets 503 (not ready) in OpenAI's
    shape, one the caller table refuses gets 403; /v1/models is open, as /info is. The
    client presents its certificate as the gateway's and summariser's adapters do."""
    ca = Authority(tmp_path / "ca")
    http = TgiHttpApi(_not_loaded, 5.0, 0.5, 4, "test", extra=[OpenAiHttpApi(_not_loaded)])
    issued = ca.issue("injection")
    tls = TlsSettings(
        ca_file=str(issued.ca_file), cert_file=str(issued.cert_file), key_file=str(issued.key_file)
    )
    await http.start("127.0.0.1", 0, tls, frozenset({"gateway"}))

    def client(service: str) -> AsyncOpenAI:
        caller = ca.issue(service)
        ctx = ssl.create_default_context(cafile=str(ca.ca_file))
        ctx.load_cert_chain(caller.cert_file, caller.key_file)
        return AsyncOpenAI(
            base_url=f"https://127.0.0.1:{http.port}/v1",
            api_key="x",
            max_retries=0,
            http_client=openai.DefaultAsyncHttpxClient(verify=ctx),
        )

    try:
        gateway, retrieval = client("gateway"), client("retrieval")
        with pytest.raises(openai.InternalServerError) as ready:
            await gateway.completions.create(model="m", prompt=PROMPT, max_tokens=1)
        assert ready.value.status_code == 503
        assert ready.value.body["type"] == "service_unavailable"  # type: ignore[index]
        with pytest.raises(openai.PermissionDeniedError) as refused:
            await retrieval.chat.completions.create(model="m", messages=MESSAGES, max_tokens=1)  # type: ignore[arg-type]
        assert refused.value.body == {  # type: ignore[comparison-overlap]
            "message": "retrieval may not call /v1/chat/completions",
            "type": "permission_error",
            "param": None,
            "code": None,
        }
        with pytest.raises(openai.InternalServerError):  # past the check, not ready
            await retrieval.models.list()
        await gateway.close()
        await retrieval.close()
    finally:
        await http.stop()


def _not_loaded() -> InjectionService:
    raise Unavailable("the model is loading")
