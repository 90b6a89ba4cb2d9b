"""Streaming text out of token ids: incremental decoding and stop sequences."""

from __future__ import annotations

from collections.abc import Callable, Sequence

# Decoding a lone token can drop its leading space (SentencePiece) or cut a multi-byte
# character; decoding a window that starts a few tokens back and diffing avoids both
# (TGI's prefix/read offsets). Five tokens of context are plenty for either effect.
_CONTEXT = 5


class IncrementalDecoder:
    """Turns one token id at a time into the text it adds; the pieces concatenate to
    the decoded whole. A token that ends mid-character adds "" until it completes."""

    def __init__(self, decode: Callable[[Sequence[int]], str], context: Sequence[int]) -> None:
        self._decode = decode
        self._ids = list(context[-_CONTEXT:])
        self._prefix = 0
        self._read = len(self._ids)

    def push(self, token_id: int) -> str:
        self._ids.append(token_id)
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        if len(after) > len(before) and not after.endswith("\ufffd"):
            self._prefix, self._read = self._read, len(self._ids)
            return after[len(before) :]
        return ""

    def flush(self) -> str:
        """What a trailing incomplete character decodes to once no more tokens come."""
        before = self._decode(self._ids[self._prefix : self._read])
        after = self._decode(self._ids[self._prefix :])
        return after[len(before) :] if len(after) > len(before) else ""


def stop_hit(text: str, added: int, stop_sequences: Sequence[str]) -> bool:
    """True when a stop sequence now occurs in the generated text, ending within the
    `added` characters the last token brought (TGI only checks the very end, which
    misses a stop inside a multi-character token such as ".\n")."""
    return any(stop in text[-(len(stop) - 1 + added) :] for stop in stop_sequences if added)
