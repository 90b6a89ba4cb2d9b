"""The summariser's own contract, checked before anything is counted or written.

The gateway validates the public API; these checks keep the internal service safe on
its own (another caller, a bug upstream). Messages name the field as the proto spells
it, and the limit. Text and ids hold no NUL character: PostgreSQL's text type cannot
store one, and both engines must accept the same input.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hippo_core.errors import InvalidArgument
from hippo_summariser.domain.models import TurnIn

MAX_ID = 128


@dataclass(frozen=True)
class Limits:
    max_turns: int = 1024
    max_text_bytes: int = 32 * 1024
    max_speaker_chars: int = 256
    max_memory_ids: int = 10_000


def require(field: str, value: str) -> None:
    if not value:
        raise InvalidArgument(field, "is required")
    if len(value) > MAX_ID:
        raise InvalidArgument(field, f"at most {MAX_ID} characters, got {len(value)}")
    no_nul(field, value)


def no_nul(field: str, value: str) -> None:
    if "\x00" in value:
        raise InvalidArgument(field, "must not contain a NUL character")


def check_session(tenant: str, user: str, session: str) -> None:
    require("tenant", tenant)
    require("user_id", user)
    require("session_id", session)


def check_turns(turns: Sequence[TurnIn], limits: Limits) -> None:
    if not 1 <= len(turns) <= limits.max_turns:
        raise InvalidArgument("turns", f"must hold 1..{limits.max_turns} turns, got {len(turns)}")
    for i, turn in enumerate(turns):
        require(f"turns[{i}].memory_id", turn.memory_id)
        size = len(turn.text.encode("utf-8", "surrogatepass"))
        if size == 0:
            raise InvalidArgument(f"turns[{i}].text", "is required")
        if size > limits.max_text_bytes:
            raise InvalidArgument(
                f"turns[{i}].text", f"{size} bytes exceeds the limit of {limits.max_text_bytes}"
            )
        if len(turn.speaker) > limits.max_speaker_chars:
            raise InvalidArgument(
                f"turns[{i}].speaker",
                f"at most {limits.max_speaker_chars} characters, got {len(turn.speaker)}",
            )
        no_nul(f"turns[{i}].text", turn.text)
        no_nul(f"turns[{i}].speaker", turn.speaker)
        if turn.time_us < 0:
            raise InvalidArgument(f"turns[{i}].time_us", f"must be >= 0, got {turn.time_us}")


def check_forget(
    tenant: str, user: str, session: str, memory_ids: Sequence[str], limits: Limits
) -> None:
    require("tenant", tenant)
    require("user_id", user)
    if session:
        require("session_id", session)
    if len(memory_ids) > limits.max_memory_ids:
        raise InvalidArgument(
            "memory_ids", f"at most {limits.max_memory_ids} ids, got {len(memory_ids)}"
        )
    for i, memory_id in enumerate(memory_ids):
        require(f"memory_ids[{i}]", memory_id)
