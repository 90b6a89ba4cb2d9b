"""Shared fixtures: the real encoders and a real embedding server process (session scope)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from hippo.embedding.v1 import embedding_pb2_grpc
from hippo_core.testing import ServiceProcess, service_process, wait_for
from hippo_embedding.adapters.onnx_encoder import OnnxEncoder

FULL_NAME = "hippo.embedding.v1.EmbeddingService"
DEV_DATA = Path(__file__).resolve().parents[3].parent / "shared" / "data" / "locomo-dev.json"


def dev_texts(limit: int) -> list[str]:
    """Real conversational turns when the dev data is beside the checkout, else prose."""
    if DEV_DATA.exists():
        texts: list[str] = []
        for sample in json.loads(DEV_DATA.read_text()):
            for key, turns in sample["conversation"].items():
                if key.startswith("session_") and isinstance(turns, list):
                    texts.extend(turn["text"] for turn in turns)
        return texts[:limit]
    base = [
        "I went hiking with my sister last weekend and we saw a bear.",
        "The quarterly report is due on Friday, 14 March 2025.",
        "Can you recommend a good book about the history of Rome?",
        "My daughter started violin lessons; she practises every evening.",
        "ERR_CONNECTION_REFUSED when calling handleSubmit in src/app/main.py",
    ]
    return [f"{b} (variant {i})" for i in range(limit // len(base) + 1) for b in base][:limit]


@pytest.fixture(scope="session")
def onnx_encoder() -> OnnxEncoder:
    """The packaged graph as shipped (`onnx_quantization=weights`)."""
    return OnnxEncoder(threads=1, quantization="weights")


@pytest.fixture(scope="session")
def torch_encoder():  # type: ignore[no-untyped-def]
    from hippo_embedding.adapters.torch_encoder import TorchEncoder

    return TorchEncoder(threads=1)


@pytest.fixture(scope="session")
def server() -> Iterator[ServiceProcess]:
    env = {"HIPPO_EMBEDDING_MAX_TEXTS": "256", "HIPPO_EMBEDDING_MAX_CHARS": "8192"}
    with service_process("hippo_embedding", "HIPPO_EMBEDDING_", env) as proc:
        wait_for(proc.addr, FULL_NAME, timeout=120)
        yield proc


@pytest.fixture
def stub(server: ServiceProcess) -> Iterator[embedding_pb2_grpc.EmbeddingServiceStub]:
    with grpc.insecure_channel(server.addr) as channel:
        yield embedding_pb2_grpc.EmbeddingServiceStub(channel)


@pytest.fixture(scope="session")
def dynamic_encoder(tmp_path_factory: pytest.TempPathFactory) -> OnnxEncoder:
    """The default: the packaged graph converted to dynamic int8, in a private cache."""
    return OnnxEncoder(
        threads=1, quantization="dynamic", cache_dir=tmp_path_factory.mktemp("graphs")
    )
