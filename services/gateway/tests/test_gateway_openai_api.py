"""The OpenAI-compatible HTTP API (POST /v1/chat/completions, GET /v1/models), through the
real `openai` client against a real gateway process whose LLM is a real injection service
(the local 270M model on CPU: replies are a few tokens). The exchange a request makes is
remembered (Recall finds it) and audited (ListAuditEntries), like a gRPC Chat.
"""

from __future__ import annotations

import json
import ssl
import time
import urllib.error
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import httpx
import openai
import pytest
from gateway_harness import GATEWAY, Cluster, gateway_process, key_of

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_core.certs import Authority
from hippo_core.errors import InvalidArgument
from hippo_core.listen import reserve_port
from hippo_core.settings import TlsSettings
from hippo_core.testing import ServiceProcess, service_process, wait_for
from hippo_gateway import openai_convert
from hippo_gateway.domain.auth import Authenticator
from hippo_gateway.domain.quota import Quotas, TenantQuota
from hippo_gateway.openai_api import OpenAiApi

ROOT = Path(__file__).resolve().parents[3]
MODEL_DIR = ROOT / "var" / "injection" / "model"  # `make model` converts it once
KEY = "key-acme"  # an admin of tenant acme (gateway_harness): chat and read the audit log
MAX_TOKENS = 4  # a few tokens: the CPU model writes 7-8 a second


@dataclass
class Llm:
    injection: ServiceProcess
    http: str  # its TGI API, which the gateway's llm_url names


@dataclass
class OpenAiGateway:
    gateway: ServiceProcess
    base_url: str  # http://127.0.0.1:<openai_port>/v1


@pytest.fixture(scope="module")
def llm() -> Iterator[Llm]:
    http_port = reserve_port()
    env = {
        "HIPPO_INJECTION_MODEL_DIR": str(MODEL_DIR),
        "HIPPO_INJECTION_HTTP_PORT": str(http_port),
        "HIPPO_INJECTION_EMBEDDING_ADDR": "",  # no memtok store: influence stays off
    }
    with service_process("hippo_injection", "HIPPO_INJECTION_", env) as proc:
        wait_for(proc.addr, "hippo.injection.v1.InjectionService", timeout=240)
        yield Llm(proc, f"http://127.0.0.1:{http_port}")


@pytest.fixture(scope="module")
def api(
    cluster: Cluster, llm: Llm, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[OpenAiGateway]:
    """A gateway with an LLM and the OpenAI API, on the cluster's retrieval and audit."""
    port = reserve_port()
    with gateway_process(
        cluster.embedding.addr,
        cluster.retrieval.addr,
        cluster.audit.addr,
        tmp_path_factory.mktemp("gateway-openai"),
        injection_addr=llm.injection.addr,
        llm_url=llm.http,
        openai_port=str(port),
        # A loaded CI machine may take longer than the default 0.5 s to confirm an entry:
        # the tests compare the seq a reply names with the log's.
        audit_seq_wait_seconds="5",
        # One request, then 429: the tenant "rated" is the quota tests' own.
        quotas=json.dumps({"rated": {"requests_per_second": 0.01, "burst": 1}}),
    ) as gateway:
        wait_for(gateway.addr, GATEWAY, timeout=60)
        yield OpenAiGateway(gateway, f"http://127.0.0.1:{port}/v1")


def client(api: OpenAiGateway, key: str = KEY) -> openai.OpenAI:
    # No retries: a refused request must fail at once, not three times.
    return openai.OpenAI(api_key=key, base_url=api.base_url, max_retries=0, timeout=120)


def new_user() -> str:
    return f"oa-{uuid.uuid4().hex[:12]}"


def raw(api: OpenAiGateway, path: str, body: Any = None, headers: dict[str, str] | None = None):  # type: ignore[no-untyped-def]
    """(status, headers, JSON body) of a request without the client's conveniences."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(
        api.base_url + path,
        data=data,
        headers={"Content-Type": "application/json", **(headers or {})},
    )
    try:
        with urllib.request.urlopen(request, timeout=30) as reply:
            return reply.status, dict(reply.headers), json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read())


def recall(api: OpenAiGateway, user: str, query: str) -> list[str]:
    with grpc.insecure_channel(api.gateway.addr) as channel:
        reply = memory_pb2_grpc.MemoryServiceStub(channel).Recall(
            memory_pb2.RecallRequest(scope=memory_pb2.Scope(user_id=user), query=query),
            metadata=key_of("acme"),
            timeout=10,
        )
    return [h.memory.text for h in reply.hits]


def audit_entries(api: OpenAiGateway, user: str) -> list[memory_pb2.AuditEntry]:
    with grpc.insecure_channel(api.gateway.addr) as channel:
        page = memory_pb2_grpc.MemoryServiceStub(channel).ListAuditEntries(
            memory_pb2.ListAuditEntriesRequest(scope=memory_pb2.Scope(user_id=user)),
            metadata=key_of("acme"),
            timeout=10,
        )
    return list(page.entries)


def eventually(check, timeout: float = 15.0):  # type: ignore[no-untyped-def]
    end = time.monotonic() + timeout
    while True:
        found = check()
        if found or time.monotonic() > end:
            return found
        time.sleep(0.2)


def test_chat_completion_answers_remembers_and_audits(api: OpenAiGateway) -> None:
    user = new_user()
    message = "My sister Ottilie breeds axolotls in Porto."
    reply = client(api).chat.completions.create(
        model="any-model-name",
        messages=[
            {"role": "system", "content": "ignored: Hippo's own instructions are used"},
            {"role": "user", "content": message},
        ],
        user=user,
        max_tokens=MAX_TOKENS,
        temperature=0,
        extra_headers={"X-Hippo-Session": "trip"},
    )
    assert reply.object == "chat.completion" and reply.model == "any-model-name"
    choice = reply.choices[0]
    assert choice.message.role == "assistant" and isinstance(choice.message.content, str)
    assert choice.finish_reason in ("stop", "length")
    assert reply.usage is not None
    assert reply.usage.prompt_tokens > 0
    assert 1 <= reply.usage.completion_tokens <= MAX_TOKENS
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + reply.usage.completion_tokens
    hippo = (reply.model_extra or {})["hippo"]
    assert hippo["audit_seq"] > 0 and hippo["user_memory_id"]
    assert isinstance(hippo["disclosure_note"], str) and hippo["memory_ids_used"] == []
    # The exchange is stored in the header's session; Recall finds the user's message.
    assert eventually(lambda: message in recall(api, user, "axolotls Porto"))
    chats = [e for e in audit_entries(api, user) if e.event_type == "chat"]
    assert [e.seq for e in chats] == [hippo["audit_seq"]]
    assert chats[0].session_id == "trip" and hippo["user_memory_id"] in chats[0].memory_ids


def test_streamed_chat_completion_ends_with_done_and_usage(api: OpenAiGateway) -> None:
    user = new_user()
    stream = client(api).chat.completions.create(
        model="hippo",
        messages=[{"role": "user", "content": "Remember that my locker code is 4471."}],
        user=user,
        max_completion_tokens=MAX_TOKENS,
        stream=True,
        stream_options={"include_usage": True},
    )
    chunks = list(stream)  # the client stops at `data: [DONE]`
    assert all(c.object == "chat.completion.chunk" for c in chunks)
    assert len({c.id for c in chunks}) == 1
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "disclosure_note" in (chunks[0].model_extra or {})["hippo"]
    finish = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1 and finish[0].choices[0].finish_reason in ("stop", "length")
    hippo = (finish[0].model_extra or {})["hippo"]
    assert hippo["audit_seq"] > 0
    usage = chunks[-1]
    assert usage.choices == [] and usage.usage is not None
    assert 1 <= usage.usage.completion_tokens <= MAX_TOKENS
    # The default session (openai_default_session) holds it.
    assert eventually(lambda: recall(api, user, "locker code"))
    chats = [e for e in audit_entries(api, user) if e.event_type == "chat"]
    assert [(e.seq, e.session_id) for e in chats] == [(hippo["audit_seq"], "default")]


def test_models_lists_hippo(api: OpenAiGateway) -> None:
    assert [m.id for m in client(api).models.list()] == [openai_convert.MODEL_ID]


def test_wrong_or_missing_key_is_401_in_openai_shape(api: OpenAiGateway) -> None:
    with pytest.raises(openai.AuthenticationError) as caught:
        client(api, "not-a-key").chat.completions.create(
            model="hippo", messages=[{"role": "user", "content": "hi"}], user=new_user()
        )
    assert caught.value.status_code == 401 and caught.value.code == "unknown_api_key"
    body = {"model": "hippo", "messages": [{"role": "user", "content": "hi"}], "user": "u"}
    status, _, reply = raw(api, "/chat/completions", body)
    assert status == 401
    assert set(reply["error"]) == {"message", "type", "param", "code"}
    assert reply["error"]["code"] == "missing_api_key"


def test_a_key_without_write_is_403(api: OpenAiGateway) -> None:
    with pytest.raises(openai.PermissionDeniedError) as caught:
        client(api, "key-acme-reader").chat.completions.create(
            model="hippo", messages=[{"role": "user", "content": "hi"}], user=new_user()
        )
    assert caught.value.code == "missing_role"


def test_requests_hippo_cannot_serve_are_400_naming_the_field(api: OpenAiGateway) -> None:
    chat = client(api).chat.completions
    hi = [{"role": "user", "content": "hi"}]
    with pytest.raises(openai.BadRequestError) as caught:
        chat.create(model="hippo", messages=hi)  # type: ignore[call-overload]
    assert caught.value.param == "user"
    with pytest.raises(openai.BadRequestError) as caught:
        chat.create(model="hippo", messages=hi, user="bad user!")
    assert caught.value.param == "user"
    with pytest.raises(openai.BadRequestError) as caught:
        chat.create(model="hippo", messages=hi, user=new_user(), max_tokens=100_000)
    assert caught.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError) as caught:
        chat.create(model="hippo", messages=hi, user=new_user(), temperature=3)
    assert caught.value.param == "temperature"
    with pytest.raises(openai.BadRequestError) as caught:
        chat.create(model="hippo", messages=hi, user=new_user(), n=2)
    assert caught.value.param == "n"
    status, _, reply = raw(api, "/chat/completions", [1, 2], {"Authorization": f"Bearer {KEY}"})
    assert status == 400 and reply["error"]["param"] == "body"


def test_unknown_route_is_404_in_openai_shape(api: OpenAiGateway) -> None:
    status, _, reply = raw(api, "/embeddings", {"input": "x"}, {"Authorization": f"Bearer {KEY}"})
    assert status == 404 and reply["error"]["type"] == "invalid_request_error"


def test_over_the_request_rate_is_429_with_retry_after(api: OpenAiGateway) -> None:
    rated = client(api, "key-rated")
    rated.models.list()
    with pytest.raises(openai.RateLimitError) as caught:
        rated.models.list()
    assert caught.value.code == "rate_limited"
    assert int(caught.value.response.headers["retry-after"]) >= 1


# -- in process: HTTPS, and before warm-up -----------------------------------------------


async def test_under_tls_it_is_https_with_the_gateways_certificate(tmp_path: Path) -> None:
    """No client certificate needed (applications have none), unless gRPC requires one;
    before warm-up a chat is 503 in OpenAI's shape."""
    ca = Authority(tmp_path / "ca")
    issued = ca.issue("gateway")
    ca_file = str(issued.ca_file)
    settings = TlsSettings(
        ca_file=str(issued.ca_file), cert_file=str(issued.cert_file), key_file=str(issued.key_file)
    )
    api = OpenAiApi(
        Authenticator({KEY: "acme"}), Quotas({}, TenantQuota()), "default", 5, 0.5, 1 << 20
    )
    await api.start("127.0.0.1", 0, settings)
    try:
        # The SDK's own HTTP client class, whichever httpx it is built on.
        trusting = openai.DefaultAsyncHttpxClient(verify=ssl.create_default_context(cafile=ca_file))
        tls_client = openai.AsyncOpenAI(
            api_key=KEY,
            base_url=f"https://127.0.0.1:{api.port}/v1",
            max_retries=0,
            http_client=trusting,
        )
        assert [m.id async for m in tls_client.models.list()] == ["hippo"]
        with pytest.raises(openai.InternalServerError) as caught:  # 503: not warm yet
            await tls_client.chat.completions.create(
                model="hippo", messages=[{"role": "user", "content": "hi"}], user="u"
            )
        assert caught.value.status_code == 503 and caught.value.code == "unavailable"
        untrusting = openai.AsyncOpenAI(
            api_key=KEY, base_url=f"https://127.0.0.1:{api.port}/v1", max_retries=0
        )
        with pytest.raises(openai.APIConnectionError):  # the system CAs do not know ours
            await untrusting.models.list()
        await trusting.aclose()
    finally:
        await api.stop()
    # With tls.require_client_cert, a caller without a certificate does not get in.
    required = settings.model_copy(update={"require_client_cert": True})
    await api.start("127.0.0.1", 0, required)
    try:
        async with httpx.AsyncClient(
            verify=ssl.create_default_context(cafile=ca_file)
        ) as anonymous:
            with pytest.raises(httpx.HTTPError):
                await anonymous.get(f"https://127.0.0.1:{api.port}/v1/models")
    finally:
        await api.stop()


# -- pure conversions ---------------------------------------------------------------------


def test_request_maps_to_chat() -> None:
    body = {
        "model": "gpt-4o",
        "user": "alice",
        "messages": [
            {"role": "user", "content": "old, not stored"},
            {"role": "assistant", "content": "old reply"},
            {
                "role": "user",
                "content": [{"type": "text", "text": "new "}, {"type": "text", "text": "one"}],
            },
        ],
        "max_tokens": 7,
        "temperature": 0.5,
        "top_p": 0.9,
        "stop": "\n",
        "seed": 3,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    call = openai_convert.chat_call(body, None, "default")
    assert (call.user, call.session, call.message, call.model) == (
        "alice",
        "default",
        "new one",
        "gpt-4o",
    )
    assert call.params.max_new_tokens == 7 and call.params.stop == ("\n",)
    assert (call.params.temperature, call.params.top_p, call.params.seed) == (0.5, 0.9, 3)
    assert call.stream and call.include_usage


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"messages": [{"role": "user", "content": "x"}]}, "user"),
        ({"user": "u", "messages": []}, "messages"),
        ({"user": "u", "messages": [{"role": "assistant", "content": "x"}]}, "messages[0].role"),
        ({"user": "u", "messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
        (
            {"user": "u", "messages": [{"role": "user", "content": "x"}], "max_tokens": True},
            "max_tokens",
        ),
        ({"user": "u", "messages": [{"role": "user", "content": "x"}], "seed": -1}, "seed"),
        ({"user": "u", "messages": [{"role": "user", "content": "x"}], "tools": [{}]}, "tools"),
    ],
)
def test_bad_requests_name_the_openai_field(body: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgument) as caught:
        openai_convert.chat_call(body, None, "default")
    assert caught.value.field == field


def test_domain_fields_are_named_as_openai_spells_them() -> None:
    call = openai_convert.chat_call(
        {"user": "u", "messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 9},
        "s",
        "default",
    )
    assert openai_convert.param("params.max_new_tokens", call) == "max_completion_tokens"
    assert openai_convert.param("token_budget", None) == "max_tokens"
    assert openai_convert.param("params.stop[1]", call) == "stop[1]"
    assert openai_convert.param("scope.session_id", call) == "X-Hippo-Session"


def test_requests_are_counted_by_route_and_status(api: OpenAiGateway) -> None:
    from hippo_core.testing import metric, scrape

    def count(route: str, status: str) -> float:
        samples = scrape(api.gateway.metrics_url)
        return metric(samples, "hippo_gateway_http_requests_total", route=route, status=status)

    before = count("/v1/models", "200"), count("other", "404")
    assert raw(api, "/models", headers={"Authorization": f"Bearer {KEY}"})[0] == 200
    assert raw(api, "/embeddings", {"input": "x"}, {"Authorization": f"Bearer {KEY}"})[0] == 404
    assert count("/v1/models", "200") == before[0] + 1
    assert count("other", "404") == before[1] + 1
    seconds = scrape(api.gateway.metrics_url)
    assert metric(seconds, "hippo_gateway_http_request_seconds_count", route="/v1/models") >= 1
