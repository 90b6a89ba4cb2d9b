"""Validation before any write: every limit an internal service enforces is checked by the
gateway first, naming the public field, so a refused request leaves every store as it
was (the turn store, the indexes and the audit log: Recall and ListAuditEntries find
nothing of it afterwards). And the refusals the fuzzer found: seqs beyond int64, top_k
outside 0..100 reported as sent, queries and turns made only of invisible characters."""

from __future__ import annotations

import asyncio
import base64
import hashlib
import json
import uuid
from collections.abc import Sequence
from pathlib import Path

import grpc
import pytest
from gateway_harness import FakeLog, key_of

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_core import outbox
from hippo_core.errors import FailedPrecondition
from hippo_gateway.adapters import spool, spool_store
from hippo_gateway.domain.audit_events import AuditEvent
from hippo_gateway.domain.audit_recorder import AuditRecorder
from hippo_gateway.domain.validation import is_blank

ACME = key_of("acme")
INVISIBLE = [
    *("\u200b", "\ufeff", "\u200b\ufeff\u200b", "\u200e\u202e\u2066"),
    *("\u3164", "\u00a0\u2009\u3000", "\x01\x1f"),
]


def uid(prefix: str = "u") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


def turn(text: str, **extra: object) -> memory_pb2.Turn:
    return memory_pb2.Turn(role=memory_pb2.ROLE_USER, text=text, **extra)  # type: ignore[arg-type]


def refused(call: object, request: object, field: str) -> str:
    with pytest.raises(grpc.RpcError) as err:
        call(request, metadata=ACME, timeout=10)  # type: ignore[operator]
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT, err.value.details()
    details: str = err.value.details()
    assert details.startswith(f"{field}: "), details
    return details


def nothing_stored(stub: memory_pb2_grpc.MemoryServiceStub, user: str, word: str) -> None:
    """A valid write after the refusal, waited on until searchable, is the only thing the
    user has: the refused turns reached neither the turn store nor the audit log."""
    barrier = memory_pb2.RememberRequest(
        scope=memory_pb2.Scope(user_id=user, session_id="s1"),
        turns=[turn("the barrier turn")],
        wait_searchable=True,
    )
    stub.Remember(barrier, metadata=ACME, timeout=10)
    found = stub.Recall(
        memory_pb2.RecallRequest(
            scope=memory_pb2.Scope(user_id=user), query=word, mode=memory_pb2.RECALL_MODE_LEXICAL
        ),
        metadata=ACME,
        timeout=10,
    )
    assert [h.memory.text for h in found.hits if word in h.memory.text] == []
    entries = stub.ListAuditEntries(
        memory_pb2.ListAuditEntriesRequest(scope=memory_pb2.Scope(user_id=user)),
        metadata=ACME,
        timeout=10,
    ).entries
    remembered = [e for e in entries if e.event_type == "remember"]
    assert len(remembered) == 1 and len(remembered[0].memory_ids) == 1  # the barrier only


def remember(user: str, turns: Sequence[memory_pb2.Turn]) -> memory_pb2.RememberRequest:
    return memory_pb2.RememberRequest(
        scope=memory_pb2.Scope(user_id=user, session_id="s1"), turns=turns, wait_searchable=True
    )


def test_a_turn_dated_before_1970_is_refused_before_anything_is_written(
    stub: memory_pb2_grpc.MemoryServiceStub,
) -> None:
    """The summariser counts time from the epoch and refused such a turn after the turn
    store had committed it (naming the internal `time_us`); the gateway now refuses the
    whole request first, naming `turns[1].time`, and the valid turn before it is not
    stored either."""
    user, word = uid(), uid("zebra")
    old = turn(f"{word} second")
    old.time.FromSeconds(-1)
    details = refused(stub.Remember, remember(user, [turn(f"{word} first"), old]), "turns[1].time")
    assert "1970-01-01T00:00:00Z or later" in details and "time_us" not in details
    nothing_stored(stub, user, word)


def test_the_epoch_itself_and_year_9999_are_stored(stub: memory_pb2_grpc.MemoryServiceStub) -> None:
    """The bounds are inclusive; the last microsecond of 9999 no longer overflows the
    date formatting of the lexical document (a float rounding to year 10000)."""
    user, word = uid(), uid("epoch")
    first, last = turn(f"{word} one"), turn(f"{word} two")
    first.time.FromSeconds(0)
    last.time.FromMicroseconds(253_402_300_799_999_999)
    stub.Remember(remember(user, [first, last]), metadata=ACME, timeout=10)
    found = stub.Recall(
        memory_pb2.RecallRequest(
            scope=memory_pb2.Scope(user_id=user), query=word, mode=memory_pb2.RECALL_MODE_LEXICAL
        ),
        metadata=ACME,
        timeout=10,
    )
    times = sorted(h.memory.time.ToMicroseconds() for h in found.hits)
    assert times == [0, 253_402_300_799_999_999]


def test_a_speaker_longer_than_the_session_window_keeps_is_refused_first(
    stub: memory_pb2_grpc.MemoryServiceStub,
) -> None:
    """The summariser keeps at most 256 characters of `speaker`: checked at the gateway."""
    user, word = uid(), uid("speaker")
    long = turn(f"{word} said", metadata={"speaker": "x" * 257})
    details = refused(stub.Remember, remember(user, [long]), "turns[0].metadata[speaker]")
    assert "at most 256 characters, got 257" in details
    nothing_stored(stub, user, word)
    fits = turn(f"{word} fits", metadata={"speaker": "y" * 256})
    assert stub.Remember(remember(user, [fits]), metadata=ACME, timeout=10).created == 1


@pytest.mark.parametrize("blank", INVISIBLE)
def test_invisible_only_text_is_blank_everywhere(
    stub: memory_pb2_grpc.MemoryServiceStub, blank: str
) -> None:
    """Zero-width spaces, BOMs, bidi marks, fillers and controls show nothing: a query,
    a turn or a required note made of them is refused as blank."""
    user = uid()
    scope = memory_pb2.Scope(user_id=user)
    refused(stub.Recall, memory_pb2.RecallRequest(scope=scope, query=blank), "query")
    session = memory_pb2.Scope(user_id=user, session_id="s1")
    refused(stub.BuildContext, memory_pb2.BuildContextRequest(scope=session, query=blank), "query")
    refused(stub.Remember, remember(user, [turn(blank)]), "turns[0].text")
    note = memory_pb2.ReportOutcomeRequest(
        scope=scope, audit_seq=1, kind=memory_pb2.OUTCOME_KIND_NOTE, note=blank
    )
    refused(stub.ReportOutcome, note, "note")


def test_visible_text_with_invisible_characters_is_not_blank() -> None:
    assert not is_blank("a\u200b") and not is_blank("\u200b\u05d0") and not is_blank("é")
    assert all(is_blank(b) for b in INVISIBLE) and is_blank("")


@pytest.mark.parametrize("top_k", [-1, -(2**31), 101, 2**31 - 1])
def test_build_context_refuses_top_k_outside_the_documented_range_as_sent(
    stub: memory_pb2_grpc.MemoryServiceStub, top_k: int
) -> None:
    """1..100, 0 = default: anything else is refused, the message reporting the value
    sent (not the value with the window over-fetch added)."""
    request = memory_pb2.BuildContextRequest(
        scope=memory_pb2.Scope(user_id=uid(), session_id="s1"), query="what", top_k=top_k
    )
    details = refused(stub.BuildContext, request, "top_k")
    assert details.endswith(f"got {top_k}")


@pytest.mark.parametrize("seq", [2**63, 2**64 - 1])
def test_seqs_beyond_int64_are_invalid_not_internal(
    stub: memory_pb2_grpc.MemoryServiceStub, seq: int
) -> None:
    """ReportOutcome's audit_seq (an OverflowError in the audit store, INTERNAL, before)
    and VerifyAudit's range name the field and the limit; nothing is appended."""
    user = uid()
    scope = memory_pb2.Scope(user_id=user)
    report = memory_pb2.ReportOutcomeRequest(
        scope=scope, audit_seq=seq, kind=memory_pb2.OUTCOME_KIND_ACCEPTED
    )
    details = refused(stub.ReportOutcome, report, "audit_seq")
    assert f"at most {2**63 - 1}" in details
    refused(stub.VerifyAudit, memory_pb2.VerifyAuditRequest(from_seq=seq), "from_seq")
    refused(stub.VerifyAudit, memory_pb2.VerifyAuditRequest(to_seq=seq), "to_seq")
    entries = stub.ListAuditEntries(
        memory_pb2.ListAuditEntriesRequest(scope=scope), metadata=ACME, timeout=10
    ).entries
    assert [e for e in entries if e.event_type == "outcome"] == []


def test_a_forged_page_token_beyond_int64_is_refused(
    stub: memory_pb2_grpc.MemoryServiceStub,
) -> None:
    """A token is base64 JSON: one carrying after_seq 2^63 is not a token we issued."""
    user = uid()
    scope_digest = hashlib.sha256("\x1f".join(("acme", user, "")).encode()).hexdigest()[:16]
    raw = json.dumps({"a": 2**63, "s": scope_digest}, separators=(",", ":")).encode()
    token = "v1." + base64.urlsafe_b64encode(raw).decode().rstrip("=")
    request = memory_pb2.ListAuditEntriesRequest(
        scope=memory_pb2.Scope(user_id=user), page_token=token
    )
    refused(stub.ListAuditEntries, request, "page_token")


def test_forget_refuses_a_nul_in_a_memory_id(stub: memory_pb2_grpc.MemoryServiceStub) -> None:
    request = memory_pb2.ForgetRequest(
        memory_ids=memory_pb2.MemoryIds(
            scope=memory_pb2.Scope(user_id=uid()), memory_ids=["ok", "bad\x00id"]
        )
    )
    refused(stub.Forget, request, "memory_ids.memory_ids[1]")


class SealedLog(FakeLog):
    """An audit service whose start found the log tampered with: every write is
    FAILED_PRECONDITION until `sealed` is lifted (an operator restored the log)."""

    def __init__(self) -> None:
        super().__init__()
        self.sealed = True

    async def append(self, events: Sequence[AuditEvent]) -> list[int]:  # type: ignore[override]
        if self.sealed:
            raise FailedPrecondition("the audit log failed its check", reason="LOG_CHAIN_BROKEN")
        return await super().append(events)


async def test_events_stay_spooled_while_the_audit_log_refuses_writes(tmp_path: Path) -> None:
    """FAILED_PRECONDITION is not a refusal of the event (that would bury it): the spool
    keeps every event, in order, and delivers them once the log takes writes again."""
    log = SealedLog()
    store = spool_store.sqlite_store(tmp_path)
    fast = outbox.DrainConfig(retry_min_seconds=0.01, retry_max_seconds=0.05, poll_seconds=0.05)
    recorder = AuditRecorder(log, spool.opener(store, fast), b"k" * 32)
    await recorder.start()
    try:
        for n in range(5):
            await recorder.record(AuditEvent("acme", "recall", "alice", "s1", (f"m{n}",)))
        await asyncio.sleep(0.5)  # many delivery attempts, every one refused
        assert log.entries == [] and store.depth()[:2] == (5, 0)  # kept, none buried
        log.sealed = False
        end = asyncio.get_running_loop().time() + 15
        while len(log.entries) < 5:
            assert asyncio.get_running_loop().time() < end, "not delivered after the seal"
            await asyncio.sleep(0.02)
        assert [e.memory_ids for e in log.entries] == [(f"m{n}",) for n in range(5)]
    finally:
        await recorder.close()
