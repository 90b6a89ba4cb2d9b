"""The TGI-compatible HTTP API through the real `text-generation` client."""

from __future__ import annotations

import json
import urllib.request

import grpc
import pytest
from text_generation import AsyncClient, Client
from text_generation.errors import ValidationError

from hippo.injection.v1 import injection_pb2 as pb
from hippo.injection.v1 import injection_pb2_grpc
from hippo_core.testing import ServiceProcess

PROMPT = "The capital of France is"


def _http(server: ServiceProcess) -> str:
    return str(server.http)  # type: ignore[attr-defined]


def _grpc_greedy(server: ServiceProcess, tokens: int) -> list[int]:
    with grpc.insecure_channel(server.addr) as channel:
        stub = injection_pb2_grpc.InjectionServiceStub(channel)
        request = pb.GenerateRequest(prompt=PROMPT, max_new_tokens=tokens)
        return [r.token.id for r in stub.Generate(request, timeout=60)]


def test_client_generate_matches_grpc(server: ServiceProcess) -> None:
    reply = Client(_http(server), timeout=60).generate(PROMPT, max_new_tokens=5)
    details = reply.details
    assert details.generated_tokens == len(details.tokens) <= 5
    assert details.finish_reason.value in ("length", "eos_token")
    assert reply.generated_text == "".join(t.text for t in details.tokens if not t.special)
    assert details.seed is None and details.prefill == []  # greedy; no input details asked
    assert [t.id for t in details.tokens] == _grpc_greedy(server, 5)


def test_client_generate_stream(server: ServiceProcess) -> None:
    events = list(Client(_http(server), timeout=60).generate_stream(PROMPT, max_new_tokens=5))
    assert all(e.generated_text is None and e.details is None for e in events[:-1])
    last = events[-1]
    assert last.details is not None and last.details.generated_tokens == len(events)
    assert last.generated_text == "".join(e.token.text for e in events if not e.token.special)


def test_client_stop_sequences_full_text_and_sampling(server: ServiceProcess) -> None:
    client = Client(_http(server), timeout=60)
    first = client.generate(PROMPT, max_new_tokens=6)
    stop = next(t.text for t in first.details.tokens[1:] if t.text.strip())
    stopped = client.generate(PROMPT, max_new_tokens=6, stop_sequences=[stop])
    assert stopped.details.finish_reason.value == "stop_sequence"
    assert stopped.generated_text.endswith(stop)
    full = client.generate(PROMPT, max_new_tokens=2, return_full_text=True)
    assert full.generated_text.startswith(PROMPT)
    a = client.generate(PROMPT, max_new_tokens=4, do_sample=True, seed=3, temperature=0.8)
    b = client.generate(PROMPT, max_new_tokens=4, do_sample=True, seed=3, temperature=0.8)
    assert a.generated_text == b.generated_text and a.details.seed == 3


async def test_async_client_generate_and_stream(server: ServiceProcess) -> None:
    client = AsyncClient(_http(server), timeout=60)
    reply = await client.generate(PROMPT, max_new_tokens=3)
    streamed = [e async for e in client.generate_stream(PROMPT, max_new_tokens=3)]
    assert streamed[-1].generated_text == reply.generated_text
    assert [e.token.id for e in streamed] == [t.id for t in reply.details.tokens]


def test_validation_errors_reach_the_client_as_tgi_errors(server: ServiceProcess) -> None:
    client = Client(_http(server), timeout=60)
    with pytest.raises(ValidationError, match="max_new_tokens: must be 1 to 1024, got 5000"):
        client.generate(PROMPT, max_new_tokens=5000)
    with pytest.raises(ValidationError, match=r"parameters\.top_n_tokens: is not supported"):
        client.generate(PROMPT, max_new_tokens=1, top_n_tokens=3)
    with pytest.raises(ValidationError, match="max_new_tokens"):
        list(client.generate_stream(PROMPT, max_new_tokens=5000))


def test_info_and_health(server: ServiceProcess) -> None:
    with urllib.request.urlopen(f"{_http(server)}/info", timeout=10) as reply:
        info = json.loads(reply.read())
    assert info["model_dtype"] == "torch.float32" and info["model_device_type"] == "cpu"
    assert info["max_total_tokens"] == 4096 and info["max_stop_sequences"] == 4
    assert info["model_id"].startswith("google/gemma-3-270m")
    with urllib.request.urlopen(f"{_http(server)}/health", timeout=10) as reply:
        assert reply.status == 200


def test_generate_route_returns_an_object_and_the_root_a_list(server: ServiceProcess) -> None:
    body = json.dumps({"inputs": PROMPT, "parameters": {"max_new_tokens": 2}}).encode()

    def post(path: str) -> object:
        request = urllib.request.Request(
            f"{_http(server)}{path}", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=60) as reply:
            return json.loads(reply.read())

    single, listed = post("/generate"), post("/")
    assert isinstance(single, dict) and "details" not in single  # details only when asked
    assert isinstance(listed, list) and listed[0]["generated_text"] == single["generated_text"]
