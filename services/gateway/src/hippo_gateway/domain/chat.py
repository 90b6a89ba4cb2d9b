"""Chat: BuildContext, then a streamed reply from the served model; the exchange is
remembered once the reply is complete.

The reply streams as the model makes it. Only when generation has finished is the
exchange (the user's message and the whole reply) written, in one Remember: a cancelled
or failed stream stores nothing, so a session never holds half a reply.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from typing import Any

from hippo_core import limits
from hippo_core.errors import FailedPrecondition, InvalidArgument, Unimplemented
from hippo_gateway.domain.audit_events import chat_event, influence_event, memtok_write_event
from hippo_gateway.domain.context import ContextBuilder
from hippo_gateway.domain.memory import MemoryService
from hippo_gateway.domain.models import BuiltContext, Generation, InfluencePlan, Role, TurnIn
from hippo_gateway.domain.ports import Influencer, Llm

MAX_NEW_TOKENS = 2048
DEFAULT_NEW_TOKENS = 256
MAX_STOP = 4
MAX_STOP_BYTES = 64
DEFAULTS = Generation()


class Influence:
    """The public InfluenceMode values, as the domain reads them."""

    DEFAULT, OFF, DISCLOSE_ONLY, ON = "default", "off", "disclose_only", "on"


@dataclass(frozen=True)
class Started:
    context: BuiltContext
    note: str


@dataclass(frozen=True)
class Token:
    text: str
    index: int


@dataclass(frozen=True)
class Finished:
    finish_reason: str
    generated_tokens: int
    user_memory_id: str
    assistant_memory_id: str
    audit_seq: int
    # The influences selected (applied when ON): memtok_id, source_words, layer, strength.
    influences: tuple[Mapping[str, Any], ...] = ()


ChatEvent = Started | Token | Finished


def check_generation(params: Generation) -> Generation:
    """The API's decoding limits; zeros become the defaults."""
    max_new = params.max_new_tokens or DEFAULT_NEW_TOKENS
    if not 1 <= max_new <= MAX_NEW_TOKENS:
        raise InvalidArgument(
            "params.max_new_tokens", f"must be 0 (default) or 1..{MAX_NEW_TOKENS}, got {max_new}"
        )
    if not 0 <= params.temperature <= 2:
        raise InvalidArgument("params.temperature", f"must be 0..2, got {params.temperature}")
    if not 0 <= params.top_p <= 1:
        raise InvalidArgument("params.top_p", f"must be in (0, 1] or 0, got {params.top_p}")
    if not 0 <= params.top_k <= 1000:
        raise InvalidArgument("params.top_k", f"must be 0..1000, got {params.top_k}")
    if len(params.stop) > MAX_STOP:
        raise InvalidArgument("params.stop", f"at most {MAX_STOP} entries, got {len(params.stop)}")
    for i, stop in enumerate(params.stop):
        size = len(stop.encode("utf-8"))
        if not 1 <= size <= MAX_STOP_BYTES:
            raise InvalidArgument(
                f"params.stop[{i}]", f"must be 1..{MAX_STOP_BYTES} bytes, got {size}"
            )
    return Generation(
        max_new, params.temperature, params.top_p, params.top_k, params.seed, params.stop
    )


class ChatService:
    def __init__(
        self,
        memory: MemoryService,
        context: ContextBuilder,
        llm: Llm,
        influencer: Influencer | None = None,
    ) -> None:
        self._memory = memory
        self._context = context
        self._llm = llm
        self._influencer = influencer

    async def chat(
        self,
        tenant: str,
        user: str,
        session: str,
        message: str,
        *,
        budget: int = 0,
        params: Generation = DEFAULTS,
        influence: str = Influence.DEFAULT,
    ) -> AsyncIterator[ChatEvent]:
        generation = check_generation(params)
        if influence == Influence.ON and self._influencer is None:
            # Residual influence needs the memtok store (the injection service's), which
            # this deployment does not reach.
            raise Unimplemented("influence ON needs the memtok store, not deployed here")
        # The exchange (message and reply) is stored after the reply: a tenant at its
        # stored-turn quota is refused now, before a generation it could not keep.
        await self._memory.admit_turns(tenant, 2)
        context = await self._context.build(
            tenant,
            user,
            session,
            message,
            budget=budget,
            query_field="message",
            max_query_bytes=limits.MAX_TEXT_BYTES,
        )
        plan: InfluencePlan | None = None
        # No memtok store reached, or OFF asked: nothing is selected; OFF is the default
        # (the sweep found residual influence does not help this model: injection.md).
        mode = Influence.OFF if influence == Influence.DEFAULT else influence
        if self._influencer is not None and influence != Influence.OFF:
            # The request's mode, else the user's recorded one, else off.
            asked = None if influence == Influence.DEFAULT else influence
            try:
                plan = await self._influencer.plan(tenant, user, message, asked)
                mode = plan.mode
            except FailedPrecondition:
                if asked is not None:
                    raise  # ON / DISCLOSE_ONLY asked of an injection service with no store
        influence_body: dict[str, Any] = {
            "influence_mode": mode,
            "influences": list(plan.body.get("influences", [])) if plan else [],
        }
        if context.budget + generation.max_new_tokens > context.context_length:
            raise InvalidArgument(
                "token_budget",
                f"token_budget {context.budget} + max_new_tokens {generation.max_new_tokens} "
                f"exceeds the model's context length {context.context_length}",
            )
        recorder = self._context.recorder
        if plan is not None and mode != Influence.OFF and recorder is not None:
            # The pipeline's steps, as the injection service reported them: selected
            # words, shortlist, LLM2, what was applied and skipped (and why).
            await recorder.record(influence_event(tenant, user, session, plan.body, plan.private))
        disclosed = await self._context.disclose(
            tenant, user, session, message, context, plan.body if plan else influence_body
        )
        yield Started(context, disclosed.note)
        pieces: list[str] = []
        finish, generated = "", 0
        if plan is not None and mode == Influence.ON and plan.applies:
            stream = self._influencer.stream(context.prompt, generation, plan)  # type: ignore[union-attr]
        else:  # nothing to apply: the plain model, exactly as with influence off
            stream = self._llm.stream(context.prompt, generation)
        async for piece in stream:
            if piece.text:
                yield Token(piece.text, len(pieces))
                pieces.append(piece.text)
            if piece.finish_reason:
                finish, generated = piece.finish_reason, piece.generated_tokens
        reply = "".join(pieces).strip()
        turns = [TurnIn(Role.USER, message)]
        # An empty or invisible reply (the model ended at once) is not a turn.
        if not limits.is_blank(reply):
            turns.append(TurnIn(Role.ASSISTANT, reply))
        stored = await self._memory.remember(tenant, user, session, turns)
        ids = [*stored.memory_ids, ""]
        seq = 0
        if plan is not None and mode != Influence.OFF and self._influencer is not None:
            written, words = await self._influencer.write(tenant, user, message, reply)
            if recorder is not None:
                await recorder.record(memtok_write_event(tenant, user, session, written, words))
        if recorder is not None:
            exchange = chat_event(
                tenant,
                user,
                session,
                stored.memory_ids,
                context_seq=disclosed.audit_seq,
                finish_reason=finish or "length",
                generated_tokens=generated,
                influence=influence_body,
            )
            seq = await recorder.record(exchange, wait=True)
        words = plan.private.get("words", {}) if plan else {}
        selected = tuple(
            {**item, "source_words": words.get(item["memtok_id"], "")}
            for item in influence_body["influences"]
        )
        yield Finished(finish or "length", generated, ids[0], ids[1], seq, selected)
