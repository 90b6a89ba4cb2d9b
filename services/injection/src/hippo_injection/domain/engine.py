"""The engine port: what the domain needs from a model backend.

Every method is blocking and touches the model, so the domain calls them only on the
model queue's single thread (one forward pass at a time). A `Run` is one request's hold
on the model: its influence hooks exist from `Engine.open` until `Run.close`, which the
domain calls exactly once however the request ends.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

from hippo_injection.domain.types import (
    Attendable,
    Influence,
    MemoryStates,
    ModelInfo,
    Sampling,
    Vector,
)


class Run(Protocol):
    @property
    def seed(self) -> int:
        """The sampler's seed (0 when greedy)."""
        ...

    def next_token(self) -> tuple[int, float]:
        """The next token id and its log-probability. The first call runs the prompt
        (prefill); each later call feeds back the token returned before."""
        ...

    def close(self) -> None:
        """Remove this run's hooks and free its cache. Idempotent."""
        ...


class Engine(Protocol):
    @property
    def info(self) -> ModelInfo: ...

    @property
    def bos_id(self) -> int: ...

    @property
    def stop_ids(self) -> frozenset[int]:
        """Ids that end a reply: <eos> and <end_of_turn>."""
        ...

    @property
    def special_ids(self) -> frozenset[int]: ...

    def tokenize(self, text: str) -> list[int]:
        """Token ids of `text` as plain text, without <bos>: a control-token marker in it
        ("<start_of_turn>") is spelled out in ordinary tokens, never its control id."""
        ...

    def tokenize_markup(self, text: str) -> list[int]:
        """Token ids of a prompt written in the format, without <bos>: control-token
        markers map to their ids. Only for a caller's raw prompt and the format's own
        markers; any other text goes through `tokenize`."""
        ...

    def decode(self, ids: Sequence[int]) -> str:
        """Text of `ids`, special tokens dropped."""
        ...

    def token_text(self, token_id: int) -> str:
        """The literal text of one token (e.g. "<eos>"), for special tokens."""
        ...

    def open(
        self,
        prompt_ids: Sequence[int],
        influences: Sequence[Influence],
        attendable: Attendable,
        sampling: Sampling,
    ) -> Run: ...

    def score(
        self,
        prompt_ids: Sequence[int],
        continuation_ids: Sequence[int],
        influences: Sequence[Influence],
        attendable: Attendable,
    ) -> tuple[list[float], bool]:
        """log p of each continuation token and whether each one is the argmax."""
        ...

    def memory_states(self, text: str, from_layer: int) -> MemoryStates:
        """`text` read alone (after its own <bos>, positions from 0): its key/value states
        to be attended later (`Attendable.states`), values from `from_layer` up. Raises
        ValueError for a layer out of range or a memory longer than the model attends
        back in its sliding-window layers."""
        ...

    def hidden_means(self, texts: Sequence[str], layers: Sequence[int]) -> dict[int, Vector]:
        """For each layer, a (len(texts), hidden) array: each text's hidden state at that
        layer's output averaged over its tokens (<bos> excluded)."""
        ...

    def hidden_norms(self, texts: Sequence[str]) -> list[float]:
        """Mean L2 norm of a hidden state at each layer's output over the texts' tokens
        (<bos> excluded): the unit of influence strength."""
        ...

    def offsets(self, text: str) -> list[tuple[int, int]]:
        """(start, end) character span in `text` of each token of `tokenize(text)`."""
        ...

    def token_salience(self, ids: Sequence[int]) -> tuple[list[float], list[float]]:
        """Per position of `ids` (ids[0] = <bos>): attention received relative to
        uniform, averaged over the later positions that could attend to it; and surprise,
        -log p of the token given what precedes it (0 for <bos>)."""
        ...

    def span_attention(
        self,
        ids: Sequence[int],
        spans: Sequence[tuple[int, int]],
        query: tuple[int, int],
        upto: int,
    ) -> list[float]:
        """Attention the query positions pay to each span, layers 0..upto only (the pass
        stops there), relative to the span's share of the positions."""
        ...
