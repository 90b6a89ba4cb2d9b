"""Neutral statements: the reference for hidden-state norms and the default baseline
subtracted from value vectors (ActAdd and CAA subtract a contrast; an average of
unrelated, plain statements removes what every sentence shares at a layer)."""

from __future__ import annotations

NEUTRAL_STATEMENTS: tuple[str, ...] = (
    "The train leaves the station at nine in the morning.",
    "Water boils at one hundred degrees Celsius at sea level.",
    "The library is open from Monday to Saturday.",
    "A square has four sides of equal length.",
    "The meeting was moved to the larger room on the second floor.",
    "Most birds build their nests in the spring.",
    "The recipe needs two cups of flour and one egg.",
    "The river flows through the middle of the old town.",
    "He put the books back on the shelf after reading them.",
    "The weather report said it might rain later in the afternoon.",
    "The museum has a collection of old maps and coins.",
    "She walked to the shop to buy some bread and milk.",
    "The new bridge will connect the two sides of the valley.",
    "Computers store information as sequences of bits.",
    "The children played football in the park after school.",
    "The letter arrived three days after it was posted.",
)
