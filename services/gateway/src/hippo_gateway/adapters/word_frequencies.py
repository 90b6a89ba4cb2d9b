"""English word counts for the query speller (domain/spelling.py), from a PyPI package.

`pyspellchecker` ships a list of 160k English words with their counts, built from
OpenSubtitles: spoken, informal English, with common names, which is how people ask a
memory service questions. Only its data file is used (its gzipped JSON, read once at
start: ~0.1 s and ~15 MB); nothing is downloaded.
"""

from __future__ import annotations

import gzip
import json
from importlib import resources

PACKAGE = "spellchecker"
ENGLISH = "resources/en.json.gz"


def english_word_counts() -> dict[str, int]:
    try:
        data = (resources.files(PACKAGE) / ENGLISH).read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise RuntimeError(
            f"the query speller needs the English word list of the pyspellchecker package "
            f"({e}): install it, or set HIPPO_GATEWAY_QUERY_SPELLING=false"
        ) from e
    counts = json.loads(gzip.decompress(data))
    return {str(word): int(count) for word, count in counts.items()}
