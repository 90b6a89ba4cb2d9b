"""Errors that carry their status code, raised by domain code, mapped in one interceptor.

Domain code must not import grpc, so the codes are named here and translated to
`grpc.StatusCode` by `hippo_core.server.interceptors`. Messages are for callers: they
name the field and the limit, never internals.
"""

from __future__ import annotations

import enum


class Code(enum.Enum):
    """The gRPC status codes domain code may raise (names equal `grpc.StatusCode`'s)."""

    INVALID_ARGUMENT = "INVALID_ARGUMENT"
    NOT_FOUND = "NOT_FOUND"
    ALREADY_EXISTS = "ALREADY_EXISTS"
    FAILED_PRECONDITION = "FAILED_PRECONDITION"
    ABORTED = "ABORTED"
    RESOURCE_EXHAUSTED = "RESOURCE_EXHAUSTED"
    UNAUTHENTICATED = "UNAUTHENTICATED"
    PERMISSION_DENIED = "PERMISSION_DENIED"
    UNAVAILABLE = "UNAVAILABLE"
    DEADLINE_EXCEEDED = "DEADLINE_EXCEEDED"
    UNIMPLEMENTED = "UNIMPLEMENTED"
    INTERNAL = "INTERNAL"


class HippoError(Exception):
    """Base of every error a caller may see. `reason` is stable, machine-readable."""

    code: Code = Code.INTERNAL
    reason: str = "INTERNAL"

    def __init__(self, message: str, *, reason: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        if reason is not None:
            self.reason = reason


class InvalidArgument(HippoError):
    """A request field breaks a rule; the message is `<field>: <problem>`."""

    code = Code.INVALID_ARGUMENT
    reason = "INVALID_ARGUMENT"

    def __init__(self, field: str, problem: str, *, reason: str | None = None) -> None:
        super().__init__(f"{field}: {problem}", reason=reason)
        self.field = field
        self.problem = problem


class NotFound(HippoError):
    code = Code.NOT_FOUND
    reason = "NOT_FOUND"


class FailedPrecondition(HippoError):
    code = Code.FAILED_PRECONDITION
    reason = "FAILED_PRECONDITION"


class Aborted(HippoError):
    """A concurrent writer won; the caller may retry the whole operation."""

    code = Code.ABORTED
    reason = "ABORTED"


class ResourceExhausted(HippoError):
    """Overloaded or over quota: the caller should back off, not retry at once.

    `retry_after` (seconds) becomes a google.rpc RetryInfo, so clients know how long to
    wait; `quota` (subject, description) a QuotaFailure naming the quota that was hit.
    A quota that waiting cannot free (stored turns) has no retry_after.
    """

    code = Code.RESOURCE_EXHAUSTED
    reason = "RESOURCE_EXHAUSTED"

    def __init__(
        self,
        message: str,
        *,
        reason: str | None = None,
        retry_after: float | None = 0.1,
        quota: tuple[str, str] | None = None,
    ) -> None:
        super().__init__(message, reason=reason)
        self.retry_after = retry_after
        self.quota = quota


class Unauthenticated(HippoError):
    code = Code.UNAUTHENTICATED
    reason = "UNAUTHENTICATED"


class PermissionDenied(HippoError):
    code = Code.PERMISSION_DENIED
    reason = "PERMISSION_DENIED"


class Unavailable(HippoError):
    """A dependency is down; safe to retry with backoff."""

    code = Code.UNAVAILABLE
    reason = "UNAVAILABLE"


class DeadlineExceeded(HippoError):
    code = Code.DEADLINE_EXCEEDED
    reason = "DEADLINE_EXCEEDED"


class Unimplemented(HippoError):
    """The RPC exists in the contract but this deployment does not serve it (yet)."""

    code = Code.UNIMPLEMENTED
    reason = "UNIMPLEMENTED"


class Internal(HippoError):
    """A fault on our side (e.g. a peer rejected what we sent); the message is generic."""

    code = Code.INTERNAL
    reason = "INTERNAL"
