"""Value vectors from the served model: the source words' mean hidden state at the
injection layer, minus the neutral statements' mean, scaled to the layer's mean norm
(MakeValueVector with subtract_baseline and scale_to_layer_norm); and attendable states
(`EngineStates`: the source words' keys and values, Engine.memory_states). Blocking."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hippo_injection.domain.baseline import NEUTRAL_STATEMENTS
from hippo_injection.domain.engine import Engine
from hippo_injection.domain.memtok.models import Vector
from hippo_injection.domain.types import MemoryStates


class EngineValues:
    def __init__(self, engine: Engine, layer: int) -> None:
        if not 0 <= layer < engine.info.layers:
            raise ValueError(f"layer {layer} outside 0..{engine.info.layers - 1}")
        self._engine = engine
        self._layer = layer
        self._baseline: Vector | None = None

    @property
    def model_id(self) -> str:
        return self._engine.info.model

    @property
    def layer(self) -> int:
        return self._layer

    def values(self, texts: Sequence[str]) -> Vector:
        if not texts:
            return np.zeros((0, self._engine.info.hidden_size), dtype=np.float32)
        if self._baseline is None:
            rows = self._engine.hidden_means(list(NEUTRAL_STATEMENTS), [self._layer])
            self._baseline = rows[self._layer].mean(axis=0).astype(np.float32)
        means = self._engine.hidden_means(list(texts), [self._layer])[self._layer]
        out = means - self._baseline
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        target = self._engine.info.layer_mean_norms[self._layer]
        out = np.where(norms > 0, out * (target / np.maximum(norms, 1e-12)), out)
        return out.astype(np.float32)


class EngineStates:
    def __init__(self, engine: Engine, from_layer: int) -> None:
        if not 0 <= from_layer < engine.info.layers:
            raise ValueError(f"from_layer {from_layer} outside 0..{engine.info.layers - 1}")
        self._engine = engine
        self._from_layer = from_layer

    @property
    def model_id(self) -> str:
        return self._engine.info.model

    @property
    def from_layer(self) -> int:
        return self._from_layer

    def states(self, texts: Sequence[str]) -> list[MemoryStates]:
        return [self._engine.memory_states(t, self._from_layer) for t in texts]
