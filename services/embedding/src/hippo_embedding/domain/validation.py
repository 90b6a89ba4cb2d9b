"""Request limits, checked before any work so a bad batch costs nothing."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

from hippo_core.errors import InvalidArgument

_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class Limits:
    max_texts: int
    max_chars: int


def validate(texts: Sequence[str], limits: Limits) -> None:
    if not texts:
        raise InvalidArgument("texts", "must hold at least 1 text, got 0")
    if len(texts) > limits.max_texts:
        raise InvalidArgument(
            "texts", f"at most {limits.max_texts} texts per call, got {len(texts)}"
        )
    for i, text in enumerate(texts):
        if len(text) > limits.max_chars:
            raise InvalidArgument(
                f"texts[{i}]", f"at most {limits.max_chars} characters, got {len(text)}"
            )
        # In-process callers can pass str with lone surrogates; the wire cannot.
        bad = _SURROGATE.search(text)
        if bad is not None:
            raise InvalidArgument(
                f"texts[{i}]",
                f"holds a lone surrogate at character {bad.start()} (not valid Unicode)",
                reason="INVALID_UTF8",
            )
