"""Text that goes into a prompt cannot forge the prompt's structure.

Two kinds of structure can be forged by text that only quotes data:
- the reading model's control tokens: a tokenizer matches every added token
  (`<start_of_turn>`, `<end_of_turn>`, `<eos>`, `<unused17>`...) verbatim in raw text
  before anything else, so a memory that says "<start_of_turn>" becomes a real turn;
- the memory quoting: `<memory ...>` and `</memory>` in any case or spacing
  (`< / MEMORY >`) would end the quote a memory sits in, or open a fake one.

`Neutraliser.neutralise` breaks each such string at its first character: `<` becomes the
full-width `＜` (U+FF1C), `[` becomes `［` (U+FF3B), any other first character gets a
word joiner (U+2060) after it. The text reads the same to a person and to the model, but
no added token can match any more (none contains those characters, which the constructor
checks) and the quoting's own tags stay the only ones.

Used wherever Hippo renders stored or caller text into a prompt: the gateway's contexts
(BuildContext, Chat) and the summariser's merge prompts, each with the serving model's
whole added-token list (injection `Info.special_tokens`).

Why in the gateway, on every piece of text before it is counted and rendered, and
not only where the injection service turns the prompt into ids: the prompt leaves the
gateway as one string (Chat streams `BuiltContext.prompt` to any TGI-compatible server,
whose tokenizer must parse the format's own control tokens in that string, and
BuildContext hands the string and its messages to callers who feed their own model).
Once rendered, data and structure can no longer be told apart; before rendering they
can. The token list comes from the serving model's tokenizer (injection `Info`), so a
different model brings its own list.

One regex, compiled once from a trie of the tokens: a search costs the text's length
times the longest token at worst, however many tokens there are (Gemma has ~6,400).
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# Characters a person does not see, allowed inside a fake tag ("<\u200b/memory>").
_INVISIBLE = "\u00ad\u200b\u200c\u200d\u2060\ufeff"
_GAP = rf"[\s{_INVISIBLE}]*"
# Any tag of the memory quoting, opening or closing, in any case or spacing.
MEMORY_TAG = rf"<{_GAP}/?{_GAP}memory(?![\w-])"
_LOOK_ALIKE = {"<": "\uff1c", "[": "\uff3b"}
_JOINER = "\u2060"


def _trie_pattern(words: Iterable[str]) -> str:
    """One regex matching any of `words` (case-insensitively once compiled) whose
    alternatives branch character by character, so matching at a position walks one
    path instead of trying every word."""
    trie: dict[str, dict] = {}  # type: ignore[type-arg]
    for word in words:
        node = trie
        for char in word.lower():
            node = node.setdefault(char, {})
        node[""] = {}  # the end of a word

    def render(node: dict) -> str:  # type: ignore[type-arg]
        ends = "" in node
        branches = [re.escape(c) + render(child) for c, child in sorted(node.items()) if c]
        if not branches:
            return ""
        alternation = branches[0] if len(branches) == 1 else "(?:" + "|".join(branches) + ")"
        return f"(?:{alternation})?" if ends else alternation

    return render(trie)


class Neutraliser:
    """Built once per token list (from the serving model); `neutralise` is pure."""

    def __init__(self, special_tokens: Iterable[str]) -> None:
        tokens = sorted({t for t in special_tokens if t.strip()})
        for token in tokens:
            if any(c in token for c in (*_LOOK_ALIKE.values(), _JOINER)):
                raise ValueError(f"token {token!r} holds a character used to break tokens")
            if len(token) == 1 and token not in _LOOK_ALIKE:
                raise ValueError(f"one-character token {token!r} cannot be broken")
        self.special_tokens = tuple(tokens)
        parts = [MEMORY_TAG] + ([_trie_pattern(tokens)] if tokens else [])
        self._pattern = re.compile("|".join(parts), re.IGNORECASE)

    def neutralise(self, text: str) -> str:
        """`text` with every control-token string and memory tag broken (see above)."""
        out: list[str] = []
        done = 0  # text[:done] is in `out`
        match = self._pattern.search(text)
        while match is not None:
            start = match.start()
            first = text[start]
            out.append(text[done:start])
            out.append(_LOOK_ALIKE.get(first) or first + _JOINER)
            done = start + 1
            # From the next character, not the match's end: a token starting inside this
            # one (or overlapping its end) is broken too.
            match = self._pattern.search(text, start + 1)
        if not out:
            return text
        out.append(text[done:])
        return "".join(out)


# Before the model's list is known (and for doubles without one): the quoting only.
QUOTING_ONLY = Neutraliser(())
