"""Domain values: what a request asks for and what the model answers."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

Vector = npt.NDArray[np.float32]


class Role(enum.Enum):
    SYSTEM = "system"
    USER = "user"
    ASSISTANT = "assistant"


class Positions(enum.Enum):
    """Input positions an influence is added at. A position is an input token: the
    prompt's tokens, then each generated token as it is fed back. So GENERATED first
    changes the second generated token (the first is predicted from the prompt)."""

    PROMPT = "prompt"
    GENERATED = "generated"
    ALL = "all"


class FinishReason(enum.Enum):
    LENGTH = "length"
    EOS_TOKEN = "eos_token"
    STOP_SEQUENCE = "stop_sequence"


@dataclass(frozen=True)
class Message:
    role: Role
    content: str


@dataclass(frozen=True)
class Influence:
    vector: Vector  # (hidden_size,) float32
    layer: int
    strength: float
    positions: Positions = Positions.ALL


@dataclass(frozen=True, eq=False)
class MemoryStates:
    """One memory's key/value states as the model computed them on the memory alone (its
    own <bos> first, positions from 0), kept so that it can be attended later without
    being read again (`Attendable.states`). The keys of every layer (a prompt attends to
    the memory's positions at every layer: the attention masks have one length), the
    values from `from_layer` up (below it the memory is not read: zero values). float16,
    each layer's as (kv_heads, tokens, head_dim)."""

    model_id: str
    from_layer: int
    keys: npt.NDArray[np.float16]  # (layers, kv_heads, tokens, head_dim)
    values: npt.NDArray[np.float16]  # (layers - from_layer, kv_heads, tokens, head_dim)

    @property
    def tokens(self) -> int:
        return int(self.keys.shape[2])

    @property
    def nbytes(self) -> int:
        return int(self.keys.nbytes + self.values.nbytes)


@dataclass(frozen=True)
class Attendable:
    """Memories the prompt may attend to, before it: `texts` read now (each alone, after
    its own <bos>), then `states` read before (MemoryStates); each at the positions
    after the memories before it. Values below `from_layer` are zero, the rest are
    multiplied by `value_scale`."""

    texts: tuple[str, ...] = ()
    from_layer: int = 0
    value_scale: float = 1.0
    states: tuple[MemoryStates, ...] = ()

    def __bool__(self) -> bool:
        return bool(self.texts or self.states)


@dataclass(frozen=True)
class Sampling:
    do_sample: bool = False
    temperature: float = 1.0
    top_k: int = 0  # 0: off
    top_p: float = 1.0  # 1: off
    repetition_penalty: float = 1.0  # 1: off
    seed: int | None = None


@dataclass(frozen=True)
class Prompt:
    """Exactly one of `text` (raw) and `messages` (formatted with the turn markers)."""

    text: str | None = None
    messages: tuple[Message, ...] = ()


@dataclass(frozen=True)
class GenerateRequest:
    prompt: Prompt
    max_new_tokens: int = 64
    stop_sequences: tuple[str, ...] = ()
    sampling: Sampling = field(default_factory=Sampling)
    influences: tuple[Influence, ...] = ()
    attendable: Attendable = field(default_factory=Attendable)


@dataclass(frozen=True)
class ScoreRequest:
    prompt: Prompt
    continuation: str
    influences: tuple[Influence, ...] = ()
    attendable: Attendable = field(default_factory=Attendable)


@dataclass(frozen=True)
class Token:
    id: int
    text: str
    logprob: float
    special: bool


@dataclass(frozen=True)
class Finish:
    reason: FinishReason
    generated_text: str
    prompt_tokens: int
    generated_tokens: int
    seed: int  # 0 when greedy


@dataclass(frozen=True)
class Generated:
    """One streamed token; `finish` is set on the last one only."""

    token: Token
    finish: Finish | None = None


@dataclass(frozen=True)
class Scored:
    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]
    greedy_match: bool
    prompt_tokens: int

    @property
    def total(self) -> float:
        return float(sum(self.logprobs))


@dataclass(frozen=True)
class ValueVectorRequest:
    text: str
    layer: int
    subtract_baseline: bool = False
    baseline_texts: tuple[str, ...] = ()
    scale_to_layer_norm: bool = False


@dataclass(frozen=True)
class ValueVector:
    vector: Vector
    layer: int
    layer_mean_norm: float
    tokens: int

    @property
    def norm(self) -> float:
        return float(np.linalg.norm(self.vector))


@dataclass(frozen=True)
class Counted:
    tokens: int
    formatted: str


@dataclass(frozen=True)
class ModelInfo:
    model: str
    layers: int
    hidden_size: int
    dtype: str
    device: str
    vocab_size: int
    layer_mean_norms: tuple[float, ...]
    # Every added token's text (special or not) but runs of whitespace: strings that a
    # caller quoting text into a prompt must not let through (Info.special_tokens).
    special_tokens: tuple[str, ...] = ()
