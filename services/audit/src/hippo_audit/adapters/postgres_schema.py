"""The audit service's tables in PostgreSQL (cluster mode), schema `hippo_audit`.

- `entries`: the log, append-only by trigger (UPDATE, DELETE and TRUNCATE raise), so a
  bug cannot rewrite history through any replica. A database superuser can disable the
  triggers: that is what the hash chain and the signed checkpoints are for.
- `head`: one row, the append lock. Every batch locks it FOR UPDATE, builds on the seq
  and hash it holds, and moves it in the same transaction; it also records the latest
  checkpoint, so the batch that must sign one is decided under the same lock.
- `checkpoints`: the witness, append-only by the same trigger; one row per size.
- `user_keys`: per-user AES-256-GCM keys. Not append-only: an erasure deletes rows (and
  rewrites the table, see postgres_keys).

Numbered migrations (hippo_core.postgres): version 1 is this layout; never edit it, add.
"""

from __future__ import annotations

from hippo_audit.domain.chain import GENESIS
from hippo_core.postgres import Migration

SCHEMA = "hippo_audit"
APPENDED = "appended"  # NOTIFY channel: a batch of entries committed

MIGRATIONS: list[Migration] = [
    f"""
CREATE FUNCTION refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
BEGIN
    RAISE EXCEPTION 'audit % are append-only (% refused)', TG_TABLE_NAME, TG_OP;
END
$$;

CREATE TABLE entries (
    seq             bigint PRIMARY KEY,
    time_us         bigint NOT NULL,
    key_id          bigint NOT NULL,
    tenant          text NOT NULL,
    actor           text NOT NULL,
    event_type      text NOT NULL,
    user_id         text NOT NULL,
    session_id      text NOT NULL,
    memory_ids      text NOT NULL,
    body            text NOT NULL,
    sealed          bytea NOT NULL,
    idempotency_key text NOT NULL,
    prev_hash       bytea NOT NULL,
    hash            bytea NOT NULL
);
CREATE INDEX entries_by_tenant ON entries (tenant, seq);
CREATE INDEX entries_by_user ON entries (tenant, user_id, seq);
CREATE INDEX entries_by_session ON entries (tenant, user_id, session_id, seq);
CREATE UNIQUE INDEX entries_by_key ON entries (tenant, idempotency_key)
    WHERE idempotency_key <> '';
CREATE TRIGGER entries_are_append_only BEFORE UPDATE OR DELETE ON entries
    FOR EACH ROW EXECUTE FUNCTION refuse_change();
CREATE TRIGGER entries_are_never_truncated BEFORE TRUNCATE ON entries
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_change();

CREATE TABLE checkpoints (
    id        bigserial PRIMARY KEY,
    size      bigint NOT NULL UNIQUE,
    hash      bytea NOT NULL,
    time_us   bigint NOT NULL,
    key_id    text NOT NULL,
    signature bytea NOT NULL
);
CREATE TRIGGER checkpoints_are_append_only BEFORE UPDATE OR DELETE ON checkpoints
    FOR EACH ROW EXECUTE FUNCTION refuse_change();
CREATE TRIGGER checkpoints_are_never_truncated BEFORE TRUNCATE ON checkpoints
    FOR EACH STATEMENT EXECUTE FUNCTION refuse_change();

CREATE TABLE head (
    id              smallint PRIMARY KEY CHECK (id = 1),
    seq             bigint NOT NULL,
    hash            bytea NOT NULL,
    checkpoint_size bigint NOT NULL,
    checkpoint_us   bigint NOT NULL
);
INSERT INTO head (id, seq, hash, checkpoint_size, checkpoint_us)
    VALUES (1, 0, '\\x{GENESIS.hex()}', 0, 0);

CREATE TABLE user_keys (
    key_id     bigserial PRIMARY KEY,
    tenant     text NOT NULL,
    user_id    text NOT NULL,
    key        bytea NOT NULL,
    created_us bigint NOT NULL
);
CREATE INDEX user_keys_by_user ON user_keys (tenant, user_id, key_id);
""",
]
