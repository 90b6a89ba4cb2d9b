"""LoCoMo-format conversation files (Maharana et al. 2024): parsing for `hippo replay` and
the recall benchmark.

A file is a list of samples: `conversation` holds speaker_a, speaker_b, session_<n> (turns
{speaker, dia_id "D<n>:<i>", text, optional img_url / blip_caption}) and
session_<n>_date_time ("1:56 pm on 8 May, 2023", or another unambiguous spelling that
`hippo_cli.dates` reads); `qa` holds questions with `evidence` (dia_ids) and a `category`
(1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop, 5 adversarial).

`load` reads and checks the whole file before returning, so a caller that sends nothing
until it returns never applies half of a bad file. Problems raise `FileError`, whose
message names the file, the conversation, the field and the value.

Real archives are messier than the dataset, and what has one sensible reading is read,
not refused (docs/cli.md): a turn with no text but a shared image's caption is that
caption (`[image: ...]`); one with neither is skipped and counted; a text over the API's
32 KiB is split into consecutive turns; NUL characters are dropped; a `dia_id` may be a
number, and a missing one is made from the turn's place (`D<session>:<n>`); a missing
`sample_id` is `conversation-<n>`, and missing `speaker_a` / `speaker_b` are the first
two speakers of the turns; a question's category may be missing (0) or named.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hippo_cli import dates
from hippo_core import limits

CATEGORIES = {
    0: "uncategorised",
    1: "multi-hop",
    2: "temporal",
    3: "open-domain",
    4: "single-hop",
    5: "adversarial",
}
_CATEGORY_NAMES = {name: n for n, name in CATEGORIES.items()} | {
    "multi_hop": 1,
    "multihop": 1,
    "open_domain": 3,
    "single_hop": 4,
    "singlehop": 4,
}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SESSION = re.compile(r"^session_(\d+)$")
_SESSION_DATE = re.compile(r"^session_\d+_date_time$")
_DIA = re.compile(r"^D(\d+):(\d+)$")
# The Memory API's identifier rule (scope ids, client ids): checked here so a file the
# gateway would refuse half-way through is refused before anything is sent.
ID = limits.ID


class FileError(ValueError):
    """A LoCoMo file that cannot be loaded; the message is for the person who wrote it."""


@dataclass(frozen=True)
class Turn:
    dia_id: str
    speaker: str
    text: str
    caption: str  # the description of an image the speaker shared ("" if none)
    session: int
    time_us: int  # the session's date: every turn of a session carries it


@dataclass(frozen=True)
class Question:
    question: str
    answer: str
    evidence: tuple[str, ...]  # dia_ids, repaired where unambiguous
    category: int


@dataclass(frozen=True)
class Conversation:
    sample_id: str
    speaker_a: str
    speaker_b: str
    turns: tuple[Turn, ...]  # chronological: session by session, in order
    questions: tuple[Question, ...]
    skipped: tuple[str, ...] = ()  # where each turn with nothing to store was ("session_3[4]")


def parse_date(text: str, order: dates.Order | None = None) -> datetime:
    """'1:56 pm on 8 May, 2023' (or ISO 8601, '08.05.2023, 13:56', '8 May 2023', ...: see
    `hippo_cli.dates`) -> that moment in UTC; a value without a zone is taken as UTC.
    `order`: how the file writes numeric day-month dates ("dmy" or "mdy"), if it does."""
    return dates.parse(text, order)


def repair_evidence(raw: list[Any], known: set[str]) -> tuple[str, ...]:
    """Evidence ids as given, with the unambiguous slips mended ("D8:6; D9:17" is two ids,
    "D:11:26" is D11:26, "D30:05" is D30:5); ids that still name no turn are dropped."""
    out: list[str] = []
    for item in raw:
        for part in str(item).replace(",", ";").split(";"):
            token = part.strip().replace("D:", "D")
            m = _DIA.match(token)
            if m:
                token = f"D{int(m.group(1))}:{int(m.group(2))}"
            if token in known and token not in out:
                out.append(token)
    return tuple(out)


def _turn_time(conv: dict[str, Any], n: int, where: str, order: dates.Order | None) -> int:
    field = f"session_{n}_date_time"
    if field not in conv:
        raise FileError(f"{where}: {field} is missing (session_{n} has turns)")
    try:
        when = parse_date(conv[field], order)
    except ValueError as exc:
        raise FileError(f"{where}: {field}: cannot read the date: {exc}") from None
    if when < _EPOCH:  # the API refuses turn times before the Unix epoch
        raise FileError(f"{where}: {field}: {conv[field]!r} is before 1970-01-01 (UTC)")
    return int(when.timestamp()) * 1_000_000


def _text(raw: dict[str, Any], key: str, where: str) -> str:
    value = raw.get(key)
    if not isinstance(value, str) or not value.strip():
        raise FileError(f"{where}: {key} must be a non-empty string, got {value!r}")
    return value


def _cut(text: str, limit: int) -> str:
    """The longest start of `text` that is at most `limit` UTF-8 bytes."""
    return text.encode("utf-8", "surrogatepass")[:limit].decode("utf-8", "ignore")


def split_text(text: str, limit: int = limits.MAX_TEXT_BYTES) -> list[str]:
    """`text` in consecutive parts of at most `limit` UTF-8 bytes, cut after the last
    whitespace that leaves a part at least half full (else mid-word); nothing is lost."""
    parts: list[str] = []
    while limits.utf8_bytes(text) > limit:
        head = _cut(text, limit)
        space = max(head.rfind(" "), head.rfind("\n"))
        if limits.utf8_bytes(head[: space + 1]) >= limit // 2:
            head = head[: space + 1]
        parts.append(head)
        text = text[len(head) :]
    return [*parts, text]


def _dia_id(raw: dict[str, Any], session: int, index: int, at: str) -> str:
    value = raw.get("dia_id")
    if value is None or value == "":  # made from its place, so a rerun makes the same id
        return f"D{session}:{index + 1}"
    if isinstance(value, int) and not isinstance(value, bool):
        value = str(value)
    if not isinstance(value, str) or not ID.fullmatch(value):
        raise FileError(f"{at}: dia_id must be 1..128 of [A-Za-z0-9._:@-], got {value!r}")
    return value


def _speakers(conv: dict[str, Any], where: str) -> tuple[str, str]:
    """speaker_a and speaker_b as given, or else the first two speakers of the turns."""
    named = [conv.get("speaker_a"), conv.get("speaker_b")]
    given = [s if isinstance(s, str) and s.strip() else None for s in named]
    if given[0] is not None and given[1] is not None:
        return given[0], given[1]
    seen: list[str] = []
    for key, turns in conv.items():
        if _SESSION.match(key) and isinstance(turns, list):
            for raw in turns:
                name = raw.get("speaker") if isinstance(raw, dict) else None
                if isinstance(name, str) and name.strip() and name not in seen:
                    seen.append(name)
    rest = [s for s in seen if s not in given]
    a = given[0] or (rest.pop(0) if rest else None)
    b = given[1] or (rest.pop(0) if rest else "")
    if a is None:
        raise FileError(f"{where}: speaker_a is missing and no turn names a speaker")
    return a, b


def _turns(raw: Any, n: int, i: int, where: str, time_us: int, seen: set[str]) -> list[Turn]:
    """The turn(s) one entry of session_<n> makes: none when it holds nothing to store,
    several when its text is over the API's limit."""
    at = f"{where}: session_{n}[{i}]"
    if not isinstance(raw, dict):
        raise FileError(f"{at}: expected a turn object, got {raw!r:.80}")
    dia_id = _dia_id(raw, n, i, at)
    if dia_id in seen:  # it is the turn's client id: a repeat would never be stored
        raise FileError(f"{at}: dia_id {dia_id!r} appears twice in this conversation")
    seen.add(dia_id)
    speaker = _text(raw, "speaker", at)
    if len(speaker) > limits.MAX_SPEAKER_CHARS:
        raise FileError(f"{at}: speaker is over {limits.MAX_SPEAKER_CHARS} characters")
    text = raw.get("text")
    text = text.replace("\x00", "") if isinstance(text, str) else ""
    caption = raw.get("blip_caption")
    caption = caption.replace("\x00", "").strip() if isinstance(caption, str) else ""
    if limits.is_blank(text):
        if limits.is_blank(caption):
            return []
        text, caption = f"[image: {caption}]", ""  # the picture was the message
    caption = _cut(caption, limits.MAX_METADATA_VALUE_BYTES)
    parts = split_text(text)
    ids = [dia_id, *(f"{dia_id}.{k}" for k in range(2, len(parts) + 1))]
    for extra in ids[1:]:
        if extra in seen or not ID.fullmatch(extra):
            raise FileError(
                f"{at}: its text is split in {len(parts)} turns, and {extra!r} "
                "is taken or too long for a dia_id"
            )
        seen.add(extra)
    return [
        Turn(dia_id=d, speaker=speaker, text=t, caption=caption, session=n, time_us=time_us)
        for d, t in zip(ids, parts, strict=True)
    ]


def _category(value: Any) -> int:
    """A question's category: 1-5 as the dataset numbers them, or by name; 0 if neither."""
    if isinstance(value, str):
        key = value.strip().lower().replace(" ", "-")
        if key in _CATEGORY_NAMES:
            return _CATEGORY_NAMES[key]
        value = key
    try:
        number = int(value)
    except (TypeError, ValueError):
        return 0
    return number if number in CATEGORIES else 0


def _conversation(
    sample: Any, path: Path, index: int, order: dates.Order | None = None
) -> Conversation:
    if not isinstance(sample, dict) or not isinstance(sample.get("conversation"), dict):
        raise FileError(f"{path}: sample [{index}]: expected an object with a 'conversation'")
    raw_id = sample.get("sample_id")
    sample_id = f"conversation-{index + 1}" if raw_id in (None, "") else str(raw_id)
    where = f"{path}: conversation {sample_id}"
    if not ID.fullmatch(sample_id):
        raise FileError(f"{where}: sample_id must be 1..128 of [A-Za-z0-9._:@-], got {sample_id!r}")
    conv = sample["conversation"]
    speaker_a, speaker_b = _speakers(conv, where)
    sessions = sorted(int(m.group(1)) for key in conv if (m := _SESSION.match(key)) and conv[key])
    turns: list[Turn] = []
    skipped: list[str] = []
    seen: set[str] = set()
    for n in sessions:
        time_us = _turn_time(conv, n, where, order)
        if not isinstance(conv[f"session_{n}"], list):
            raise FileError(f"{where}: session_{n} must be a list of turns")
        for i, raw in enumerate(conv[f"session_{n}"]):
            made = _turns(raw, n, i, where, time_us, seen)
            turns += made
            if not made:
                skipped.append(f"session_{n}[{i}]")
    stored = {t.dia_id for t in turns}  # evidence in a skipped turn can never be found
    questions: list[Question] = []
    for j, q in enumerate(sample.get("qa") or []):
        text = q.get("question") if isinstance(q, dict) else None
        if not isinstance(text, str) or not text.strip():
            raise FileError(f"{where}: qa[{j}]: question must be a non-empty string")
        evidence = q.get("evidence") or []
        questions.append(
            Question(
                question=text,
                answer=str(q.get("answer", q.get("adversarial_answer", ""))),
                evidence=repair_evidence(
                    evidence if isinstance(evidence, list) else [evidence], stored
                ),
                category=_category(q.get("category")),
            )
        )
    return Conversation(
        sample_id=sample_id,
        speaker_a=speaker_a,
        speaker_b=speaker_b,
        turns=tuple(turns),
        questions=tuple(questions),
        skipped=tuple(skipped),
    )


def session_dates(data: list[Any]) -> list[Any]:
    """Every session_<n>_date_time value of a file's samples."""
    return [
        value
        for sample in data
        if isinstance(sample, dict) and isinstance(sample.get("conversation"), dict)
        for key, value in sample["conversation"].items()
        if _SESSION_DATE.match(key)
    ]


def load(path: Path, date_order: dates.Order | None = None) -> list[Conversation]:
    """Every conversation of the file at `path`, all checked; FileError otherwise.
    `date_order`: how the file writes numeric day-month dates (08/05/2023); None reads it
    from the file's own dates (one with a day over 12 tells: `dates.order_of`)."""
    try:
        data = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise FileError(f"{path}: cannot read it as JSON: {exc}") from None
    if not isinstance(data, list):
        raise FileError(f"{path}: expected a list of LoCoMo samples")
    order = date_order
    if order is None:
        try:
            order = dates.order_of(session_dates(data))
        except ValueError as exc:
            raise FileError(f"{path}: {exc}: say which with --date-order dmy|mdy") from None
    out = [_conversation(sample, Path(path), i, order) for i, sample in enumerate(data)]
    ids = [c.sample_id for c in out]
    if len(set(ids)) != len(ids):
        twice = next(i for i in ids if ids.count(i) > 1)
        raise FileError(f"{path}: conversation {twice}: sample_id appears twice")
    return out
