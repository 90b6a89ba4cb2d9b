"""Typing slips: the strings one edit from a word (Norvig's candidates).

Both repairs of a query use them: the retrieval service's BM25 typo repair (the terms one
edit away that documents hold) and the gateway's query speller (the listed word one edit
away with the highest count).
"""

from __future__ import annotations

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def one_edit(term: str) -> list[str]:
    """Every string one edit from `term` (a letter dropped, swapped with the next,
    replaced or added: Norvig's candidates), the way a thumb slips on a phone. Sorted,
    `term` itself left out."""
    splits = [(term[:i], term[i:]) for i in range(len(term) + 1)]
    out = {a + b[1:] for a, b in splits if b}
    out |= {a + b[1] + b[0] + b[2:] for a, b in splits if len(b) > 1}
    out |= {a + c + b[1:] for a, b in splits if b for c in LETTERS}
    out |= {a + c + b for a, b in splits for c in LETTERS}
    out.discard(term)
    return sorted(out)
