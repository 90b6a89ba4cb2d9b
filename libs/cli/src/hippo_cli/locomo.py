"""LoCoMo-format conversation files (Maharana et al. 2024): parsing for `hippo replay` and
the recall benchmark.

A file is a list of samples: `conversation` holds speaker_a, speaker_b, session_<n> (turns
{speaker, dia_id "D<n>:<i>", text, optional img_url / blip_caption}) and
session_<n>_date_time ("1:56 pm on 8 May, 2023"); `qa` holds questions with `evidence`
(dia_ids) and a `category` (1 multi-hop, 2 temporal, 3 open-domain, 4 single-hop,
5 adversarial).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

CATEGORIES = {1: "multi-hop", 2: "temporal", 3: "open-domain", 4: "single-hop", 5: "adversarial"}
_SESSION = re.compile(r"^session_(\d+)$")
_DIA = re.compile(r"^D(\d+):(\d+)$")


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


def parse_date(text: str) -> datetime:
    """'1:56 pm on 8 May, 2023' -> that minute, taken as UTC (the data has no zone)."""
    return datetime.strptime(text.strip(), "%I:%M %p on %d %B, %Y").replace(tzinfo=UTC)


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


def _conversation(sample: dict[str, Any]) -> Conversation:
    conv = sample["conversation"]
    sessions = sorted(int(m.group(1)) for key in conv if (m := _SESSION.match(key)) and conv[key])
    turns: list[Turn] = []
    for n in sessions:
        when = parse_date(conv[f"session_{n}_date_time"])
        time_us = int(when.timestamp()) * 1_000_000
        for raw in conv[f"session_{n}"]:
            turns.append(
                Turn(
                    dia_id=raw["dia_id"],
                    speaker=raw["speaker"],
                    text=raw["text"],
                    caption=str(raw.get("blip_caption") or ""),
                    session=n,
                    time_us=time_us,
                )
            )
    known = {t.dia_id for t in turns}
    questions = tuple(
        Question(
            question=q["question"],
            answer=str(q.get("answer", q.get("adversarial_answer", ""))),
            evidence=repair_evidence(q.get("evidence", []), known),
            category=int(q["category"]),
        )
        for q in sample.get("qa", [])
    )
    return Conversation(
        sample_id=str(sample["sample_id"]),
        speaker_a=conv["speaker_a"],
        speaker_b=conv["speaker_b"],
        turns=tuple(turns),
        questions=questions,
    )


def load(path: Path) -> list[Conversation]:
    data = json.loads(Path(path).read_text(encoding="utf-8"))
    if not isinstance(data, list):
        raise ValueError(f"{path}: expected a list of LoCoMo samples")
    return [_conversation(sample) for sample in data]
