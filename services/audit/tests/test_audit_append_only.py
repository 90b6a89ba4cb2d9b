"""No code path can update or delete a log entry or a checkpoint: checked on the
source, so it stays true.

(The database refuses it too, by trigger, in both engines: see test_audit_log. This test
keeps anyone from adding such SQL in the first place, including by dropping or disabling
the triggers.)
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
# Every hand-written module that can reach the log's file.
SOURCES = [
    *sorted((ROOT / "services" / "audit" / "src").rglob("*.py")),
    ROOT / "bench" / "audit.py",
    ROOT / "libs" / "cli" / "src" / "hippo_cli" / "audit.py",
]
_TABLES = r"(entries|checkpoints)"
FORBIDDEN = re.compile(
    rf"\bUPDATE\s+(OR\s+\w+\s+)?{_TABLES}\b"
    rf"|\bDELETE\s+FROM\s+{_TABLES}\b"
    rf"|\b(INSERT\s+OR\s+\w+|REPLACE)\s+INTO\s+{_TABLES}\b"
    r"|\bON\s+CONFLICT\b[^;]*\bDO\s+UPDATE\b"
    r"|\bDROP\s+(TABLE|TRIGGER|INDEX|FUNCTION)\b"
    rf"|\bALTER\s+TABLE\s+{_TABLES}\b"
    rf"|\bTRUNCATE\s+(TABLE\s+)?{_TABLES}\b"
    r"|\bDISABLE\s+TRIGGER\b|\bsession_replication_role\b",
    re.IGNORECASE,
)


def _strings(path: Path) -> list[str]:
    """Every string literal of a module, f-strings' literal parts included."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return [
        node.value
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
    ]


def test_the_rule_catches_what_it_should() -> None:
    for sql in (
        "UPDATE entries SET body = ?",
        "update  or ignore entries set x = 1",
        "DELETE FROM entries WHERE seq > ?",
        "INSERT OR REPLACE INTO entries VALUES (?)",
        "REPLACE INTO entries VALUES (?)",
        "INSERT INTO entries (seq) VALUES (?) ON CONFLICT (seq) DO UPDATE SET seq = 1",
        "DROP TRIGGER entries_are_never_deleted",
        "DROP TABLE entries",
        "ALTER TABLE entries RENAME TO old",
        "UPDATE checkpoints SET size = 1",
        "DELETE FROM checkpoints WHERE size > 10",
        "TRUNCATE entries",
        "truncate table checkpoints",
        "ALTER TABLE entries DISABLE TRIGGER USER",
        "SET session_replication_role = replica",
        "DROP FUNCTION refuse_change",
    ):
        assert FORBIDDEN.search(sql), sql
    for sql in (
        "INSERT INTO entries (seq) VALUES (?)",
        "SELECT seq FROM entries",
        "CREATE TRIGGER t BEFORE UPDATE ON entries BEGIN SELECT RAISE(ABORT, 'no'); END",
        "DELETE FROM user_keys WHERE tenant = ? AND user_id = ?",  # keys, not entries
        "UPDATE head SET seq = %s, hash = %s WHERE id = 1",  # the lock row moves on
        "SELECT seq FROM head WHERE id = 1 FOR UPDATE",
        "CREATE TRIGGER t BEFORE TRUNCATE ON entries FOR EACH STATEMENT EXECUTE FUNCTION f()",
        "INSERT INTO checkpoints (size) VALUES (%s) ON CONFLICT (size) DO NOTHING",
    ):
        assert not FORBIDDEN.search(sql), sql


def test_no_code_updates_or_deletes_log_entries() -> None:
    assert len(SOURCES) > 10 and all(p.exists() for p in SOURCES), SOURCES
    offenders = [
        f"{path.relative_to(ROOT)}: {text.strip()[:80]!r}"
        for path in SOURCES
        for text in _strings(path)
        if FORBIDDEN.search(text)
    ]
    assert not offenders, "\n".join(offenders)


def test_the_only_write_to_the_log_is_a_plain_insert() -> None:
    for table in ("entries", "checkpoints"):
        writes = [
            text
            for path in SOURCES
            for text in _strings(path)
            if re.search(rf"\bINTO\s+{table}\b", text, re.IGNORECASE)
        ]
        assert writes and all(re.match(rf"\s*INSERT INTO {table}\b", w) for w in writes), writes
