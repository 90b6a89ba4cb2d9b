"""Shared fixtures: a tiny random Gemma 3 (hook mechanics, fast), the real Gemma 3 270M
engine, and a real injection server process (session scope: the model loads once)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import torch
from tokenizers import AddedToken, Tokenizer, models, pre_tokenizers

from hippo.injection.v1 import injection_pb2_grpc
from hippo_core.listen import reserve_port
from hippo_core.testing import ServiceProcess, service_process, wait_for
from hippo_injection.adapters import loader
from hippo_injection.adapters.engine import TransformersEngine

FULL_NAME = "hippo.injection.v1.InjectionService"
ROOT = Path(__file__).resolve().parents[3]
# The converted model is cached here once per checkout (the service's default model_dir);
# converting the GGUF again for every test session would cost a minute or two.
MODEL_DIR = ROOT / "var" / "injection" / "model"
SPECIAL = ["<pad>", "<eos>", "<bos>", "<unk>", "<start_of_turn>", "<end_of_turn>"]
WORDS = ["user", "model", "the", "cat", "sat", "on", "mat", "a", "dog", "ran", "hello"]


def tiny_tokenizer() -> Tokenizer:
    vocab = {token: i for i, token in enumerate(SPECIAL + WORDS)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.add_special_tokens([AddedToken(t, special=True) for t in SPECIAL])
    return tokenizer


def tiny_model() -> torch.nn.Module:
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(0)
    config = Gemma3TextConfig(
        vocab_size=len(SPECIAL) + len(WORDS),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=4,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=32,
        sliding_window=16,
        layer_types=["sliding_attention"] * 3 + ["full_attention"],
        max_position_embeddings=512,
    )
    return Gemma3ForCausalLM(config)


@pytest.fixture(scope="session")
def tiny_engine() -> TransformersEngine:
    return TransformersEngine(tiny_model(), tiny_tokenizer(), "tiny-gemma3")


@pytest.fixture(scope="session")
def model_dir() -> Path:
    return loader.ensure_cached(MODEL_DIR)


@pytest.fixture(scope="session")
def engine(model_dir: Path) -> TransformersEngine:
    return TransformersEngine.load(model_dir, "auto", "cpu", threads=1)


@pytest.fixture(scope="session")
def server(model_dir: Path) -> Iterator[ServiceProcess]:
    http_port = reserve_port()
    env = {
        "HIPPO_INJECTION_MODEL_DIR": str(MODEL_DIR),
        "HIPPO_INJECTION_HTTP_PORT": str(http_port),
        # One running + one waiting: the third concurrent request is refused.
        "HIPPO_INJECTION_MAX_WAITING": "1",
        # Three background requests may wait besides (test_injection_priority.py).
        "HIPPO_INJECTION_MAX_WAITING_BACKGROUND": "3",
        # No memtok store in this process (its tests run the store in process).
        "HIPPO_INJECTION_EMBEDDING_ADDR": "",
    }
    with service_process("hippo_injection", "HIPPO_INJECTION_", env) as proc:
        wait_for(proc.addr, FULL_NAME, timeout=240)
        proc.http = f"http://127.0.0.1:{http_port}"  # type: ignore[attr-defined]
        yield proc


@pytest.fixture
def stub(server: ServiceProcess) -> Iterator[injection_pb2_grpc.InjectionServiceStub]:
    with grpc.insecure_channel(server.addr) as channel:
        yield injection_pb2_grpc.InjectionServiceStub(channel)


@pytest.fixture(params=["sqlite", "postgres"])
def engine_url(request: pytest.FixtureRequest) -> str:
    """The memtok item store's engine for a test that runs on both: "" (SQLite under the
    test's directory) or the URL of a fresh PostgreSQL database."""
    return "" if request.param == "sqlite" else str(request.getfixturevalue("postgres_url"))


def pytest_configure(config: pytest.Config) -> None:
    # text-generation 0.7 (2023) calls pydantic v1's .dict(); harmless, and not ours.
    config.addinivalue_line(
        "filterwarnings", "ignore:The `dict` method is deprecated:DeprecationWarning"
    )
