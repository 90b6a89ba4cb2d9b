"""Exchange-aware trimming of the working window (pure functions, property-tested).

The window is cut only between exchanges: an exchange starts at a USER turn that follows a
non-USER turn and runs until the next such turn, so a user's consecutive messages, the
assistant's replies to them and any SYSTEM/TOOL turns in between stay together. Turns
before the first USER turn (a greeting, a system note) form a leading group of their own.
Cutting anywhere else could leave a reply without the message it answers: the model
would then read a conversation whose roles do not alternate.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from hippo_summariser.domain.models import Role, WindowTurn


@dataclass(frozen=True)
class Trim:
    kept: tuple[WindowTurn, ...]  # the newest whole exchanges, oldest first
    dropped: tuple[WindowTurn, ...]  # everything older, oldest first


def exchanges(window: Sequence[WindowTurn]) -> list[tuple[WindowTurn, ...]]:
    """The window split into exchanges, in order (see the module docstring)."""
    groups: list[list[WindowTurn]] = []
    for turn in window:
        starts = turn.role is Role.USER and (not groups or groups[-1][-1].role is not Role.USER)
        if starts or not groups:
            groups.append([turn])
        else:
            groups[-1].append(turn)
    return [tuple(g) for g in groups]


def tokens(turns: Sequence[WindowTurn]) -> int:
    total = 0
    for turn in turns:
        if turn.tokens is None:
            # Trimming on a guess would break the budget promise; callers count first.
            raise ValueError(f"turn {turn.memory_id} has not been counted")
        total += turn.tokens
    return total


def trim(window: Sequence[WindowTurn], budget: int) -> Trim:
    """Newest first, keep whole exchanges while the kept ones fit in `budget` tokens; the
    latest exchange is always kept, even if alone it exceeds the budget. The first exchange
    that does not fit, and everything older, is dropped (kept turns stay contiguous)."""
    groups = exchanges(window)
    if not groups:
        return Trim((), ())
    total = tokens(groups[-1])
    split = len(groups) - 1
    while split > 0:
        cost = tokens(groups[split - 1])
        if total + cost > budget:
            break
        total += cost
        split -= 1
    dropped = tuple(t for g in groups[:split] for t in g)
    kept = tuple(t for g in groups[split:] for t in g)
    return Trim(kept, dropped)


def needs_merge(window: Sequence[WindowTurn], budget: int) -> bool:
    """True when the window is over budget and holds an exchange that could be dropped.
    Uncounted turns count as pending work (the worker counts them first)."""
    if any(t.tokens is None for t in window):
        return True
    return bool(trim(window, budget).dropped)


def next_merge(
    window: Sequence[WindowTurn], budget: int, low_water: int, max_input_tokens: int
) -> tuple[WindowTurn, ...]:
    """The turns the next merge takes: nothing while the window fits in `budget`; else the
    oldest whole exchanges of what trimming to `low_water` drops, at most `max_input_tokens`
    of them (at least one exchange), so one merge prompt stays within the LLM's context and
    a huge backlog is merged in several ordered steps.

    Trimming to a low-water mark below the budget makes merges come in batches: the window
    then grows by (budget - low_water) tokens before the next merge, instead of calling
    the LLM for every new exchange once the window is full."""
    if not trim(window, budget).dropped:
        return ()
    out: list[WindowTurn] = []
    total = 0
    for group in exchanges(trim(window, low_water).dropped):
        cost = tokens(group)
        if out and total + cost > max_input_tokens:
            break
        out.extend(group)
        total += cost
    return tuple(out)
