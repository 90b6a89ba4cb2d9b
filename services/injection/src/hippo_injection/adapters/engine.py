"""The transformers engine: a frozen causal LM, a KV cache per run, hooks per request.

Every method runs on the model queue's thread. The model is in eval mode and every pass
runs under `torch.inference_mode()`: no gradients, no autograd bookkeeping.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from tokenizers import Tokenizer

from hippo_injection.adapters import hooks, sampling
from hippo_injection.domain.baseline import NEUTRAL_STATEMENTS
from hippo_injection.domain.types import (
    Attendable,
    Influence,
    MemoryStates,
    ModelInfo,
    Sampling,
    Vector,
)

_DTYPES = {"bfloat16": torch.bfloat16, "float32": torch.float32}


def pick_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


class TorchRun:
    """One request on the model: its cache, its hooks, its sampler."""

    def __init__(
        self,
        engine: TransformersEngine,
        prompt_ids: Sequence[int],
        influences: Sequence[Influence],
        attendable: Attendable,
        choice: Sampling,
    ) -> None:
        from transformers import DynamicCache

        self._engine = engine
        self._prompt = list(prompt_ids)
        self._sampling = choice
        self._history: list[int] = []
        self._pending: int | None = None
        self._state = hooks.RunState(prompt_len=len(self._prompt))
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self.cache: Any = DynamicCache(config=engine.model.config)
        self._generator: torch.Generator | None = None
        if choice.do_sample:
            self._generator = torch.Generator().manual_seed(int(choice.seed or 0))
        try:
            if attendable:
                engine.prefix_memories(self.cache, attendable)
            self._handles = hooks.install(engine.layers, engine.deltas(influences), self._state)
        except BaseException:
            self.close()
            raise

    @property
    def seed(self) -> int:
        return int(self._sampling.seed or 0) if self._sampling.do_sample else 0

    def forward(self, ids: Sequence[int], keep: int) -> torch.Tensor:
        """Run `ids` after what the cache holds; float32 logits of the last `keep`."""
        logits = self._engine.forward(ids, self.cache, keep)
        self._state.offset += len(ids)
        return logits

    def next_token(self) -> tuple[int, float]:
        ids = self._prompt if self._pending is None else [self._pending]
        logits = self.forward(ids, 1)[-1]
        token, logprob = sampling.choose(logits, self._sampling, self._history, self._generator)
        self._history.append(token)
        self._pending = token
        return token, logprob

    def close(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        self.cache = None


class TransformersEngine:
    def __init__(
        self,
        model: Any,
        tokenizer: Tokenizer,
        model_id: str,
        norm_texts: Sequence[str] = NEUTRAL_STATEMENTS,
    ) -> None:
        self.model = model.eval()
        self.model.requires_grad_(False)
        self.tokenizer = tokenizer
        # The same tokenizer with its special tokens read as plain text: HF tokenizers
        # match added tokens in any text by default, so a "<end_of_turn>" inside a
        # message or a query would become the control id. A copy, not a toggled flag,
        # because counting runs beside the model thread.
        self._plain = Tokenizer.from_str(tokenizer.to_str())
        self._plain.encode_special_tokens = True
        self.layers: torch.nn.ModuleList = model.model.layers
        self._device = next(model.parameters()).device
        self._dtype = next(model.parameters()).dtype
        ids = {name: tokenizer.token_to_id(name) for name in ("<bos>", "<eos>", "<end_of_turn>")}
        if ids["<bos>"] is None:
            raise ValueError("the tokenizer has no <bos> token")
        self._bos = int(ids["<bos>"])
        self._stop = frozenset(int(i) for k, i in ids.items() if k != "<bos>" and i is not None)
        self._special = frozenset(
            int(i) for i, added in tokenizer.get_added_tokens_decoder().items() if added.special
        )
        config = model.config
        dtype_name = str(self._dtype).removeprefix("torch.")
        added = sorted(a.content for a in tokenizer.get_added_tokens_decoder().values())
        self._info = ModelInfo(
            model_id,
            int(config.num_hidden_layers),
            int(config.hidden_size),
            dtype_name,
            self._device.type,
            int(config.vocab_size),
            (),
            # Whitespace runs ("\n\n", "\t\t") are added tokens too, but they are how
            # the tokenizer spells whitespace and forge nothing.
            tuple(t for t in added if t.strip()),
        )
        norms = self.hidden_norms(norm_texts)
        self._info = ModelInfo(**{**self._info.__dict__, "layer_mean_norms": tuple(norms)})

    @classmethod
    def load(cls, path: Path, dtype: str, device: str, threads: int) -> TransformersEngine:
        """A saved model folder (see loader.ensure_cached) as an engine; about a second."""
        os.environ.setdefault("HF_HUB_OFFLINE", "1")
        from transformers import AutoModelForCausalLM

        if threads > 0:
            torch.set_num_threads(threads)
        target = pick_device(device)
        if dtype == "auto":  # bf16 pays off where there are bf16 units: GPUs, not AVX2 CPUs
            dtype = "bfloat16" if target == "cuda" else "float32"
        model: Any = AutoModelForCausalLM.from_pretrained(str(path), dtype=_DTYPES[dtype])
        model.to(target)
        tokenizer = Tokenizer.from_file(str(path / "tokenizer.json"))
        from hippo_injection.adapters.loader import MODEL_ID

        return cls(model, tokenizer, MODEL_ID)

    # -- the Engine port -----------------------------------------------------------

    @property
    def info(self) -> ModelInfo:
        return self._info

    @property
    def bos_id(self) -> int:
        return self._bos

    @property
    def stop_ids(self) -> frozenset[int]:
        return self._stop

    @property
    def special_ids(self) -> frozenset[int]:
        return self._special

    def tokenize(self, text: str) -> list[int]:
        return list(self._plain.encode(text, add_special_tokens=False).ids)

    def tokenize_markup(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def offsets(self, text: str) -> list[tuple[int, int]]:
        return [
            (int(a), int(b)) for a, b in self._plain.encode(text, add_special_tokens=False).offsets
        ]

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def token_text(self, token_id: int) -> str:
        return str(self.tokenizer.id_to_token(token_id) or "")

    def open(
        self,
        prompt_ids: Sequence[int],
        influences: Sequence[Influence],
        attendable: Attendable,
        sampling: Sampling,
    ) -> TorchRun:
        return TorchRun(self, prompt_ids, influences, attendable, sampling)

    def score(
        self,
        prompt_ids: Sequence[int],
        continuation_ids: Sequence[int],
        influences: Sequence[Influence],
        attendable: Attendable,
    ) -> tuple[list[float], bool]:
        run = self.open(prompt_ids, influences, attendable, Sampling())
        try:
            # The logits at the last prompt position and at every continuation token but
            # the last predict the continuation: one teacher-forced pass.
            ids = [*prompt_ids, *continuation_ids[:-1]]
            logits = run.forward(ids, len(continuation_ids))
        finally:
            run.close()
        target = torch.tensor(list(continuation_ids), dtype=torch.long)
        logprobs = torch.log_softmax(logits, dim=-1).gather(1, target.view(-1, 1)).view(-1)
        greedy = bool((logits.argmax(dim=-1) == target).all())
        return [float(x) for x in logprobs], greedy

    def hidden_means(self, texts: Sequence[str], layers: Sequence[int]) -> dict[int, Vector]:
        rows: dict[int, list[Vector]] = {layer: [] for layer in layers}
        for text in texts:
            captured = self._capture([self._bos, *self.tokenize(text)], layers)
            for layer in layers:
                mean = captured[layer][1:].mean(dim=0)  # <bos> is an attention sink: skip it
                rows[layer].append(mean.numpy().astype(np.float32))
        return {layer: np.stack(items) for layer, items in rows.items()}

    def hidden_norms(self, texts: Sequence[str]) -> list[float]:
        every = range(len(self.layers))
        sums, count = np.zeros(len(self.layers)), 0
        for text in texts:
            captured = self._capture([self._bos, *self.tokenize(text)], every)
            for layer in every:
                sums[layer] += float(captured[layer][1:].norm(dim=-1).sum())
            count += len(captured[0]) - 1
        return [float(s / max(count, 1)) for s in sums]

    # -- memtok: LLM1 salience, LLM2 re-scoring ------------------------------------

    def _attention(
        self, ids: list[int], layers: Sequence[int], stop_after: int | None
    ) -> tuple[dict[int, torch.Tensor], torch.Tensor | None]:
        """Attention weights (heads, n, n) of `layers`, float32, with the model switched
        to eager attention for this pass only (sdpa returns no weights). With
        `stop_after`, the pass ends after that layer (no logits); else the logits too."""
        captured: dict[int, torch.Tensor] = {}

        class _Stop(Exception):
            pass

        def keep(index: int) -> Any:
            def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
                if isinstance(output, tuple) and len(output) > 1 and output[1] is not None:
                    captured[index] = output[1][0].float().cpu()

            return hook

        def stop(module: torch.nn.Module, args: Any, output: Any) -> None:
            raise _Stop

        previous = self.model.config._attn_implementation
        attn: list[torch.nn.Module] = [self.layers[i].self_attn for i in layers]  # type: ignore[misc]
        handles = [
            module.register_forward_hook(keep(i)) for i, module in zip(layers, attn, strict=True)
        ]
        if stop_after is not None:
            handles.append(self.layers[stop_after].register_forward_hook(stop))
        logits: torch.Tensor | None = None
        try:
            self.model.set_attn_implementation("eager")
            tensor = torch.tensor([ids], dtype=torch.long, device=self._device)
            with torch.inference_mode():
                try:
                    out = self.model(input_ids=tensor, use_cache=False)
                    logits = out.logits[0].float().cpu()
                except _Stop:
                    pass
        finally:
            for handle in handles:
                handle.remove()
            self.model.set_attn_implementation(previous)
        return captured, logits

    def token_salience(self, ids: Sequence[int]) -> tuple[list[float], list[float]]:
        """LLM1 salience inputs per position of `ids` (ids[0] is <bos>): attention
        received relative to uniform, averaged over the later positions that could attend
        to it (the last token has none: 1.0), and surprise -log p(token | before)."""
        ids = list(ids)
        n = len(ids)
        every = range(len(self.layers))
        weights, logits = self._attention(ids, every, None)
        assert logits is not None
        # (layers, heads, n, n) averaged over layers and heads: a[i, j] = i attends j.
        a = torch.stack([weights[i] for i in every]).mean(dim=(0, 1))
        # <bos> is an attention sink: renormalise each row over the real tokens.
        real = a[:, 1:].sum(dim=1, keepdim=True).clamp_min(1e-9)
        ratio = torch.zeros(n)
        for j in range(1, n):
            later = range(j + 1, n)
            if not later:
                ratio[j] = 1.0
                continue
            # Uniform attention over the i real tokens an attender i can see: 1 / i.
            ratio[j] = float(sum(float(a[i, j] / real[i, 0]) * i for i in later) / len(later))
        logp = torch.log_softmax(logits, dim=-1)
        surprise = [0.0] + [float(-logp[j - 1, ids[j]]) for j in range(1, n)]
        return [float(x) for x in ratio], surprise

    def span_attention(
        self,
        ids: Sequence[int],
        spans: Sequence[tuple[int, int]],
        query: tuple[int, int],
        upto: int,
    ) -> list[float]:
        """LLM2: the share of attention the query tokens pay to each span (candidates'
        source words laid out before the query), averaged over layers 0..upto and heads,
        relative to the span's length share; the pass stops after layer `upto`."""
        weights, _ = self._attention(list(ids), range(upto + 1), upto)
        a = torch.stack([weights[i] for i in range(upto + 1)]).mean(dim=(0, 1))
        rows = a[query[0] : query[1]]
        rows = rows / rows[:, 1:].sum(dim=1, keepdim=True).clamp_min(1e-9)
        scores = []
        for start, end in spans:
            mass = float(rows[:, start:end].sum(dim=1).mean())
            scores.append(mass * max(query[0] - 1, 1) / max(end - start, 1))
        return scores

    # -- helpers ---------------------------------------------------------------------

    def forward(self, ids: Sequence[int], cache: Any, keep: int) -> torch.Tensor:
        tensor = torch.tensor([list(ids)], dtype=torch.long, device=self._device)
        with torch.inference_mode():
            out = self.model(input_ids=tensor, cache=cache, use_cache=True, logits_to_keep=keep)
        logits: torch.Tensor = out.logits[0].float().cpu()
        return logits

    def deltas(self, influences: Sequence[Influence]) -> dict[int, list[hooks.Delta]]:
        grouped: dict[int, list[hooks.Delta]] = {}
        for item in influences:
            vector = torch.from_numpy(np.asarray(item.vector, dtype=np.float32) * item.strength)
            delta = hooks.Delta(vector.to(self._device, self._dtype), item.positions)
            grouped.setdefault(item.layer, []).append(delta)
        return grouped

    def memory_states(self, text: str, from_layer: int) -> MemoryStates:
        from transformers import DynamicCache

        layers = len(self.layers)
        if not 0 <= from_layer < layers:
            raise ValueError(f"from_layer must be 0..{layers - 1}, got {from_layer}")
        ids = [self._bos, *self.tokenize(text)]
        window = getattr(self.model.config, "sliding_window", None)
        if window and len(ids) > window:
            raise ValueError(
                f"a memory of {len(ids)} tokens is longer than the model's sliding window "
                f"({window}): its first tokens would be out of reach"
            )
        alone = DynamicCache(config=self.model.config)
        positions = torch.arange(len(ids), device=self._device).view(1, -1)
        tensor = torch.tensor([ids], dtype=torch.long, device=self._device)
        with torch.inference_mode():
            self.model(input_ids=tensor, cache=alone, position_ids=positions, logits_to_keep=1)

            def half(t: Any) -> np.ndarray:
                out: np.ndarray = t[0].to(torch.float16).cpu().numpy()
                return out

            cached: list[Any] = list(alone.layers)
            keys = np.stack([half(layer.keys) for layer in cached])
            values = np.stack([half(cached[i].values) for i in range(from_layer, layers)])
        return MemoryStates(self._info.model, from_layer, keys, values)

    def prefix_memories(self, cache: Any, attendable: Attendable) -> None:
        """Each memory on its own after its own <bos>, positions continuing: the texts
        read now, then the stored states moved to their positions; then the values of
        layers below `from_layer` zeroed and the rest scaled."""
        from transformers import DynamicCache

        for text in attendable.texts:
            # Encoded on a fresh cache, so a memory sees only its own tokens (as a store
            # would keep it), at positions that continue after the memories before it.
            alone = DynamicCache(config=self.model.config)
            start = cache.get_seq_length()
            ids = [self._bos, *self.tokenize(text)]
            positions = torch.arange(start, start + len(ids), device=self._device).view(1, -1)
            tensor = torch.tensor([ids], dtype=torch.long, device=self._device)
            with torch.inference_mode():
                self.model(input_ids=tensor, cache=alone, position_ids=positions, logits_to_keep=1)
            self._splice(cache, alone)
        for states in attendable.states:
            self._attach(cache, states)
        with torch.inference_mode():
            for index, layer in enumerate(cache.layers):
                factor = attendable.value_scale if index >= attendable.from_layer else 0.0
                if factor != 1.0:
                    layer.values.mul_(factor)

    def _attach(self, cache: Any, states: MemoryStates) -> None:
        """Stored states after what `cache` holds. They were computed at positions from
        0; RoPE rotates a key by its position, and rotations compose, so rotating each
        stored key by the start offset (with the layer's own rotary frequencies) gives
        the key the memory would have had, read there."""
        if states.model_id != self._info.model:
            raise ValueError(
                f"memory states of {states.model_id!r} cannot be attended by {self._info.model!r}"
            )
        if states.keys.shape[0] != len(self.layers):
            raise ValueError(
                f"memory states of {states.keys.shape[0]} layers, the model has {len(self.layers)}"
            )
        start = cache.get_seq_length()
        rotary = self.model.model.rotary_emb
        kinds = self.model.config.layer_types
        n = states.tokens
        with torch.inference_mode():
            shift = torch.full((1, n), start, dtype=torch.long, device=self._device)
            turns: dict[str, tuple[torch.Tensor, torch.Tensor]] = {}
            for index, layer in enumerate(cache.layers):
                keys = torch.from_numpy(states.keys[index]).to(self._device, torch.float32)[None]
                kind = kinds[index]
                if kind not in turns:
                    cos, sin = rotary(keys, shift, kind)  # (1, n, head_dim)
                    turns[kind] = (cos[:, None].float(), sin[:, None].float())
                cos, sin = turns[kind]
                half = keys.shape[-1] // 2
                rotated = torch.cat((-keys[..., half:], keys[..., :half]), dim=-1)
                keys = keys * cos + rotated * sin
                below = index < states.from_layer
                values = (
                    torch.zeros_like(keys)
                    if below
                    else torch.from_numpy(states.values[index - states.from_layer]).to(
                        self._device, torch.float32
                    )[None]
                )
                layer.update(keys.to(self._dtype), values.to(self._dtype))

    @staticmethod
    def _splice(cache: Any, extra: Any) -> None:
        for index, layer in enumerate(extra.layers):
            cache.layers[index].update(layer.keys, layer.values)

    def _capture(self, ids: list[int], layers: Sequence[int]) -> dict[int, torch.Tensor]:
        """Hidden-state outputs of `layers` for one sequence, float32 (n, hidden)."""
        captured: dict[int, torch.Tensor] = {}

        def keep(index: int) -> Any:
            def hook(module: torch.nn.Module, args: Any, output: Any) -> None:
                hidden = output[0] if isinstance(output, tuple) else output
                captured[index] = hidden[0].float().cpu()

            return hook

        handles = [self.layers[i].register_forward_hook(keep(i)) for i in layers]
        try:
            tensor = torch.tensor([ids], dtype=torch.long, device=self._device)
            with torch.inference_mode():
                self.model(input_ids=tensor, use_cache=False, logits_to_keep=1)
        finally:
            for handle in handles:
                handle.remove()
        return captured
