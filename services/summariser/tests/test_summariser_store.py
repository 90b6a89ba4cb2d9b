"""The SQLite session store: durability, deduplication, compare-and-set, tenancy, erasure."""

from __future__ import annotations

from pathlib import Path

import pytest

from hippo_summariser.adapters.sqlite_store import SqliteSessionStore
from hippo_summariser.domain.models import MergeOutcome, Role, SessionKey, TurnIn

A = SessionKey("acme", "u1", "s1")


def turns(*texts: str, start: int = 0, tokens: int | None = 5) -> list[TurnIn]:
    roles = (Role.USER, Role.ASSISTANT)
    return [
        TurnIn(f"m{start + i}", roles[(start + i) % 2], text, 1_000 + i, "Ada", tokens)
        for i, text in enumerate(texts)
    ]


def outcome(summary: str, facts: int = 4, kept_llm: int = 2, kept: int = 4) -> MergeOutcome:
    return MergeOutcome(summary, len(summary.split()), facts, kept_llm, kept, 1, True, 0)


@pytest.fixture
def store(tmp_path: Path) -> SqliteSessionStore:
    s = SqliteSessionStore(tmp_path / "sessions.sqlite3")
    yield s  # type: ignore[misc]
    s.close()


def file_bytes(folder: Path) -> bytes:
    return b"".join(p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file())


def test_append_is_durable_and_skips_ids_the_session_holds(tmp_path: Path) -> None:
    store = SqliteSessionStore(tmp_path / "s.sqlite3")
    session, added = store.append(A, turns("a", "b"), 1)
    assert added == 2 and session.version == 1 and session.turns_total == 2
    session, added = store.append(A, [*turns("a", "b"), *turns("c", start=2)], 2)
    assert added == 1 and session.version == 2
    session, added = store.append(A, turns("a"), 3)
    assert added == 0 and session.version == 2  # nothing new: no new version
    store.close()
    reopened = SqliteSessionStore(tmp_path / "s.sqlite3")
    loaded = reopened.load(A)
    assert loaded is not None
    assert [t.text for t in loaded.window] == ["a", "b", "c"]
    assert [t.role for t in loaded.window] == [Role.USER, Role.ASSISTANT, Role.USER]
    assert loaded.window_tokens == 15
    reopened.close()


def test_tenancy_is_applied_to_reads_writes_and_erasure(store: SqliteSessionStore) -> None:
    other = SessionKey("globex", "u1", "s1")
    store.append(A, turns("acme secret"), 1)
    store.append(other, turns("globex secret"), 1)
    assert store.load(SessionKey("acme", "u2", "s1")) is None
    loaded = store.load(other)
    assert loaded is not None and [t.text for t in loaded.window] == ["globex secret"]
    assert store.forget("globex", "u1", None, ["m0"]).sessions_deleted == 1
    kept = store.load(A)
    assert kept is not None and [t.text for t in kept.window] == ["acme secret"]
    assert store.load(other) is None


def test_a_merge_commits_only_if_nothing_changed_under_it(store: SqliteSessionStore) -> None:
    session, _ = store.append(A, turns("a", "b", "c", "d"), 1)
    seqs = [t.seq for t in session.window[:2]]
    assert store.commit_merge(A, session.summary_rev + 1, seqs, outcome("x"), 2) is None
    version = store.commit_merge(A, session.summary_rev, seqs, outcome("sum one"), 2)
    assert version == session.version + 1
    merged = store.load(A)
    assert merged is not None
    assert merged.summary == "sum one" and [t.text for t in merged.window] == ["c", "d"]
    assert merged.turns_total == 4
    assert merged.stats.merges == 1 and merged.stats.turns_merged == 2
    assert (merged.stats.facts, merged.stats.facts_kept_llm, merged.stats.facts_kept) == (4, 2, 4)
    assert merged.stats.last_retention_llm == 0.5 and merged.stats.last_retention == 1.0
    # The same merge again (a second worker with the old revision) is refused.
    assert store.commit_merge(A, session.summary_rev, seqs, outcome("dup"), 3) is None
    # A merge whose turn was forgotten meanwhile is refused: its summary quotes it.
    rev = merged.summary_rev
    store.forget("acme", "u1", "s1", ["m2"])
    assert store.commit_merge(A, rev, [merged.window[0].seq], outcome("quotes c"), 4) is None


def test_forgetting_a_merged_turn_erases_the_summary_from_the_file(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    store = SqliteSessionStore(folder / "sessions.sqlite3")
    session, _ = store.append(A, turns("CANARY-TURN-7781 said hi", "ok", "later", "fine"), 1)
    seqs = [t.seq for t in session.window[:2]]
    store.commit_merge(A, 0, seqs, outcome("Ada said hi (CANARY-SUMMARY-5521)."), 2)
    assert b"CANARY-SUMMARY-5521" in file_bytes(folder)
    result = store.forget("acme", "u1", "s1", ["m0"])
    assert (result.summaries_erased, result.turns_removed, result.sessions_deleted) == (1, 0, 0)
    after = store.load(A)
    assert after is not None and after.summary == "" and after.summary_tokens == 0
    assert [t.text for t in after.window] == ["later", "fine"]
    assert after.turns_total == 3  # m1 stays known (retired), so a retry is skipped
    assert store.append(A, turns("ok", start=1), 3)[1] == 0
    data = file_bytes(folder)
    assert b"CANARY-SUMMARY-5521" not in data and b"CANARY-TURN-7781" not in data
    store.close()


def test_forgetting_window_turns_a_session_or_a_user(tmp_path: Path) -> None:
    folder = tmp_path / "data"
    store = SqliteSessionStore(folder / "sessions.sqlite3")
    store.append(A, turns("WINDOW-CANARY-1", "two"), 1)
    store.append(SessionKey("acme", "u1", "s2"), turns("SESSION-CANARY-2"), 1)
    store.append(SessionKey("acme", "u1", "s3"), turns("USER-CANARY-3"), 1)
    store.append(SessionKey("acme", "u2", "s1"), turns("OTHER-USER"), 1)
    result = store.forget("acme", "u1", "s1", ["m0"])
    assert (result.turns_removed, result.summaries_erased) == (1, 0)
    assert result.touched == (A,)
    assert store.forget("acme", "u1", "s2", []).sessions_deleted == 1
    assert store.forget("acme", "u1", None, []).sessions_deleted == 2
    assert store.load(A) is None
    remaining = store.load(SessionKey("acme", "u2", "s1"))
    assert remaining is not None and remaining.window[0].text == "OTHER-USER"
    data = file_bytes(folder)
    for canary in (b"WINDOW-CANARY-1", b"SESSION-CANARY-2", b"USER-CANARY-3"):
        assert canary not in data
    store.close()


def test_uncounted_turns_and_sessions_over_budget_are_pending(store: SqliteSessionStore) -> None:
    small, big = SessionKey("acme", "u1", "small"), SessionKey("acme", "u1", "big")
    uncounted = SessionKey("acme", "u1", "uncounted")
    store.append(small, turns("a", "b"), 1)
    store.append(big, turns(*"abcdefgh"), 1)
    session, _ = store.append(uncounted, turns("a", tokens=None), 1)
    assert set(store.pending(20)) == {big, uncounted}
    store.set_tokens(uncounted, {session.window[0].seq: 7}, 2)
    counted = store.load(uncounted)
    assert counted is not None and counted.window[0].tokens == 7
    assert counted.version == session.version + 1
    assert set(store.pending(20)) == {big}


def test_session_count_follows_appends_and_erasure_and_is_zero_once_closed(
    tmp_path: Path,
) -> None:
    """The store-size gauge reads it at scrape time, also while the service shuts down."""
    store = SqliteSessionStore(tmp_path / "s.sqlite3")
    assert store.session_count() == 0
    store.append(A, turns("a"), 1)
    store.append(SessionKey("acme", "u1", "s2"), turns("b"), 1)
    store.append(A, turns("a", "c"), 2)  # same session: still two
    assert store.session_count() == 2
    store.forget("acme", "u1", "s2", [])  # a whole session
    assert store.session_count() == 1
    store.close()
    assert store.session_count() == 0
