"""What the BM25 index holds for a turn: the turn in its context, not the bare text.

    [8 May 2023] Melanie: <the previous turn of the session> [attachment: <its description>]
    Caroline: <this turn> [attachment: <its description>]

Why each part (measured by bench/recall_locomo.py; each one helps on every dev
conversation): the date lets "when" and "in May" questions match; the speaker's name lets
"what did Caroline say" match turns that never name her (people rarely say their own
name); the previous turn carries what this turn answers ("Yes, last Tuesday!" is found by
the question it answered); the attachment description is what a shared picture showed.

Two metadata keys of a turn feed it: `speaker` (who spoke, a display name) and
`attachment` (a description of what the turn shared). Only the previous turn is used,
because it is known when a turn is written; when it is erased, the store touches the
next turn and this document is rebuilt without it.

The turn's own text stays alone in the `exact` field, so an identifier query finds the
turn that holds the identifier, not its neighbour.
"""

from __future__ import annotations

from hippo_core.utc import utc
from hippo_retrieval.domain.models import StoredTurn

SPEAKER = "speaker"
ATTACHMENT = "attachment"


def day(time_us: int) -> str:
    """'8 May 2023' (UTC), the form people write dates in."""
    when = utc(time_us)
    return f"{when.day} {when:%B %Y}"


def line(turn: StoredTurn) -> str:
    speaker = turn.metadata.get(SPEAKER, "").strip()
    text = f"{speaker}: {turn.text}" if speaker else turn.text
    attachment = turn.metadata.get(ATTACHMENT, "").strip()
    return f"{text} [attachment: {attachment}]" if attachment else text


def lexical_document(turn: StoredTurn, previous: StoredTurn | None) -> str:
    head = f"[{day(turn.time_us)}]"
    if previous is None:
        return f"{head} {line(turn)}"
    return f"{head} {line(previous)}\n{line(turn)}"
