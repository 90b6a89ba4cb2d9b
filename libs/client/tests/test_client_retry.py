"""Retries, deadlines, the key and errors, against a real gRPC server on loopback.

The double is a blocking `grpc.server` (a thread pool), so that both the blocking
`Client` (called from the test's thread) and `AsyncClient` (the test's event loop) reach
it without sharing a loop. It answers each call from a script of failures, then OK.
"""

from __future__ import annotations

import random
import time
from collections import Counter
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from hippo.memory.v1 import memory_pb2 as pb
from hippo.memory.v1 import memory_pb2_grpc as rpc
from hippo_client import (
    AsyncClient,
    Client,
    HippoError,
    InvalidArgument,
    ResourceExhausted,
    RetryPolicy,
    TlsConfig,
    Unauthenticated,
    Unavailable,
)
from hippo_client.retry import Attempts

KEY = "test-key"
FAST = RetryPolicy(max_attempts=4, initial_backoff=0.01, max_backoff=0.05)
Failure = tuple[grpc.StatusCode, str, list[Any]]


def _any(message: Any) -> any_pb2.Any:
    packed = any_pb2.Any()
    packed.Pack(message)
    return packed


def retry_info(seconds: float) -> any_pb2.Any:
    delay = duration_pb2.Duration()
    delay.FromNanoseconds(int(seconds * 1e9))
    return _any(error_details_pb2.RetryInfo(retry_delay=delay))


def busy(seconds: float = 0.05) -> Failure:
    return (grpc.StatusCode.RESOURCE_EXHAUSTED, "queue full", [retry_info(seconds)])


class Double(rpc.MemoryServiceServicer):
    def __init__(self) -> None:
        self.failures: dict[str, list[Failure]] = {}
        self.calls: Counter[str] = Counter()
        self.requests: list[Any] = []
        self.metadata: list[dict[str, str]] = []
        self.remaining: list[float | None] = []
        self.chat_fails_after_first_token = False

    def _enter(self, method: str, request: Any, context: grpc.ServicerContext) -> None:
        self.calls[method] += 1
        self.requests.append(request)
        self.metadata.append(dict(context.invocation_metadata()))
        self.remaining.append(context.time_remaining())
        script = self.failures.get(method)
        if script:
            self._abort(context, *script.pop(0))

    @staticmethod
    def _abort(
        context: grpc.ServicerContext, code: grpc.StatusCode, message: str, details: list[Any]
    ) -> None:
        status = status_pb2.Status(code=code.value[0], message=message, details=details)
        context.set_trailing_metadata((("grpc-status-details-bin", status.SerializeToString()),))
        context.abort(code, message)

    def Recall(self, request: pb.RecallRequest, context: grpc.ServicerContext) -> Any:
        self._enter("Recall", request, context)
        record = pb.MemoryRecord(memory_id="m1", scope=request.scope, text="found it")
        return pb.RecallResponse(hits=[pb.Hit(memory=record, fused_score=1.0, lexical_rank=1)])

    def Remember(self, request: pb.RememberRequest, context: grpc.ServicerContext) -> Any:
        self._enter("Remember", request, context)
        ids = [f"m{i}" for i in range(len(request.turns))]
        return pb.RememberResponse(memory_ids=ids, created=len(ids))

    def ReportOutcome(self, request: pb.ReportOutcomeRequest, context: grpc.ServicerContext) -> Any:
        self._enter("ReportOutcome", request, context)
        return pb.ReportOutcomeResponse(audit_seq=request.audit_seq + 1)

    def ListAuditEntries(
        self, request: pb.ListAuditEntriesRequest, context: grpc.ServicerContext
    ) -> Any:
        self._enter("ListAuditEntries", request, context)
        page = int(request.page_token or "0")
        entries = [pb.AuditEntry(seq=page * 2 + i + 1) for i in range(2)]
        return pb.ListAuditEntriesResponse(
            entries=entries, next_page_token=str(page + 1) if page < 2 else ""
        )

    def Chat(self, request: pb.ChatRequest, context: grpc.ServicerContext) -> Iterator[Any]:
        self._enter("Chat", request, context)
        yield pb.ChatResponse(start=pb.ChatStart(memory_ids_used=["m1"]))
        yield pb.ChatResponse(token=pb.ChatToken(text="Hello", index=0))
        if self.chat_fails_after_first_token:
            self._abort(context, grpc.StatusCode.UNAVAILABLE, "draining", [])
        yield pb.ChatResponse(token=pb.ChatToken(text=" Bob", index=1))
        yield pb.ChatResponse(end=pb.ChatEnd(finish_reason="length", audit_seq=4))


@pytest.fixture
def double() -> Iterator[tuple[Double, str]]:
    servicer = Double()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    rpc.add_MemoryServiceServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    yield servicer, f"127.0.0.1:{port}"
    server.stop(None)


# --- the policy alone -----------------------------------------------------------------


def test_backoff_is_capped_exponential_with_jitter_and_bounded() -> None:
    policy = RetryPolicy(max_attempts=6, initial_backoff=0.1, max_backoff=0.5, jitter=0.2)
    down = HippoError("down", code="UNAVAILABLE")
    rng = random.Random(7)
    waits = [policy.delay(n, down, remaining=60, rng=rng) for n in range(1, 6)]
    for n, wait in enumerate(waits, start=1):
        ceiling = min(0.5, 0.1 * 2 ** (n - 1))
        assert wait is not None and 0.8 * ceiling <= wait <= ceiling
    assert policy.delay(6, down, remaining=60) is None  # six attempts made: give up


def test_retry_info_is_a_floor_and_the_deadline_a_ceiling() -> None:
    policy = RetryPolicy(initial_backoff=0.01, jitter=0.2)
    told = ResourceExhausted("busy", retry_after=1.0)
    wait = policy.delay(1, told, remaining=10)
    assert wait is not None and 1.0 <= wait <= 1.2
    assert policy.delay(1, told, remaining=0.9) is None  # would wake after the deadline


def test_only_unavailable_and_waitable_exhaustion_are_retried() -> None:
    policy = RetryPolicy()
    assert policy.delay(1, ResourceExhausted("over quota", retry_after=None), 60) is None
    assert policy.delay(1, InvalidArgument("bad"), 60) is None
    assert policy.delay(1, Unavailable("down"), 60) is not None
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)


# --- through a real server -------------------------------------------------------------


def test_resource_exhausted_with_retry_info_is_retried_then_ok(double: tuple[Double, str]) -> None:
    servicer, address = double
    servicer.failures["Recall"] = [busy(0.05), busy(0.05)]
    started = time.monotonic()
    with Client(address, KEY, retries=FAST) as client:
        result = client.recall("alice", "q")
    assert result.hits[0].memory.text == "found it" and servicer.calls["Recall"] == 3
    assert time.monotonic() - started >= 0.1  # waited RetryInfo's delay each time
    assert servicer.metadata[0]["x-api-key"] == KEY
    assert "hippo-client/" in servicer.metadata[0]["user-agent"]


async def test_async_client_retries_the_same_way(double: tuple[Double, str]) -> None:
    servicer, address = double
    servicer.failures["Recall"] = [busy(0.02), (grpc.StatusCode.UNAVAILABLE, "starting", [])]
    async with AsyncClient(address, KEY, retries=FAST) as client:
        result = await client.recall("alice", "q")
    assert len(result) == 1 and servicer.calls["Recall"] == 3


def test_one_deadline_covers_every_attempt(double: tuple[Double, str]) -> None:
    servicer, address = double
    servicer.failures["Recall"] = [busy(5.0)]
    started = time.monotonic()
    with (
        Client(address, KEY, retries=FAST, timeout=0.5) as client,
        pytest.raises(ResourceExhausted) as caught,
    ):
        client.recall("alice", "q")
    assert time.monotonic() - started < 0.5  # gave up at once: 5 s would pass the deadline
    assert caught.value.retry_after == pytest.approx(5.0) and servicer.calls["Recall"] == 1
    servicer.failures["Recall"] = [busy(0.01)]
    with Client(address, KEY, retries=FAST, timeout=3.0) as client:
        client.recall("alice", "q", timeout=1.0)  # the per-call timeout wins
    # gRPC rounds the timeout it sends up to a few digits: 1 s, not the client's 3 s.
    assert all(r is not None and r <= 1.01 for r in servicer.remaining[1:]), servicer.remaining


def test_attempts_share_the_deadline() -> None:
    attempts = Attempts(FAST, timeout=1.0, idempotent=True)
    first = attempts.remaining()
    time.sleep(attempts.backoff(Unavailable("down")))
    assert attempts.remaining() < first <= 1.0
    with pytest.raises(InvalidArgument):  # not retryable: raised as it is
        attempts.backoff(InvalidArgument("bad"))
    with pytest.raises(Unavailable):
        Attempts(FAST, timeout=1.0, idempotent=False).backoff(Unavailable("down"))


def test_calls_that_append_are_never_retried(double: tuple[Double, str]) -> None:
    servicer, address = double
    unavailable: Failure = (grpc.StatusCode.UNAVAILABLE, "down", [])
    servicer.failures["ReportOutcome"] = [unavailable]
    servicer.failures["Remember"] = [unavailable, unavailable]
    with Client(address, KEY, retries=FAST) as client:
        with pytest.raises(Unavailable):
            client.report_outcome("alice", 3, "accepted")
        with pytest.raises(Unavailable):  # no key, no client ids: a retry would store twice
            client.remember("alice", "s1", [("user", "hi")], idempotency_key="")
        assert servicer.calls["ReportOutcome"] == 1 and servicer.calls["Remember"] == 1
        servicer.failures["Remember"] = [unavailable]
        stored = client.remember("alice", "s1", [("user", "hi")])  # the SDK's own key
    assert stored.memory_ids == ("m0",) and servicer.calls["Remember"] == 3
    first, second = (r for r in servicer.requests[-2:])
    assert first.idempotency_key == second.idempotency_key != ""


def test_errors_carry_code_field_and_reason(double: tuple[Double, str]) -> None:
    servicer, address = double
    violation = error_details_pb2.BadRequest.FieldViolation(field="top_k", description="1..100")
    servicer.failures["Recall"] = [
        (
            grpc.StatusCode.INVALID_ARGUMENT,
            "top_k: must be 1..100, got 101",
            [_any(error_details_pb2.ErrorInfo(reason="OUT_OF_RANGE", domain="hippo")),
             _any(error_details_pb2.BadRequest(field_violations=[violation]))],
        ),
        (grpc.StatusCode.UNAUTHENTICATED, "unknown API key", []),
    ]  # fmt: skip
    with Client(address, KEY, retries=FAST) as client:
        with pytest.raises(InvalidArgument) as bad:
            client.recall("alice", "q", top_k=101)
        with pytest.raises(Unauthenticated) as who:
            client.recall("alice", "q")
    assert bad.value.field == "top_k" and bad.value.reason == "OUT_OF_RANGE"
    assert bad.value.code == "INVALID_ARGUMENT" and "got 101" in str(bad.value)
    assert who.value.code == "UNAUTHENTICATED" and who.value.field is None
    assert not isinstance(bad.value, grpc.RpcError) and bad.value.__suppress_context__


def test_chat_yields_text_and_is_retried_only_before_its_first_event(
    double: tuple[Double, str],
) -> None:
    servicer, address = double
    servicer.failures["Chat"] = [busy(0.01)]
    with Client(address, KEY, retries=FAST) as client:
        stream = client.chat("alice", "s1", "hi", max_new_tokens=8)
        assert list(stream) == ["Hello", " Bob"] and stream.text == "Hello Bob"
        assert stream.start is not None and stream.start.memory_ids_used == ("m1",)
        assert stream.end is not None and stream.end.audit_seq == 4
        assert servicer.calls["Chat"] == 2

        servicer.chat_fails_after_first_token = True
        pieces = []
        with pytest.raises(Unavailable), client.chat("alice", "s1", "hi") as broken:
            pieces.extend(broken)
        assert pieces == ["Hello"] and broken.end is None and servicer.calls["Chat"] == 3


async def test_async_chat_and_pages(double: tuple[Double, str]) -> None:
    servicer, address = double
    servicer.failures["Chat"] = [(grpc.StatusCode.UNAVAILABLE, "starting", [])]
    async with AsyncClient(address, KEY, retries=FAST) as client:
        stream = client.chat("alice", "s1", "hi")
        pieces = [piece async for piece in stream]
        seqs = [entry.seq async for entry in client.audit_entries("alice", page_size=2)]
    assert pieces == ["Hello", " Bob"] and stream.end is not None
    assert stream.end.finish_reason == "length" and servicer.calls["Chat"] == 2
    assert seqs == [1, 2, 3, 4, 5, 6] and servicer.calls["ListAuditEntries"] == 3


def test_sync_pages_walk_every_token(double: tuple[Double, str]) -> None:
    _, address = double
    with Client(address, KEY) as client:
        assert [e.seq for e in client.audit_entries("alice")] == [1, 2, 3, 4, 5, 6]
        first = client.list_audit_entries("alice", page_size=2)
    assert len(first) == 2 and first.next_page_token == "1"


def test_tls_with_a_client_certificate_and_a_server_name(tmp_path: Path) -> None:
    # Test-only: hippo_core's throwaway CA (the SDK itself never imports hippo_core).
    from hippo_core.certs import Authority

    authority = Authority(tmp_path)
    served = authority.issue("gateway", dns=["gateway.example"])
    mine = authority.issue("operator")
    servicer = Double()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    rpc.add_MemoryServiceServicer_to_server(servicer, server)
    credentials = grpc.ssl_server_credentials(
        [(served.key_file.read_bytes(), served.cert_file.read_bytes())],
        root_certificates=authority.ca_file.read_bytes(),
        require_client_auth=True,
    )
    port = server.add_secure_port("127.0.0.1:0", credentials)
    server.start()
    try:
        tls = TlsConfig(
            ca_file=authority.ca_file,
            cert_file=mine.cert_file,
            key_file=mine.key_file,
            server_name="gateway.example",
        )
        with Client(f"127.0.0.1:{port}", KEY, tls=tls) as client:
            assert len(client.recall("alice", "q")) == 1
        anonymous = TlsConfig(ca_file=authority.ca_file)  # no client certificate: refused
        address = f"127.0.0.1:{port}"
        with (
            Client(address, KEY, tls=anonymous, timeout=2) as client,
            pytest.raises(HippoError) as refused,
        ):
            client.recall("alice", "q")
        assert refused.value.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED")
        with pytest.raises(ValueError):
            TlsConfig(cert_file=mine.cert_file)  # a certificate needs its key
    finally:
        server.stop(None)
