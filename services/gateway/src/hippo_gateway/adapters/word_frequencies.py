"""English word frequencies for the query speller (domain/spelling.py), from a PyPI package.

`wordfreq` ships the frequencies of 321k English words, merged from Wikipedia, subtitles,
news, books, the web, Twitter and Reddit: British and American spellings, chat words
(`bday`, `lmao`), brands and newer words (`covid`, `wifi`, `keto`), which an older,
smaller list "repairs" into others (`covid` -> `bovid`, `colour` -> `color`). Only its
data file is read (msgpack, once at start: ~0.3 s); nothing is downloaded.

Words rarer than MIN_FREQUENCY are left out: the web's own misspellings sit down there
(`reserch` is 10^-7.8), so leaving them out lets the speller repair them, while real
rare words (`zumba` 10^-6.2, `matcha` 10^-6.3) stay known.
"""

from __future__ import annotations

import gzip
from importlib import resources

import msgpack

PACKAGE = "wordfreq"
ENGLISH = "data/large_en.msgpack.gz"
# 10^-6.5 (Zipf 2.5): measured on the dev questions (docs/recall.md).
MIN_FREQUENCY = 10**-6.5
SCALE = 10**9  # frequencies become counts per billion words (integers)


def english_word_counts(min_frequency: float = MIN_FREQUENCY) -> dict[str, int]:
    try:
        data = (resources.files(PACKAGE) / ENGLISH).read_bytes()
    except (ModuleNotFoundError, FileNotFoundError) as e:
        raise RuntimeError(
            f"the query speller needs the English word list of the wordfreq package "
            f"({e}): install it, or set HIPPO_GATEWAY_QUERY_SPELLING=off"
        ) from e
    # The file is wordfreq's "cB" format: a header, then buckets of words, the i-th
    # bucket holding the words of frequency 10^(-i/100).
    header, *buckets = msgpack.unpackb(gzip.decompress(data), raw=False)
    if not isinstance(header, dict) or header.get("format") != "cB":
        raise RuntimeError(f"{PACKAGE}/{ENGLISH}: not a cB word list ({header!r:.80})")
    counts: dict[str, int] = {}
    for i, bucket in enumerate(buckets):
        frequency = 10 ** (-i / 100)
        if frequency < min_frequency:
            break
        for word in bucket:
            if word.isascii() and word.isalpha() and word not in counts:
                counts[word] = round(frequency * SCALE)
    return counts
