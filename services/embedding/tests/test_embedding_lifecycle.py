"""The process lifecycle: warm-up before SERVING, graceful stop on SIGTERM."""

from __future__ import annotations

import signal
import threading
import time

import grpc
from embedding_harness import FULL_NAME

from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc
from hippo_core.testing import health_status, service_process, wait_for


def test_health_is_serving_only_after_warmup() -> None:
    """The torch backend takes seconds to import and load: long enough to watch."""
    with service_process(
        "hippo_embedding", "HIPPO_EMBEDDING_", {"HIPPO_EMBEDDING_BACKEND": "torch"}
    ) as proc:
        seen: list[str] = []
        early_call = None
        end = time.monotonic() + 120
        while time.monotonic() < end:
            status = health_status(proc.addr, FULL_NAME)
            seen.append(status)
            if status == "NOT_SERVING" and early_call is None:
                with grpc.insecure_channel(proc.addr) as channel:
                    try:
                        embedding_pb2_grpc.EmbeddingServiceStub(channel).Embed(
                            embedding_pb2.EmbedRequest(texts=["too early"]), timeout=5
                        )
                        early_call = "OK"
                    except grpc.RpcError as exc:
                        early_call = exc.code().name  # type: ignore[attr-defined]
            if status == "SERVING":
                break
            time.sleep(0.05)
        log = proc.log_text()
    assert seen[-1] == "SERVING"
    assert "NOT_SERVING" in seen  # reachable during warm-up, but not ready
    assert early_call == "UNAVAILABLE"
    assert log.index('"event": "listening"') < log.index('"event": "serving"')


def test_sigterm_finishes_inflight_refuses_new_and_exits_within_grace() -> None:
    grace = 20.0
    env = {"HIPPO_EMBEDDING_GRACE_SECONDS": str(grace), "HIPPO_EMBEDDING_CACHE_ENTRIES": "0"}
    with service_process("hippo_embedding", "HIPPO_EMBEDDING_", env) as proc:
        wait_for(proc.addr, FULL_NAME)
        texts = [f"{i} " + "a long sentence about many different things " * 30 for i in range(128)]
        result: dict[str, object] = {}

        def inflight() -> None:
            with grpc.insecure_channel(proc.addr) as channel:
                reply = embedding_pb2_grpc.EmbeddingServiceStub(channel).Embed(
                    embedding_pb2.EmbedRequest(texts=texts), timeout=60
                )
                result["count"] = reply.count

        worker = threading.Thread(target=inflight)
        worker.start()
        time.sleep(1.0)  # the call is on the model now (it takes several seconds)
        assert "count" not in result
        signalled = time.monotonic()
        proc.process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with grpc.insecure_channel(proc.addr) as channel:
            try:
                embedding_pb2_grpc.EmbeddingServiceStub(channel).Embed(
                    embedding_pb2.EmbedRequest(texts=["new call"]), timeout=5
                )
                new_call = "OK"
            except grpc.RpcError as exc:
                new_call = exc.code().name  # type: ignore[attr-defined]
        assert health_status(proc.addr, FULL_NAME) in {"NOT_SERVING", "UNREACHABLE"}
        worker.join(timeout=60)
        code = proc.process.wait(timeout=grace + 5)
        elapsed = time.monotonic() - signalled
        log = proc.log_text()
    assert new_call == "UNAVAILABLE"
    assert result.get("count") == len(texts)  # the in-flight call finished
    assert code == 0 and elapsed < grace
    assert '"event": "draining"' in log and '"event": "stopped"' in log
