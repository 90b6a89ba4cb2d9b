"""`hippo seed`'s reading of a LoCoMo archive: operator turns with their replies, in
order, on the archive's own clock; the most recent conversations held back."""

from __future__ import annotations

from pathlib import Path

import locomo_sample

from hippo_cli import locomo
from hippo_cli.seed import exchanges, split


def _conversation() -> locomo.Conversation:
    turns = (
        locomo.Turn("D1:1", "Ann", "I moved to Lisbon.", "", 1, 10),
        locomo.Turn("D1:2", "Bo", "Nice!", "", 1, 10),
        locomo.Turn("D1:3", "Bo", "Do you like it?", "", 1, 10),
        locomo.Turn("D2:1", "Ann", "Yes, Lisbon is sunny.", "", 2, 20),
    )
    return locomo.Conversation("c1", "Ann", "Bo", turns, ())


def test_exchanges_pair_operator_turns_with_the_replies_that_follow() -> None:
    assert exchanges(_conversation()) == [
        ("I moved to Lisbon.", "Nice! Do you like it?", 10),
        ("Yes, Lisbon is sunny.", "", 20),
    ]


def test_holdout_keeps_the_most_recent_conversations_out() -> None:
    a = _conversation()
    b = locomo.Conversation(
        "c2",
        "Ann",
        "Bo",
        tuple(t.__class__(**{**t.__dict__, "time_us": t.time_us + 100}) for t in a.turns),
        (),
    )
    seeded, held = split([b, a], 1)
    assert [c.sample_id for c in seeded] == ["c1"] and [c.sample_id for c in held] == ["c2"]
    assert split([a, b], 0) == ([a, b], [])


def test_an_archive_read_from_disk_is_chronological(tmp_path: Path) -> None:
    archive = locomo.load(locomo_sample.write(tmp_path / "archive.json", conversations=2))
    for conversation in archive:
        times = [when for _, _, when in exchanges(conversation)]
        assert times == sorted(times) and len(times) == 6 and len(set(times)) == 3
