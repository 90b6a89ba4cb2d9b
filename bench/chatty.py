"""Conversations rewritten the way people chat, by rule (deterministic per seed): the other
side of `informal.py`, which rewrites the questions.

Real chat archives are not LoCoMo: one thought is sent as several short messages, the
other person answers "lol" or "omg" in between, and the messages themselves are typed
in lower case, with chat spellings and slips. So each turn becomes one message per
sentence (`informal()` without an opener, typo rate 0.15), and after each message the
other speaker sends a filler ("lol", "nice", "omg"...) with probability 0.25. Nothing in
the rules knows LoCoMo.

The first message of a turn keeps the turn's dia_id, so the questions' evidence still
names it; its further messages are `<dia_id>.<k>` and the fillers `<dia_id>.r<k>`.
`parts` maps every message back to the turn it came from, and a question's evidence turn
counts as found at k when any of its messages is among the top k (k counts messages).

    from chatty import chatty
    conversations, parts = chatty(locomo.load(path), seed=1)
"""

from __future__ import annotations

import random
import re
from dataclasses import replace

from informal import informal

from hippo_cli import locomo

FILLERS = ("lol", "haha", "omg", "nice", "ok", "yeah", "wow", "same", "aww", "ikr", "true", "😂")
FILLER_RATE = 0.25
TYPO_RATE = 0.15
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=\S)")


def messages(text: str) -> list[str]:
    """One message per sentence (a turn with one sentence stays one message)."""
    return [m for m in _SENTENCE.split(text.strip()) if m.strip()] or [text]


def chatty(
    conversations: list[locomo.Conversation], seed: int
) -> tuple[list[locomo.Conversation], dict[str, str]]:
    out: list[locomo.Conversation] = []
    parts: dict[str, str] = {}
    for conv in conversations:
        rng = random.Random(f"{seed}:{conv.sample_id}")
        turns: list[locomo.Turn] = []
        for turn in conv.turns:
            other = conv.speaker_b if turn.speaker == conv.speaker_a else conv.speaker_a
            for k, sentence in enumerate(messages(turn.text), start=1):
                text = informal(sentence, seed, typo_rate=TYPO_RATE, opener=False) or sentence
                dia = turn.dia_id if k == 1 else f"{turn.dia_id}.{k}"
                parts[dia] = turn.dia_id
                caption = turn.caption if k == 1 else ""
                turns.append(replace(turn, dia_id=dia, text=text, caption=caption))
                if other and rng.random() < FILLER_RATE:
                    filler = f"{turn.dia_id}.r{k}"
                    parts[filler] = filler
                    turns.append(
                        replace(turn, dia_id=filler, speaker=other, text=rng.choice(FILLERS),
                                caption="")
                    )  # fmt: skip
        out.append(replace(conv, turns=tuple(turns)))
    return out, parts
