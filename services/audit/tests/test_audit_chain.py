"""The hash chain's pure parts: canonical JSON, the encoding, and row verification."""

from __future__ import annotations

import hashlib
import math

import pytest

from hippo_audit.domain import chain
from hippo_audit.domain.chain import GENESIS, canonical_json, encode, entry_hash, verify_rows
from hippo_audit.domain.models import Entry


def _entry(seq: int, prev: bytes, **changes: object) -> Entry:
    fields: dict[str, object] = {
        "seq": seq,
        "time_us": 1_700_000_000_000_000 + seq,
        "tenant": "acme",
        "actor": "gateway",
        "event_type": "recall",
        "user": "alice",
        "session": "s1",
        "memory_ids": ("m1", "m2"),
        "body": canonical_json({"n": seq}),
        "sealed": b"",
        "key_id": 0,
        "idempotency_key": "",
        "prev_hash": prev,
        "hash": b"",
    }
    fields.update(changes)
    draft = Entry(**fields)  # type: ignore[arg-type]
    return Entry(**{**fields, "hash": entry_hash(prev, draft)})  # type: ignore[arg-type]


def _chain(n: int) -> list[Entry]:
    out, prev = [], GENESIS
    for seq in range(1, n + 1):
        out.append(_entry(seq, prev))
        prev = out[-1].hash
    return out


def _row(e: Entry) -> tuple[object, ...]:
    ids = chain.ID_SEPARATOR.join(e.memory_ids)
    texts = (e.tenant, e.actor, e.event_type, e.user, e.session, ids, e.body)
    return (
        e.seq,
        e.time_us,
        e.key_id,
        *(t.encode() for t in texts),
        e.sealed,
        e.idempotency_key.encode(),
        e.prev_hash,
        e.hash,
    )


def test_genesis_is_a_published_constant() -> None:
    """Anyone can recompute the value that entry 1 links to."""
    assert hashlib.sha256(b"hippo.audit.v1 genesis").digest() == GENESIS


def test_canonical_json_is_one_text_per_value() -> None:
    assert canonical_json({"b": 1.0, "a": [2.5, 3.0, {"z": True, "y": None}]}) == (
        '{"a":[2.5,3,{"y":null,"z":true}],"b":1}'
    )
    assert canonical_json({"x": "é"}) == '{"x":"é"}'  # UTF-8, not \\u escapes
    assert canonical_json({"big": 2.0**60}) == '{"big":1.152921504606847e+18}'
    with pytest.raises(ValueError, match="finite"):
        canonical_json({"x": math.inf})
    with pytest.raises(ValueError, match="unsupported"):
        canonical_json({"x": object()})


def test_the_encoding_is_unambiguous() -> None:
    """Moving bytes between adjacent fields changes the encoding (lengths are encoded)."""
    a = _entry(1, GENESIS, user="ab", session="c")
    b = _entry(1, GENESIS, user="a", session="bc")
    assert encode(a) != encode(b) and a.hash != b.hash
    c = _entry(1, GENESIS, memory_ids=("m1", "m2"))
    d = _entry(1, GENESIS, memory_ids=("m1\x1fm2",))
    assert encode(c) == encode(d), "ids may not hold control characters: validation refuses it"


def test_a_valid_chain_verifies() -> None:
    entries = _chain(20)
    scan = verify_rows((_row(e) for e in entries), 1, GENESIS)
    assert scan.problem is None and scan.checked == 20 and scan.last_hash == entries[-1].hash


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"body": '{"n":99}'}, "hash mismatch"),
        ({"user": "mallory"}, "hash mismatch"),
        ({"time_us": 5}, "hash mismatch"),
        ({"hash": b"\x00" * 32}, "hash mismatch"),
        ({"prev_hash": b"\x01" * 32}, "broken link"),
        ({"tenant": 42}, "malformed"),
    ],
)
def test_each_kind_of_edit_is_found_at_its_entry(change: dict[str, object], reason: str) -> None:
    entries = _chain(10)
    rows = [_row(e) for e in entries]
    if "tenant" in change:  # a stored value of the wrong type (an int in a text column)
        rows[6] = (*rows[6][:3], change["tenant"], *rows[6][4:])
    else:
        rows[6] = _row(Entry(**{**entries[6].__dict__, **change}))  # type: ignore[arg-type]
    scan = verify_rows(rows, 1, GENESIS)
    assert scan.problem is not None and scan.problem.seq == 7, scan
    assert scan.problem.reason.startswith(reason), scan.problem


def test_a_missing_entry_is_named() -> None:
    rows = [_row(e) for e in _chain(10)]
    del rows[3]
    scan = verify_rows(rows, 1, GENESIS)
    assert scan.problem is not None and scan.problem.seq == 4
    assert scan.problem.reason.startswith("entry missing")
