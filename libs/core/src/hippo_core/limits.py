"""The public Memory API's limits on a turn, in one place: the gateway enforces them, and
a bulk loader (`hippo replay`) checks a file against the same rules before it sends
anything, so a call is never refused half-way through a file (docs/api.md lists them)."""

from __future__ import annotations

import re
import unicodedata

MAX_TURNS = 64  # turns per Remember
MAX_TEXT_BYTES = 32 * 1024  # a turn's text, UTF-8
MAX_METADATA_VALUE_BYTES = 1024
MAX_ID_CHARS = 128
# The summariser keeps `speaker` with each window turn and refuses longer names.
MAX_SPEAKER_CHARS = 256
# Scope ids and client ids.
ID = re.compile(r"[A-Za-z0-9._:@-]{1,128}")

# Categories a reader cannot see: controls, format characters (U+200B, U+FEFF, bidi
# marks), separators and unpaired surrogates; plus the Lo/So "fillers" that render blank.
_INVISIBLE_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Zs", "Zl", "Zp"})
_FILLERS = frozenset("\u115f\u1160\u3164\uffa0\u2800")


def is_id(value: str) -> bool:
    return bool(ID.fullmatch(value))


def is_blank(text: str) -> bool:
    """True when nothing in `text` would show: empty, whitespace, or only invisible
    characters (zero-width spaces, BOMs, bidi marks, controls). A query or turn made of
    them matches nothing a reader could have meant, so it counts as missing."""
    return all(
        c.isspace() or c in _FILLERS or unicodedata.category(c) in _INVISIBLE_CATEGORIES
        for c in text
    )


def utf8_bytes(text: str) -> int:
    return len(text.encode("utf-8", "surrogatepass"))
