"""Chat's OpenAI-compatible LLM adapter against a real server: the injection service's /v1
routes on loopback (Gemma 3 270M, greedy, a few tokens), next to the TGI adapter on the
same host; and the API key kept out of reprs and logs."""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import SecretStr

from hippo_core import context as request_context
from hippo_core.errors import DeadlineExceeded, InvalidArgument, Unavailable
from hippo_core.listen import reserve_port
from hippo_core.openai_compat import base_url
from hippo_core.testing import service_process, wait_for
from hippo_gateway.__main__ import llm
from hippo_gateway.adapters.llm_client import TgiLlm
from hippo_gateway.adapters.openai_llm import OpenAiLlm, messages_of
from hippo_gateway.domain.models import Generation, Piece
from hippo_gateway.settings import GatewaySettings

MODEL_DIR = Path(__file__).resolve().parents[3] / "var" / "injection" / "model"

# What the gateway's BuildContext renders (gemma-turns-v1: the system text folded into
# the first user turn), with an earlier exchange.
PROMPT = (
    "<start_of_turn>user\nAnswer briefly.\n\nHi!<end_of_turn>\n"
    "<start_of_turn>model\nHello.<end_of_turn>\n"
    "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n"
    "<start_of_turn>model\n"
)
SECRET = "sk-test-do-not-log-0123456789"


@pytest.fixture(scope="module")
def llm_host() -> Iterator[str]:
    """The injection service's HTTP API (TGI's routes and OpenAI's /v1)."""
    port = reserve_port()
    env = {
        "HIPPO_INJECTION_MODEL_DIR": str(MODEL_DIR),
        "HIPPO_INJECTION_HTTP_PORT": str(port),
        "HIPPO_INJECTION_EMBEDDING_ADDR": "",  # no memtok store
    }
    with service_process("hippo_injection", "HIPPO_INJECTION_", env) as proc:
        wait_for(proc.addr, "hippo.injection.v1.InjectionService", timeout=240)
        yield f"http://127.0.0.1:{port}"


def _openai(url: str, style: str = "completions", key: str = "") -> OpenAiLlm:
    return OpenAiLlm(url, SecretStr(key), "google/gemma-3-270m", style, 60, 2)  # type: ignore[arg-type]


async def _pieces(llm: object, params: Generation) -> list[Piece]:
    return [p async for p in llm.stream(PROMPT, params)]  # type: ignore[attr-defined]


async def test_a_streamed_chat_generation_matches_the_tgi_backend(llm_host: str) -> None:
    params = Generation(max_new_tokens=6)
    pieces = await _pieces(_openai(llm_host), params)
    tgi = await _pieces(TgiLlm(llm_host, 60), params)
    assert len(pieces) > 2  # streamed, not one reply
    *text, last = pieces
    assert last.finish_reason in ("length", "eos_token") and not last.text
    assert last.generated_tokens == tgi[-1].generated_tokens
    assert "".join(p.text for p in text) == "".join(p.text for p in tgi)
    # The chat style splits the prompt into its turns; the host renders them back into
    # the same prompt, so the greedy reply is the same.
    chat = await _pieces(_openai(llm_host, "chat"), params)
    assert "".join(p.text for p in chat) == "".join(p.text for p in text)


async def test_a_stop_sequence_ends_the_reply_before_it(llm_host: str) -> None:
    first = await _pieces(_openai(llm_host), Generation(max_new_tokens=6))
    text = "".join(p.text for p in first)
    assert len(text) >= 3, text
    middle = len(text) // 2
    stop = text[middle : middle + 2]  # any text the reply holds: it stops at the first one
    pieces = await _pieces(_openai(llm_host), Generation(max_new_tokens=6, stop=(stop,)))
    assert pieces[-1].finish_reason == "stop_sequence"
    assert "".join(p.text for p in pieces) == text[: text.index(stop)]


async def test_errors_become_hippo_errors(llm_host: str) -> None:
    with pytest.raises(InvalidArgument, match="max_new_tokens: must be 1 to 1024"):
        await _pieces(_openai(llm_host), Generation(max_new_tokens=5000))
    with pytest.raises(Unavailable):
        await _pieces(_openai(f"http://127.0.0.1:{reserve_port()}"), Generation())
    token = request_context.deadline.set(time.monotonic() + 0.05)
    try:
        with pytest.raises(DeadlineExceeded):
            await _pieces(_openai(llm_host), Generation(max_new_tokens=200))
    finally:
        request_context.deadline.reset(token)


def test_settings_choose_the_backend_and_keep_the_key_secret(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Invariant: the API key is sent, but never in a repr, a dump or a log line."""
    caplog.set_level(logging.DEBUG)
    keys = {"k": "acme"}
    tgi = GatewaySettings(api_keys=keys)
    assert tgi.llm_backend == "tgi" and isinstance(llm(tgi), TgiLlm)
    settings = GatewaySettings(
        api_keys=keys,
        llm_backend="openai",
        llm_url="http://vllm:8000",
        llm_api_key=SecretStr(SECRET),
        llm_api_style="chat",
    )
    adapter = llm(settings)
    assert isinstance(adapter, OpenAiLlm)
    assert adapter._client.api_key == SECRET  # sent as the bearer token
    assert str(adapter._client.base_url) == "http://vllm:8000/v1/"
    logging.getLogger("hippo.test").info("settings %s %r llm %r", settings, settings, adapter)
    shown = [repr(settings), str(settings), settings.model_dump_json(), repr(adapter)]
    for text in [*shown, caplog.text]:
        assert SECRET not in text


def test_base_url_and_turns() -> None:
    assert base_url("http://h:8000") == "http://h:8000/v1"
    assert base_url("https://api.example.com/openai/v1") == "https://api.example.com/openai/v1"
    assert messages_of(PROMPT) == [
        {"role": "user", "content": "Answer briefly.\n\nHi!"},
        {"role": "assistant", "content": "Hello."},
        {"role": "user", "content": "What is the capital of France?"},
    ]
    assert messages_of("plain text") == [{"role": "user", "content": "plain text"}]


async def test_a_stream_that_ends_without_a_finish_reason_is_an_error() -> None:
    """What llama.cpp's server answers for a prompt past its --n_ctx (200, an empty
    stream), and a stream cut off mid-reply: neither may pass as a finished reply."""
    import json as _json

    from aiohttp import web

    from hippo_core.errors import FailedPrecondition

    chunk = {
        "id": "c1",
        "object": "text_completion",
        "created": 0,
        "model": "m",
        "choices": [{"index": 0, "text": "Par", "finish_reason": None}],
    }
    bodies = {"/empty/v1/completions": "", "/cut/v1/completions": f"data: {_json.dumps(chunk)}\n\n"}

    async def answer(request: web.Request) -> web.StreamResponse:
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        await response.write((bodies[request.path] + "data: [DONE]\n\n").encode())
        return response

    app = web.Application()
    for path in bodies:
        app.router.add_post(path, answer)
    runner = web.AppRunner(app)
    await runner.setup()
    port = reserve_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        with pytest.raises(FailedPrecondition, match="n_ctx"):
            await _pieces(
                _openai(f"http://127.0.0.1:{port}/empty/v1"), Generation(max_new_tokens=4)
            )
        with pytest.raises(Unavailable, match="cut the stream"):
            await _pieces(_openai(f"http://127.0.0.1:{port}/cut/v1"), Generation(max_new_tokens=4))
    finally:
        await runner.cleanup()
