"""The encoder port: what the domain needs from a model backend."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import numpy as np
import numpy.typing as npt

Vectors = npt.NDArray[np.float32]


class Encoder(Protocol):
    """A sentence encoder. Blocking: the batcher calls it on its own worker thread."""

    @property
    def model(self) -> str:
        """Model id recorded beside every vector."""
        ...

    @property
    def backend(self) -> str: ...

    @property
    def dimension(self) -> int:
        """Vector length, measured from the loaded model."""
        ...

    @property
    def max_tokens(self) -> int:
        """Window in word pieces; longer texts are truncated."""
        ...

    def encode(self, texts: Sequence[str]) -> Vectors:
        """(len(texts), dimension) float32 rows with L2 norm 1, in input order."""
        ...
