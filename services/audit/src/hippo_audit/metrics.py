"""Domain metrics of the audit service (`hippo_audit_*`)."""

from __future__ import annotations

import time

from prometheus_client import Counter, Gauge, Histogram

APPEND_SECONDS = Histogram(
    "hippo_audit_append_seconds",
    "Time from an Append (or ForgetUser) reaching the writer's queue to its group commit "
    "being durable (fsynced).",
    buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
)
BATCH_ENTRIES = Histogram(
    "hippo_audit_commit_entries",
    "Entries written by one group commit (one transaction, one fsync).",
    buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 1024, 4096),
)
ENTRIES = Counter(
    "hippo_audit_entries_appended",
    "Entries appended, by event type (duplicates of an idempotency key are not counted).",
    ["event_type"],
)
DUPLICATES = Counter(
    "hippo_audit_duplicates",
    "Entries not appended because their idempotency key was already in the log.",
)
CHAIN_LENGTH = Gauge("hippo_audit_chain_length", "Entries in the log (the head's seq).")
CHECKPOINT_SIZE = Gauge(
    "hippo_audit_checkpoint_size", "Entries covered by the latest signed checkpoint."
)
_checkpoint_time = [0.0]
CHECKPOINT_AGE = Gauge(
    "hippo_audit_last_checkpoint_age_seconds",
    "Seconds since the latest checkpoint was signed (0 before the first).",
)
CHECKPOINT_AGE.set_function(
    lambda: time.time() - _checkpoint_time[0] if _checkpoint_time[0] else 0.0
)
WRITABLE = Gauge(
    "hippo_audit_writable",
    "1 when the log agrees with its signed checkpoints and accepts writes; 0 when it "
    "refuses them (tampering or rollback detected at start: see the log).",
)
VERIFIED = Counter("hippo_audit_verified_entries", "Entries whose hash Verify recomputed.")
VERIFY_FAILURES = Counter(
    "hippo_audit_verify_failures", "Verify calls that found a problem (any range)."
)
KEYS_DESTROYED = Counter(
    "hippo_audit_keys_destroyed", "Per-user encryption keys destroyed by ForgetUser."
)

KEY_SCRUB_FAILURES = Counter(
    "hippo_audit_key_scrub_failures",
    "Erasures after which the key table could not be rewritten (cluster mode): the "
    "destroyed keys' bytes may stay in its free space until the next rewrite succeeds.",
)


def checkpoint_signed(size: int, time_us: int) -> None:
    CHECKPOINT_SIZE.set(size)
    _checkpoint_time[0] = time_us / 1e6
