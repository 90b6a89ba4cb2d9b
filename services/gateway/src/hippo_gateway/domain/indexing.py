"""What is embedded for a turn (the vector that finds it): the speaker's name and the text.

Questions name people ("what did Caroline adopt?") while turns rarely name their own
speaker ("We adopted a puppy!"); with "Caroline: We adopted a puppy!" the vector carries
who said it. Measured by bench/recall_locomo.py (docs/recall.md): adding the date or the
previous turn to the vector did not help, so they go to the BM25 document only (built by
the retrieval service). One embedding per turn either way.
"""

from __future__ import annotations

from hippo_gateway.domain.models import TurnIn

SPEAKER = "speaker"  # metadata key: who spoke, as a display name


def vector_text(turn: TurnIn) -> str:
    speaker = turn.metadata.get(SPEAKER, "").strip()
    return f"{speaker}: {turn.text}" if speaker else turn.text
