"""The session store's contract, on both engines (SQLite and PostgreSQL): durability,
deduplication, claims, compare-and-set, tenancy, erasure."""

from __future__ import annotations

import time

from summariser_harness import Stores

from hippo_summariser.domain.models import Claim, MergeOutcome, Role, SessionKey, TurnIn

A = SessionKey("acme", "u1", "s1")


def turns(*texts: str, start: int = 0, tokens: int | None = 5) -> list[TurnIn]:
    roles = (Role.USER, Role.ASSISTANT)
    return [
        TurnIn(f"m{start + i}", roles[(start + i) % 2], text, 1_000 + i, "Ada", tokens)
        for i, text in enumerate(texts)
    ]


def outcome(summary: str, facts: int = 4, kept_llm: int = 2, kept: int = 4) -> MergeOutcome:
    return MergeOutcome(summary, len(summary.split()), facts, kept_llm, kept, 1, True, 0)


def test_append_is_durable_and_skips_ids_the_session_holds(stores: Stores) -> None:
    store = stores.make()
    session, added = store.append(A, turns("a", "b"), 1)
    assert added == 2 and session.version == 1 and session.turns_total == 2
    session, added = store.append(A, [*turns("a", "b"), *turns("c", start=2)], 2)
    assert added == 1 and session.version == 2
    session, added = store.append(A, turns("a"), 3)
    assert added == 0 and session.version == 2  # nothing new: no new version
    # The same id twice in one call is one turn (the first).
    session, added = store.append(A, [*turns("d", start=3), *turns("d-again", start=3)], 4)
    assert added == 1 and session.window[-1].text == "d"
    store.close()
    reopened = stores.make()
    loaded = reopened.load(A)
    assert loaded is not None
    assert [t.text for t in loaded.window] == ["a", "b", "c", "d"]
    assert [t.role for t in loaded.window] == [Role.USER, Role.ASSISTANT, Role.USER, Role.ASSISTANT]
    assert [t.seq for t in loaded.window] == sorted(t.seq for t in loaded.window)
    assert loaded.window_tokens == 20


def test_tenancy_is_applied_to_reads_writes_and_erasure(stores: Stores) -> None:
    store = stores.make()
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


def test_a_merge_commits_only_if_claimed_and_nothing_changed_under_it(stores: Stores) -> None:
    store = stores.make()
    session, _ = store.append(A, turns("a", "b", "c", "d"), 1)
    seqs = [t.seq for t in session.window[:2]]
    # Unclaimed: refused, whatever the revision.
    assert store.commit_merge(A, session.summary_rev, seqs, outcome("x"), 2) is None
    assert store.claim(A, 30) is Claim.TAKEN
    assert store.commit_merge(A, session.summary_rev + 1, seqs, outcome("x"), 2) is None
    version = store.commit_merge(A, session.summary_rev, seqs, outcome("sum one"), 2)
    assert version == session.version + 1
    merged = store.load(A)
    assert merged is not None
    assert merged.summary == "sum one" and [t.text for t in merged.window] == ["c", "d"]
    assert merged.turns_total == 4 and merged.version == version
    assert merged.stats.merges == 1 and merged.stats.turns_merged == 2
    assert (merged.stats.facts, merged.stats.facts_kept_llm, merged.stats.facts_kept) == (4, 2, 4)
    assert merged.stats.last_retention_llm == 0.5 and merged.stats.last_retention == 1.0
    # The same merge again (a second worker with the old revision) is refused.
    assert store.commit_merge(A, session.summary_rev, seqs, outcome("dup"), 3) is None
    # A merge whose turn was forgotten meanwhile is refused: its summary quotes it.
    rev = merged.summary_rev
    store.forget("acme", "u1", "s1", ["m2"])
    assert store.commit_merge(A, rev, [merged.window[0].seq], outcome("quotes c"), 4) is None
    after = store.load(A)
    assert after is not None and after.summary == "sum one" and after.stats.merges == 1


def test_one_replica_holds_a_claim_until_it_lets_go_or_its_lease_runs_out(
    stores: Stores,
) -> None:
    one, two = stores.make("replica-1"), stores.make("replica-2")
    session, _ = one.append(A, turns("a", "b", "c", "d"), 1)
    assert one.claim(A, 30) is Claim.TAKEN
    assert one.claim(A, 30) is Claim.RENEWED
    assert two.claim(A, 30) is Claim.BUSY
    assert one.renew(A, 30) and not two.renew(A, 30)
    two.release(A)  # not its claim: nothing happens
    assert two.claim(A, 30) is Claim.BUSY
    assert one.orphaned() == [] and two.orphaned() == []  # a live lease is no orphan
    one.release(A)
    assert two.claim(A, 0.3) is Claim.TAKEN
    # replica-2 stops renewing (it died, or stalled): once its lease has run out, the
    # session is an orphan for the others, and replica-1 takes it over.
    time.sleep(0.4)
    assert one.orphaned() == [A] and two.orphaned() == []
    assert one.claim(A, 30) is Claim.TAKEN_OVER
    assert not two.renew(A, 30)  # the late one learns it
    seqs = [t.seq for t in session.window[:2]]
    # Its late commit changes nothing; the new holder's commits.
    assert two.commit_merge(A, session.summary_rev, seqs, outcome("late"), 2) is None
    assert one.commit_merge(A, session.summary_rev, seqs, outcome("taker"), 2) is not None
    loaded = two.load(A)
    assert loaded is not None and loaded.summary == "taker" and loaded.stats.merges == 1
    # An expired lease of its own holder still refuses the commit: it is not held.
    assert one.claim(A, 0.1) is Claim.RENEWED
    time.sleep(0.2)
    rev = loaded.summary_rev
    assert one.commit_merge(A, rev, [loaded.window[0].seq], outcome("stale"), 3) is None
    assert two.release_all() == 0 and one.release_all() == 1
    assert two.claim(A, 30) is Claim.TAKEN


def test_a_claim_of_a_forgotten_session_goes_with_it(stores: Stores) -> None:
    store = stores.make()
    key = SessionKey("acme", "u1", "CLAIMED-SESSION-4471")
    store.append(key, turns("x"), 1)
    assert store.claim(key, 30) is Claim.TAKEN
    assert store.forget("acme", "u1", None, []).sessions_deleted == 1
    assert not stores.holds("CLAIMED-SESSION-4471")
    assert store.claim(key, 30) is Claim.BUSY  # nothing to merge
    assert store.release_all() == 0


def test_forgetting_a_merged_turn_erases_the_summary_from_the_store(stores: Stores) -> None:
    store = stores.make()
    session, _ = store.append(A, turns("CANARY-TURN-7781 said hi", "ok", "later", "fine"), 1)
    seqs = [t.seq for t in session.window[:2]]
    store.claim(A, 30)
    store.commit_merge(A, 0, seqs, outcome("Ada said hi (CANARY-SUMMARY-5521)."), 2)
    assert stores.holds("CANARY-SUMMARY-5521")
    result = store.forget("acme", "u1", "s1", ["m0"])
    assert (result.summaries_erased, result.turns_removed, result.sessions_deleted) == (1, 0, 0)
    assert result.touched == (A,)
    after = store.load(A)
    assert after is not None and after.summary == "" and after.summary_tokens == 0
    assert after.summary_rev == 2  # a merge planned on the erased summary cannot commit
    assert [t.text for t in after.window] == ["later", "fine"]
    assert after.turns_total == 3  # m1 stays known (retired), so a retry is skipped
    assert store.append(A, turns("ok", start=1), 3)[1] == 0
    assert not stores.holds("CANARY-SUMMARY-5521")
    assert not stores.holds("CANARY-TURN-7781")


def test_forgetting_window_turns_a_session_or_a_user(stores: Stores) -> None:
    store = stores.make()
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
    for canary in ("WINDOW-CANARY-1", "SESSION-CANARY-2", "USER-CANARY-3"):
        assert not stores.holds(canary)
    assert stores.holds("OTHER-USER")


def test_pending_lists_uncounted_and_over_budget_sessions_nobody_else_holds(
    stores: Stores,
) -> None:
    store, other = stores.make("me"), stores.make("other")
    small, big = SessionKey("acme", "u1", "small"), SessionKey("acme", "u1", "big")
    uncounted = SessionKey("acme", "u1", "uncounted")
    held = SessionKey("acme", "u1", "held")
    store.append(small, turns("a", "b"), 1)
    store.append(big, turns(*"abcdefgh"), 1)
    store.append(held, turns(*"abcdefgh"), 1)
    session, _ = store.append(uncounted, turns("a", tokens=None), 1)
    assert other.claim(held, 30) is Claim.TAKEN
    assert set(store.pending(20)) == {big, uncounted}
    assert set(other.pending(20)) == {big, uncounted, held}  # its own claim
    store.set_tokens(uncounted, {session.window[0].seq: 7}, 2)
    counted = store.load(uncounted)
    assert counted is not None and counted.window[0].tokens == 7
    assert counted.version == session.version + 1
    assert set(store.pending(20)) == {big}
    other.release(held)
    assert set(store.pending(20)) == {big, held}


def test_session_count_follows_appends_and_erasure_and_is_zero_once_closed(
    stores: Stores,
) -> None:
    """The store-size gauge reads it at scrape time, also while the service shuts down."""
    store = stores.make()
    assert store.session_count() == 0
    store.append(A, turns("a"), 1)
    store.append(SessionKey("acme", "u1", "s2"), turns("b"), 1)
    store.append(A, turns("a", "c"), 2)  # same session: still two
    assert store.session_count() == 2
    store.forget("acme", "u1", "s2", [])  # a whole session
    assert store.session_count() == 1
    store.close()
    assert store.session_count() == 0


def test_versions_of_a_users_sessions_inside_tenant_and_user(stores: Stores) -> None:
    store = stores.make()
    store.append(A, turns("a", "b"), 1)
    store.append(A, turns("c", start=2), 2)
    store.append(SessionKey("acme", "u1", "s2"), turns("x"), 3)
    store.append(SessionKey("globex", "u1", "s3"), turns("y"), 4)
    store.append(SessionKey("acme", "u2", "s4"), turns("z"), 5)
    asked = ["s1", "s2", "s3", "s4", "never", "s1"]
    assert store.versions("acme", "u1", asked) == {"s1": 2, "s2": 1}
    assert store.versions("globex", "u1", asked) == {"s3": 1}
    assert store.versions("acme", "u3", asked) == {}
    store.forget("acme", "u1", "s2", [])
    assert store.versions("acme", "u1", asked) == {"s1": 2}
