"""Next-token choice: greedy, or seeded sampling with temperature, top-k and top-p."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from hippo_injection.domain.types import Sampling


def _penalise(logits: torch.Tensor, history: Sequence[int], penalty: float) -> torch.Tensor:
    # CTRL's rule (as in transformers and TGI): divide positive logits, multiply negative.
    seen = torch.tensor(sorted(set(history)), dtype=torch.long, device=logits.device)
    picked = logits[seen]
    logits = logits.clone()
    logits[seen] = torch.where(picked > 0, picked / penalty, picked * penalty)
    return logits


def _filter(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    if 0 < top_k < logits.numel():
        kth = torch.topk(logits, top_k).values[-1]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        ordered, order = torch.sort(logits, descending=True)
        cumulative = torch.softmax(ordered, dim=-1).cumsum(dim=-1)
        # Drop a token once the mass before it already reaches top_p (keep at least one).
        drop = (cumulative - torch.softmax(ordered, dim=-1)) >= top_p
        logits = logits.masked_fill(torch.zeros_like(drop).scatter(0, order, drop), float("-inf"))
    return logits


def choose(
    logits: torch.Tensor,
    sampling: Sampling,
    history: Sequence[int],
    generator: torch.Generator | None,
) -> tuple[int, float]:
    """The next token id and its log-probability under the (penalised, tempered)
    distribution it was drawn from. `logits` is the float32 (vocab,) row."""
    if sampling.repetition_penalty != 1.0 and history:
        logits = _penalise(logits, history, sampling.repetition_penalty)
    if not sampling.do_sample:
        logprobs = torch.log_softmax(logits, dim=-1)
        token = int(torch.argmax(logits))
        return token, float(logprobs[token])
    logits = logits / sampling.temperature
    logprobs = torch.log_softmax(logits, dim=-1)
    probs = torch.softmax(_filter(logits, sampling.top_k, sampling.top_p), dim=-1)
    token = int(torch.multinomial(probs, 1, generator=generator))
    return token, float(logprobs[token])
