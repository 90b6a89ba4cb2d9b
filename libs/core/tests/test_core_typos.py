"""hippo_core.typos: the strings one edit from a word."""

from __future__ import annotations

from hippo_core.typos import one_edit


def test_one_edit_covers_drop_swap_replace_and_insert() -> None:
    edits = one_edit("gorup")
    assert {"goup", "group", "gorep", "gorupx"} <= set(edits)
    assert "gruop" not in edits  # two edits away
    assert "gorup" not in edits  # the word itself is no candidate
    # 5 drops, 4 swaps, 5 x 26 replacements, 6 x 26 insertions, deduplicated.
    assert len(edits) <= 5 + 4 + 5 * 26 + 6 * 26
    assert edits == sorted(set(edits))  # one order, whatever the set's
