"""The text a turn is embedded as, for every service that embeds turns.

It lives here, not in the gateway, because a turn is embedded in two places: by the
gateway when it is remembered, and by the retrieval service when an index is rebuilt
with another model. Both must embed the same string, or the rebuilt index would not find
what the old one found. (No grpc here: domain code imports it.)
"""

from __future__ import annotations

from collections.abc import Mapping

SPEAKER = "speaker"  # metadata key: who spoke, as a display name


def vector_text(text: str, metadata: Mapping[str, str]) -> str:
    """What is embedded for a turn: the speaker's name and the text.

    Questions name people ("what did Caroline adopt?") while turns rarely name their own
    speaker ("We adopted a puppy!"); with "Caroline: We adopted a puppy!" the vector
    carries who said it. Measured by bench/recall_locomo.py (docs/recall.md): adding the
    date or the previous turn to the vector did not help, so they go to the BM25 document
    only (built by the retrieval service)."""
    speaker = metadata.get(SPEAKER, "").strip()
    return f"{speaker}: {text}" if speaker else text
