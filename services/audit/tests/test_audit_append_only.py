"""No code path can update or delete a log entry: checked on the source, so it stays true.

(The database refuses it too, by trigger: see test_audit_log. This test keeps anyone from
adding such SQL in the first place, including by dropping the triggers.)
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
FORBIDDEN = re.compile(
    r"\bUPDATE\s+(OR\s+\w+\s+)?entries\b"
    r"|\bDELETE\s+FROM\s+entries\b"
    r"|\b(INSERT\s+OR\s+\w+|REPLACE)\s+INTO\s+entries\b"
    r"|\bON\s+CONFLICT\b[^;]*\bDO\s+UPDATE\b"
    r"|\bDROP\s+(TABLE|TRIGGER|INDEX)\b"
    r"|\bALTER\s+TABLE\s+entries\b",
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
    ):
        assert FORBIDDEN.search(sql), sql
    for sql in (
        "INSERT INTO entries (seq) VALUES (?)",
        "SELECT seq FROM entries",
        "CREATE TRIGGER t BEFORE UPDATE ON entries BEGIN SELECT RAISE(ABORT, 'no'); END",
        "DELETE FROM user_keys WHERE tenant = ? AND user_id = ?",  # keys, not entries
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
    writes = [
        text
        for path in SOURCES
        for text in _strings(path)
        if re.search(r"\bINTO\s+entries\b", text, re.IGNORECASE)
    ]
    assert writes and all(re.match(r"\s*INSERT INTO entries\b", w) for w in writes), writes
