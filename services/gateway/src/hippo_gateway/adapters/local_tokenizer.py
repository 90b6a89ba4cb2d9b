"""The reading model's tokenizer from its files (`tokenizer_path`; the `Tokenizer` port):
for a model served elsewhere (vLLM, TGI, a hosted API), budgets are counted by that
model's own tokenizer and prompts rendered with its chat template (hippo_core.tokenizer)."""

from __future__ import annotations

from collections.abc import Sequence

from hippo_core.tokenizer import ModelTokenizer
from hippo_gateway.domain.models import ChatMessage, Counted


class LocalTokenizer:
    def __init__(self, model: ModelTokenizer) -> None:
        self._model = model

    async def count(self, messages: Sequence[ChatMessage]) -> Counted:
        # Microseconds to a millisecond or two (Rust): not worth a thread hop.
        rendered = self._model.rendered([(m.role.value, m.text) for m in messages])
        return Counted(rendered.tokens, rendered.text, self._model.context_length)

    async def count_text(self, text: str) -> int:
        return self._model.count_text(text)

    async def special_tokens(self) -> list[str]:
        return list(self._model.special_tokens)
