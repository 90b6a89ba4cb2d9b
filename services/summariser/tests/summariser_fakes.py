"""Doubles for the domain tests: a word-counting counter and a scripted LLM. (The gRPC
tests use the real CountTokens and a real HTTP server speaking TGI's API.)"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from hippo_summariser.domain.ports import Completion


class WordCounter:
    """Tokens = whitespace-separated words: exact enough to test budget logic."""

    def __init__(self) -> None:
        self.calls = 0

    async def count(self, texts: Sequence[str]) -> list[int]:
        self.calls += 1
        return [len(t.split()) for t in texts]


Answer = str | BaseException | Callable[[str], str]


class ScriptedLlm:
    """Answers in turn from `answers` (the last one repeats); records every prompt."""

    def __init__(self, *answers: Answer) -> None:
        self._answers = list(answers)
        self.prompts: list[str] = []

    async def complete(
        self, prompt: str, *, max_new_tokens: int, stop: Sequence[str]
    ) -> Completion:
        self.prompts.append(prompt)
        answer = self._answers[min(len(self.prompts), len(self._answers)) - 1]
        if isinstance(answer, BaseException):
            raise answer
        text = answer(prompt) if callable(answer) else answer
        return Completion(text=text, cut_by_length=False, tokens=len(text.split()))
