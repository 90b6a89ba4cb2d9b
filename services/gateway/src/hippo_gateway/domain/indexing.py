"""What is embedded for a turn (the vector that finds it).

Kept in one place because it decides recall quality: bench/recall_locomo.py measures it.
"""

from __future__ import annotations

from hippo_gateway.domain.models import TurnIn


def vector_text(turn: TurnIn) -> str:
    return turn.text
