"""The injection use cases: generate (streamed), score, count tokens, make value vectors."""

from __future__ import annotations

import dataclasses
import random
import time
from collections.abc import AsyncGenerator, AsyncIterator, Sequence

import numpy as np

from hippo_core import context
from hippo_core.errors import DeadlineExceeded, InvalidArgument
from hippo_injection import metrics
from hippo_injection.domain import prompt as prompt_format
from hippo_injection.domain import validation
from hippo_injection.domain.baseline import NEUTRAL_STATEMENTS
from hippo_injection.domain.engine import Engine, Run
from hippo_injection.domain.queue import Lease, ModelQueue
from hippo_injection.domain.text import IncrementalDecoder, stop_hit
from hippo_injection.domain.types import (
    Attendable,
    Counted,
    Finish,
    FinishReason,
    Generated,
    GenerateRequest,
    Influence,
    ModelInfo,
    Prompt,
    Scored,
    ScoreRequest,
    Token,
    ValueVector,
    ValueVectorRequest,
)
from hippo_injection.domain.validation import Limits


def _check_deadline() -> None:
    remaining = context.time_remaining()
    if remaining is not None and remaining <= 0:
        raise DeadlineExceeded("the caller's deadline passed; generation stopped")


class InjectionService:
    def __init__(self, engine: Engine, queue: ModelQueue, limits: Limits) -> None:
        self.engine = engine
        self.limits = limits
        self._queue = queue

    @property
    def info(self) -> ModelInfo:
        return self.engine.info

    def prompt_ids(self, prompt: Prompt) -> list[int]:
        """<bos> + the formatted prompt's tokens: exactly what the model reads.

        A raw prompt is the caller's own markup: its markers are control tokens. Messages
        are data: only the format's own markers become control ids and their text is
        tokenised as plain text, so a message that spells "<start_of_turn>" opens no turn.
        (The same ids as tokenising the rendered text whenever the messages spell no
        marker: a tokenizer splits at added tokens before anything else.)"""
        if prompt.text is not None:
            return [self.engine.bos_id, *self.engine.tokenize_markup(prompt.text)]
        ids = [self.engine.bos_id]
        for part in prompt_format.render_parts(prompt.messages):
            markup = part in (prompt_format.START, prompt_format.END)
            ids += self.engine.tokenize_markup(part) if markup else self.engine.tokenize(part)
        return ids

    def count_tokens(self, prompt: Prompt) -> Counted:
        return Counted(len(self.prompt_ids(prompt)), prompt_format.render(prompt))

    def _check_prompt(self, prompt: Prompt) -> None:
        if prompt.text is not None and prompt.messages:
            raise InvalidArgument("prompt", "set prompt or messages, not both")
        if prompt.text is not None:
            validation.nonempty("prompt", prompt.text)

    def _check_influence(self, influences: Sequence[Influence], attendable: Attendable) -> None:
        validation.influences(influences, self.info, self.limits)
        memory_tokens = sum(1 + len(self.engine.tokenize(t)) for t in attendable.texts) + sum(
            s.tokens for s in attendable.states
        )
        validation.attendable(attendable, memory_tokens, self.info, self.limits)

    async def generate(self, request: GenerateRequest) -> AsyncGenerator[Generated, None]:
        """Stream the reply. Stops at the caller's deadline or cancellation: the hooks
        come off in every case (see `Run.close`)."""
        self._check_prompt(request.prompt)
        ids = self.prompt_ids(request.prompt)
        validation.generation(request.max_new_tokens, request.stop_sequences, len(ids), self.limits)
        validation.sampling(request.sampling, self.info.vocab_size)
        self._check_influence(request.influences, request.attendable)
        sampling = request.sampling
        if sampling.do_sample and sampling.seed is None:
            sampling = dataclasses.replace(sampling, seed=random.getrandbits(63))
        for influence in request.influences:
            metrics.INFLUENCE_STRENGTH.observe(abs(influence.strength))
        queued = time.perf_counter()
        async with self._queue.lease() as lease:
            run = await lease.call(
                self.engine.open, ids, request.influences, request.attendable, sampling
            )
            try:
                async for item in self._decode(lease, run, ids, request, queued):
                    yield item
            finally:
                await lease.cleanup(run.close)

    async def _decode(
        self, lease: Lease, run: Run, ids: list[int], request: GenerateRequest, queued: float
    ) -> AsyncIterator[Generated]:
        decoder = IncrementalDecoder(self.engine.decode, ids)
        text = ""
        started = time.perf_counter()
        for n in range(1, request.max_new_tokens + 1):
            _check_deadline()
            step = time.perf_counter()
            token_id, logprob = await lease.call(run.next_token)
            metrics.FORWARD_SECONDS.labels("prefill" if n == 1 else "decode").observe(
                time.perf_counter() - step
            )
            if n == 1:
                metrics.TIME_TO_FIRST_TOKEN.observe(time.perf_counter() - queued)
            special = token_id in self.engine.special_ids
            if special:
                piece = self.engine.token_text(token_id)
            else:
                piece = decoder.push(token_id)
                text += piece
            reason: FinishReason | None = None
            if token_id in self.engine.stop_ids:
                reason = FinishReason.EOS_TOKEN
            elif not special and stop_hit(text, len(piece), request.stop_sequences):
                reason = FinishReason.STOP_SEQUENCE
            elif n == request.max_new_tokens:
                reason = FinishReason.LENGTH
                tail = decoder.flush()
                piece, text = piece + tail, text + tail
            token = Token(token_id, piece, logprob, special)
            if reason is None:
                yield Generated(token)
                continue
            elapsed = time.perf_counter() - started
            metrics.GENERATED_TOKENS.labels(reason.value).inc(n)
            if n > 1 and elapsed > 0:
                metrics.TOKENS_PER_SECOND.observe(n / elapsed)
            yield Generated(token, Finish(reason, text, len(ids), n, run.seed))
            return

    async def score(self, request: ScoreRequest) -> Scored:
        self._check_prompt(request.prompt)
        validation.nonempty("continuation", request.continuation)
        ids = self.prompt_ids(request.prompt)
        continuation = self.engine.tokenize(request.continuation)
        validation.context(len(ids), len(continuation), self.limits)
        self._check_influence(request.influences, request.attendable)
        logprobs, greedy = await self._queue.call(
            self.engine.score, ids, continuation, request.influences, request.attendable
        )
        return Scored(tuple(continuation), tuple(logprobs), greedy, len(ids))

    async def make_value_vector(self, request: ValueVectorRequest) -> ValueVector:
        """The statement's mean hidden state at the layer (<bos> excluded), optionally
        minus the mean of neutral statements, optionally rescaled to the layer's norm."""
        validation.nonempty("text", request.text)
        validation.layer("layer", request.layer, self.info)
        if len(request.baseline_texts) > self.limits.max_baseline_texts:
            raise InvalidArgument(
                "baseline_texts",
                f"at most {self.limits.max_baseline_texts} texts, "
                f"got {len(request.baseline_texts)}",
            )
        for i, text in enumerate(request.baseline_texts):
            validation.nonempty(f"baseline_texts[{i}]", text)
        tokens = len(self.engine.tokenize(request.text))
        validation.context(1 + tokens, 0, self.limits, field="text")
        if tokens == 0:
            raise InvalidArgument("text", "holds no tokens")
        texts = [request.text]
        if request.subtract_baseline:
            texts += list(request.baseline_texts or NEUTRAL_STATEMENTS)
        means = await self._queue.call(self.engine.hidden_means, texts, [request.layer])
        rows = means[request.layer]
        vector = rows[0] - rows[1:].mean(axis=0) if request.subtract_baseline else rows[0]
        layer_norm = self.info.layer_mean_norms[request.layer]
        if request.scale_to_layer_norm:
            norm = float(np.linalg.norm(vector))
            if norm > 0:
                vector = vector * (layer_norm / norm)
        return ValueVector(vector.astype(np.float32), request.layer, layer_norm, tokens)
