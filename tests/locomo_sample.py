"""A small LoCoMo-format archive written by the tests themselves (the dev data in
../shared is not part of a clone, so no test may depend on it)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PLACES = ["Lisbon", "Porto", "Braga", "Faro", "Evora", "Sintra"]


def conversation(n: int, sessions: int = 3) -> dict[str, Any]:
    """Conversation `conv-n`: `sessions` sessions on later days for a larger n, each with
    two operator (speaker_a) turns and their replies."""
    body: dict[str, Any] = {"speaker_a": f"Ana{n}", "speaker_b": f"Ben{n}"}
    for s in range(1, sessions + 1):
        body[f"session_{s}_date_time"] = f"1:56 pm on {s + 2 * n} May, 2023"
        place = PLACES[(n + s) % len(PLACES)]
        body[f"session_{s}"] = [
            {"speaker": f"Ana{n}", "dia_id": f"D{s}:1", "text": f"I never fly to {place}."},
            {"speaker": f"Ben{n}", "dia_id": f"D{s}:2", "text": f"Noted: no flights to {place}."},
            {"speaker": f"Ana{n}", "dia_id": f"D{s}:3", "text": f"My budget is {100 * s} euros."},
            {"speaker": f"Ben{n}", "dia_id": f"D{s}:4", "text": "Understood, I will keep to it."},
        ]
    return {"sample_id": f"conv-{n}", "conversation": body, "qa": []}


def write(path: Path, conversations: int = 3) -> Path:
    path.write_text(json.dumps([conversation(n) for n in range(conversations)]))
    return path
