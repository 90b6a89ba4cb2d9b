"""Domain metrics of the summariser (`hippo_summariser_*`), documented in docs/metrics.md.

Retention is easiest read as a ratio of the two counters:
`hippo_summariser_facts_total{stage="kept"} / hippo_summariser_facts_total{stage="checked"}`
(after validation) and the same with `stage="kept_llm"` (the LLM alone)."""

from __future__ import annotations

from prometheus_client import Counter, Gauge, Histogram

_RATIO = (0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0)

TURNS = Counter(
    "hippo_summariser_turns_appended",
    "Turns in Append calls: appended = new to the session, duplicate = already held.",
    ["result"],
)
TURNS_UNCOUNTED = Counter(
    "hippo_summariser_turns_uncounted",
    "Turns stored without a token count because CountTokens failed; the merge worker "
    "counts them when the injection service answers again.",
)
MERGES = Counter(
    "hippo_summariser_merges",
    "Merges by result: committed, or conflict (the session changed under the merge: "
    "it is planned again from the new state).",
    ["result"],
)
MERGE_SECONDS = Histogram(
    "hippo_summariser_merge_seconds",
    "One committed merge: LLM call(s), validation, repair and token counting.",
    buckets=(0.5, 1, 2.5, 5, 10, 20, 30, 60, 120, 300),
)
MERGE_LAG = Histogram(
    "hippo_summariser_merge_lag_seconds",
    "From the moment a session needed a merge to the moment its window was back within "
    "budget (includes waiting for a merge slot, retries and backoff).",
    buckets=(1, 2.5, 5, 10, 30, 60, 120, 300, 900, 3600),
)
PENDING = Gauge(
    "hippo_summariser_merges_pending",
    "Sessions with a merge scheduled, running or waiting to retry.",
)
RETENTION = Histogram(
    "hippo_summariser_merge_retention",
    "Share of the merged turns' facts (names, numbers, dates, identifiers) in the summary, "
    "per merge: stage=llm is the LLM's first answer, stage=final the committed summary.",
    ["stage"],
    buckets=_RATIO,
)
FACTS = Counter(
    "hippo_summariser_facts",
    "Facts of merged turns: checked, kept_llm (in the LLM's first answer), kept (in the "
    "committed summary).",
    ["stage"],
)
REPAIRS = Counter(
    "hippo_summariser_repairs",
    "Validation at work: strict_retry (second LLM call), facts_sentence (missing facts "
    "appended), invented_sentence (LLM sentences removed for facts no source holds).",
    ["kind"],
)
LLM_ERRORS = Counter(
    "hippo_summariser_llm_errors",
    "Failed LLM calls: unavailable (down, overloaded, timed out: retried with backoff) or "
    "rejected (the request itself refused: the merge falls back to the facts sentence).",
    ["kind"],
)
COUNT_ERRORS = Counter(
    "hippo_summariser_count_errors",
    "CountTokens calls that failed (turns stored uncounted, or a merge retried later).",
)
SUMMARIES_ERASED = Counter(
    "hippo_summariser_summaries_erased",
    "Summaries erased by Forget because a turn merged into them was forgotten.",
)
SESSIONS = Gauge(
    "hippo_summariser_sessions",
    "Sessions held in the session store (all tenants), counted at scrape time.",
)
CLAIMS = Counter(
    "hippo_summariser_claims",
    "Merge claims by result: taken (free), taken_over (another replica's lease had run "
    "out: it died or stalled), busy (another replica holds it: left to it), lost (taken "
    "over while this replica merged: its merge was stopped or refused).",
    ["result"],
)
# The audit outbox's metrics are the shared hippo_outbox_*{outbox="summariser_audit"}.

# Known label values start at zero: a series born at its first event is first scraped
# at 1, so rate() never shows that event and a ratio of two such series has gaps.
for _label in ("appended", "duplicate"):
    TURNS.labels(_label)
for _label in ("committed", "conflict"):
    MERGES.labels(_label)
for _label in ("llm", "final"):
    RETENTION.labels(_label)
for _label in ("checked", "kept_llm", "kept"):
    FACTS.labels(_label)
for _label in ("strict_retry", "facts_sentence", "invented_sentence"):
    REPAIRS.labels(_label)
for _label in ("unavailable", "rejected"):
    LLM_ERRORS.labels(_label)
for _label in ("taken", "taken_over", "busy", "lost"):
    CLAIMS.labels(_label)
