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
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from hippo_cli import dates

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)
_SESSION = re.compile(r"^session_(\d+)$")
_SESSION_DATE = re.compile(r"^session_\d+_date_time$")
_DIA = re.compile(r"^D(\d+):(\d+)$")
# The Memory API's identifier rule (scope ids, client ids): checked here so a file the
# gateway would refuse half-way through is refused before anything is sent.
ID = re.compile(r"[A-Za-z0-9._:@-]{1,128}")


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


def _conversation(
    sample: Any, path: Path, index: int, order: dates.Order | None = None
) -> Conversation:
    if not isinstance(sample, dict) or not isinstance(sample.get("conversation"), dict):
        raise FileError(f"{path}: sample [{index}]: expected an object with a 'conversation'")
    sample_id = str(sample.get("sample_id", ""))
    where = f"{path}: conversation {sample_id or f'[{index}]'}"
    if not ID.fullmatch(sample_id):
        raise FileError(f"{where}: sample_id must be 1..128 of [A-Za-z0-9._:@-], got {sample_id!r}")
    conv = sample["conversation"]
    speaker_a = _text(conv, "speaker_a", where)
    speaker_b = _text(conv, "speaker_b", where)
    sessions = sorted(int(m.group(1)) for key in conv if (m := _SESSION.match(key)) and conv[key])
    turns: list[Turn] = []
    seen: set[str] = set()
    for n in sessions:
        time_us = _turn_time(conv, n, where, order)
        if not isinstance(conv[f"session_{n}"], list):
            raise FileError(f"{where}: session_{n} must be a list of turns")
        for i, raw in enumerate(conv[f"session_{n}"]):
            at = f"{where}: session_{n}[{i}]"
            if not isinstance(raw, dict):
                raise FileError(f"{at}: expected a turn object, got {raw!r:.80}")
            dia_id = _text(raw, "dia_id", at)
            if not ID.fullmatch(dia_id):
                raise FileError(f"{at}: dia_id must be 1..128 of [A-Za-z0-9._:@-], got {dia_id!r}")
            if dia_id in seen:  # it is the turn's client id: a repeat would never be stored
                raise FileError(f"{at}: dia_id {dia_id!r} appears twice in this conversation")
            seen.add(dia_id)
            turns.append(
                Turn(
                    dia_id=dia_id,
                    speaker=_text(raw, "speaker", at),
                    text=_text(raw, "text", at),
                    caption=str(raw.get("blip_caption") or ""),
                    session=n,
                    time_us=time_us,
                )
            )
    try:
        questions = tuple(
            Question(
                question=q["question"],
                answer=str(q.get("answer", q.get("adversarial_answer", ""))),
                evidence=repair_evidence(q.get("evidence", []), seen),
                category=int(q["category"]),
            )
            for q in sample.get("qa", [])
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise FileError(f"{where}: qa: a question lacks or misspells {exc}") from None
    return Conversation(
        sample_id=sample_id,
        speaker_a=speaker_a,
        speaker_b=speaker_b,
        turns=tuple(turns),
        questions=questions,
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
