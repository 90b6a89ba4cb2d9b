"""The audit reads of the public API: VerifyAudit, ListAuditEntries (with page tokens bound
to their scope) and ReportOutcome, always inside the caller's tenant."""

from __future__ import annotations

import base64
import binascii
import hashlib
import hmac
import json
from dataclasses import dataclass

from hippo_core import limits
from hippo_core.errors import InvalidArgument, NotFound
from hippo_gateway.domain import validation
from hippo_gateway.domain.audit_events import AuditRecord, Verification, outcome_event
from hippo_gateway.domain.audit_recorder import AuditRecorder
from hippo_gateway.domain.ports import AuditLog

MAX_NOTE_BYTES = 4 * 1024
MAX_PAGE = 1000
DEFAULT_PAGE = 100
OUTCOMES = ("accepted", "rejected", "corrected", "note")


@dataclass(frozen=True)
class Outcome:
    scope_user: str
    scope_session: str
    audit_seq: int
    kind: str  # one of OUTCOMES
    note: str = ""


class AuditTrail:
    """VerifyAudit, ListAuditEntries and ReportOutcome, inside the caller's tenant."""

    def __init__(self, log: AuditLog, recorder: AuditRecorder) -> None:
        self._log, self._recorder = log, recorder

    async def verify(self, from_seq: int, to_seq: int, tenant: str | None) -> Verification:
        """The whole log's verdict for an admin (`tenant` None); for anyone else the
        same check, reported for the caller's tenant only: how many of its entries were
        verified and its last one. The log's size, head and where another tenant's entry
        broke stay hidden (the chain is one for all tenants, so `ok` covers them all)."""
        validation.check_seq("from_seq", from_seq)
        validation.check_seq("to_seq", to_seq)
        if from_seq and to_seq and from_seq > to_seq:
            raise InvalidArgument("from_seq", f"{from_seq} exceeds to_seq {to_seq}")
        if tenant is None:
            return await self._log.verify(from_seq, to_seq)
        v = await self._log.verify(from_seq, to_seq, tenant)
        reason = "" if v.ok else "the audit log failed verification; an admin key shows where"
        return Verification(
            ok=v.ok,
            entries_checked=v.tenant_entries,
            first_bad_seq=0,
            reason=reason,
            head_seq=v.tenant_head_seq,
            head_hash=v.tenant_head_hash,
        )

    async def entries(
        self, tenant: str, user: str, session: str, page_size: int, page_token: str
    ) -> tuple[list[AuditRecord], str]:
        validation.check_id("scope.user_id", user)
        if session:
            validation.check_id("scope.session_id", session)
        size = page_size or DEFAULT_PAGE
        if not 1 <= size <= MAX_PAGE:
            raise InvalidArgument(
                "page_size", f"must be 0 (default {DEFAULT_PAGE}) or 1..{MAX_PAGE}, got {size}"
            )
        scope = _scope_digest(tenant, user, session)
        after = _read_token(page_token, scope) if page_token else 0
        records, next_after = await self._log.read(tenant, user, session, after, 0, size)
        return records, _token(next_after, scope) if next_after else ""

    async def report(self, tenant: str, outcome: Outcome) -> int:
        validation.check_id("scope.user_id", outcome.scope_user)
        if outcome.scope_session:
            validation.check_id("scope.session_id", outcome.scope_session)
        if outcome.audit_seq <= 0:
            raise InvalidArgument("audit_seq", "is required (> 0)")
        validation.check_seq("audit_seq", outcome.audit_seq)
        if outcome.kind not in OUTCOMES:
            raise InvalidArgument("kind", "must be one of OUTCOME_KIND_ACCEPTED..NOTE")
        size = len(outcome.note.encode("utf-8", "surrogatepass"))
        if size > MAX_NOTE_BYTES:
            raise InvalidArgument("note", f"{size} bytes exceeds the limit of {MAX_NOTE_BYTES}")
        if outcome.kind in ("corrected", "note") and limits.is_blank(outcome.note):
            raise InvalidArgument("note", f"is required for OUTCOME_KIND_{outcome.kind.upper()}")
        found, _ = await self._log.read(
            tenant,
            outcome.scope_user,
            outcome.scope_session,
            outcome.audit_seq - 1,
            outcome.audit_seq,
            1,
        )
        if not found:
            raise NotFound(
                f"audit_seq: no audit entry {outcome.audit_seq} for this user"
                + (" and session" if outcome.scope_session else ""),
                reason="AUDIT_ENTRY_NOT_FOUND",
            )
        event = outcome_event(tenant, found[0], outcome.kind, outcome.note)
        return await self._recorder.record_now(event)


def _scope_digest(tenant: str, user: str, session: str) -> str:
    return hashlib.sha256("\x1f".join((tenant, user, session)).encode()).hexdigest()[:16]


def _token(after_seq: int, scope: str) -> str:
    raw = json.dumps({"a": after_seq, "s": scope}, separators=(",", ":")).encode()
    return "v1." + base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _read_token(token: str, scope: str) -> int:
    """The after_seq a page token carries; it must have been issued for this scope."""
    try:
        version, _, data = token.partition(".")
        raw = json.loads(base64.urlsafe_b64decode(data + "=" * (-len(data) % 4)))
        after, issued_for = int(raw["a"]), str(raw["s"])
        if version != "v1" or not 0 <= after <= validation.MAX_SEQ:
            raise ValueError(version)
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        raise InvalidArgument("page_token", "is not a token this service issued") from exc
    if not hmac.compare_digest(issued_for, scope):
        raise InvalidArgument(
            "page_token", "was issued for another scope (use it with the same scope)"
        )
    return after
