"""Crash and outage behaviour across processes: the gateway in front of a retrieval
service that is killed -9 and restarted where the gateway expects it."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import grpc
import pytest
from gateway_harness import GATEWAY, RETRIEVAL, gateway_process, key_of, retrieval_process

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_core.listen import reserve_port
from hippo_core.testing import ServiceProcess, wait_for


def test_acknowledged_turns_survive_kill_9_of_retrieval(
    embedding: ServiceProcess, tmp_path: Path
) -> None:
    """Every turn whose Remember returned OK is, after kill -9 of retrieval and a restart,
    searchable by Recall in both indexes exactly once; while retrieval is down, calls fail
    with UNAVAILABLE (retryable), not INTERNAL."""
    port = reserve_port()
    acknowledged: dict[str, str] = {}  # memory id -> unique token
    with (
        retrieval_process(tmp_path, port) as retrieval,
        gateway_process(embedding.addr, retrieval.addr) as gateway,
    ):
        wait_for(retrieval.addr, RETRIEVAL, timeout=60)
        wait_for(gateway.addr, GATEWAY, timeout=60)
        with grpc.insecure_channel(gateway.addr) as channel:
            stub = memory_pb2_grpc.MemoryServiceStub(channel)
            for batch in range(10):
                tokens = [f"tok{uuid.uuid4().hex[:10]}" for _ in range(4)]
                turns = [
                    memory_pb2.Turn(
                        role=memory_pb2.ROLE_USER,
                        text=f"{token} is the code word for batch {batch}",
                        client_id=f"b{batch}t{i}",
                    )
                    for i, token in enumerate(tokens)
                ]
                reply = stub.Remember(
                    memory_pb2.RememberRequest(
                        scope=memory_pb2.Scope(user_id="crash", session_id="s"), turns=turns
                    ),
                    metadata=key_of("acme"),
                    timeout=10,
                )
                acknowledged.update(zip(reply.memory_ids, tokens, strict=True))
            os.kill(retrieval.process.pid, signal.SIGKILL)
            retrieval.process.wait()

            query = memory_pb2.RecallRequest(scope=memory_pb2.Scope(user_id="crash"), query="x")
            with pytest.raises(grpc.RpcError) as err:
                stub.Recall(query, metadata=key_of("acme"), timeout=3)
            assert err.value.code() == grpc.StatusCode.UNAVAILABLE

            with retrieval_process(tmp_path, port) as again:
                wait_for(again.addr, RETRIEVAL, timeout=60)
                # UNAVAILABLE is retryable: the gateway's channel reconnects within seconds.
                deadline = time.monotonic() + 15
                while True:
                    try:
                        stub.Recall(query, metadata=key_of("acme"), timeout=3)
                        break
                    except grpc.RpcError as exc:
                        assert exc.code() == grpc.StatusCode.UNAVAILABLE
                        assert time.monotonic() < deadline, "gateway did not reconnect"
                        time.sleep(0.2)
                for memory_id, token in acknowledged.items():
                    for mode in (memory_pb2.RECALL_MODE_LEXICAL, memory_pb2.RECALL_MODE_SEMANTIC):
                        hits = stub.Recall(
                            memory_pb2.RecallRequest(
                                scope=memory_pb2.Scope(user_id="crash"),
                                query=token,
                                mode=mode,
                                top_k=100,
                            ),
                            metadata=key_of("acme"),
                            timeout=10,
                        ).hits
                        ids = [h.memory.memory_id for h in hits]
                        assert ids.count(memory_id) == 1, (token, mode)
                        if mode == memory_pb2.RECALL_MODE_LEXICAL:
                            # first; only the next turn (which quotes it) may follow
                            assert ids[0] == memory_id and len(ids) <= 2
                everything = stub.Recall(
                    memory_pb2.RecallRequest(
                        scope=memory_pb2.Scope(user_id="crash"),
                        query="code word batch",
                        mode=memory_pb2.RECALL_MODE_LEXICAL,
                        top_k=100,
                    ),
                    metadata=key_of("acme"),
                    timeout=10,
                ).hits
                assert sorted(h.memory.memory_id for h in everything) == sorted(acknowledged)
