"""The influence hook: adds strength × vector to one decoder layer's output.

A forward hook on `model.model.layers[L]` sees that layer's hidden-state output, the
residual stream after layer L, and returns a changed copy. In transformers 5.x a decoder
layer returns a tensor; 4.x returned a tuple whose first item is the hidden state: both
are handled. Positions are counted over the run's own tokens (prompt, then generated),
so a pass over the prompt, a one-token decode step and a teacher-forced score pass all
select the same positions.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from hippo_injection.domain.types import Positions


@dataclass
class RunState:
    """Where the next forward pass starts; shared by a run's hooks."""

    prompt_len: int
    offset: int = 0  # run tokens already processed (memories not counted)


@dataclass(frozen=True)
class Delta:
    vector: torch.Tensor  # (hidden,) strength × vector, in the model's dtype and device
    positions: Positions


class InfluenceHook:
    def __init__(self, deltas: list[Delta], state: RunState) -> None:
        self._deltas = deltas
        self._state = state

    def _mask(self, positions: Positions, n: int, like: torch.Tensor) -> torch.Tensor | None:
        """(1, n, 1) 0/1 selector for this pass, or None when every position is chosen."""
        if positions is Positions.ALL:
            return None
        index = torch.arange(self._state.offset, self._state.offset + n, device=like.device)
        chosen = index < self._state.prompt_len
        if positions is Positions.GENERATED:
            chosen = ~chosen
        return chosen.to(like.dtype).view(1, n, 1)

    def __call__(self, module: torch.nn.Module, args: Any, output: Any) -> Any:
        hidden = output[0] if isinstance(output, tuple) else output
        n = hidden.shape[1]
        for delta in self._deltas:
            mask = self._mask(delta.positions, n, hidden)
            hidden = hidden + (delta.vector if mask is None else mask * delta.vector)
        return (hidden, *output[1:]) if isinstance(output, tuple) else hidden


def install(
    layers: torch.nn.ModuleList, deltas: dict[int, list[Delta]], state: RunState
) -> list[torch.utils.hooks.RemovableHandle]:
    """One hook per influenced layer; the caller must `remove()` every handle."""
    handles = []
    try:
        for index, items in sorted(deltas.items()):
            handles.append(layers[index].register_forward_hook(InfluenceHook(items, state)))
    except BaseException:
        for handle in handles:
            handle.remove()
        raise
    return handles
