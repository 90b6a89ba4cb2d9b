"""One exception hierarchy: every failed call raises a `HippoError`, never a grpc error.

The subclass says the status (`except hippo_client.ResourceExhausted`); the attributes
carry what the gateway put in the status details (google.rpc ErrorInfo, BadRequest,
RetryInfo in `grpc-status-details-bin`). This is the SDK's own small reader: the SDK
ships without hippo-core.
"""

from __future__ import annotations

from typing import Any

from google.protobuf.message import DecodeError
from google.rpc import error_details_pb2, status_pb2

STATUS_DETAILS_KEY = "grpc-status-details-bin"


class HippoError(Exception):
    """A failed call. `code` is the gRPC status name ("INVALID_ARGUMENT"); `reason` the
    gateway's stable reason (ErrorInfo, e.g. "UNKNOWN_API_KEY"); `field` the request
    field at fault (BadRequest, for INVALID_ARGUMENT); `retry_after` the seconds the
    server asked to wait (RetryInfo), None when waiting frees nothing."""

    code = "UNKNOWN"

    def __init__(
        self,
        message: str,
        *,
        code: str | None = None,
        reason: str | None = None,
        field: str | None = None,
        retry_after: float | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        self.reason = reason
        self.field = field
        self.retry_after = retry_after

    def __str__(self) -> str:
        return f"{self.code}: {self.message}"


class InvalidArgument(HippoError):
    code = "INVALID_ARGUMENT"


class Unauthenticated(HippoError):
    code = "UNAUTHENTICATED"


class PermissionDenied(HippoError):
    code = "PERMISSION_DENIED"


class NotFound(HippoError):
    code = "NOT_FOUND"


class FailedPrecondition(HippoError):
    code = "FAILED_PRECONDITION"


class ResourceExhausted(HippoError):
    code = "RESOURCE_EXHAUSTED"


class DeadlineExceeded(HippoError):
    code = "DEADLINE_EXCEEDED"


class Unavailable(HippoError):
    code = "UNAVAILABLE"


class Cancelled(HippoError):
    code = "CANCELLED"


class Unimplemented(HippoError):
    code = "UNIMPLEMENTED"


class Internal(HippoError):
    code = "INTERNAL"


_BY_CODE: dict[str, type[HippoError]] = {
    kind.code: kind
    for kind in (
        InvalidArgument,
        Unauthenticated,
        PermissionDenied,
        NotFound,
        FailedPrecondition,
        ResourceExhausted,
        DeadlineExceeded,
        Unavailable,
        Cancelled,
        Unimplemented,
        Internal,
    )
}


def error(code: str, message: str, **details: Any) -> HippoError:
    """The HippoError subclass for a status name (HippoError itself for the rest)."""
    kind = _BY_CODE.get(code, HippoError)
    return kind(message, code=code, **details)


def _details(trailing: Any) -> tuple[str | None, str | None, float | None]:
    """(reason, field, retry_after) from a status's rich details; Nones when absent or
    unreadable (a proxy may strip or mangle them: the code still tells the story)."""
    raw = next((v for k, v in (trailing or ()) if k == STATUS_DETAILS_KEY), None)
    reason = field = retry_after = None
    if not isinstance(raw, bytes):
        return reason, field, retry_after
    status = status_pb2.Status()
    try:
        status.ParseFromString(raw)
    except DecodeError:
        return reason, field, retry_after
    for detail in status.details:
        if detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            info = error_details_pb2.RetryInfo()
            detail.Unpack(info)
            retry_after = max(0.0, info.retry_delay.ToNanoseconds() / 1e9)
        elif detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            error_info = error_details_pb2.ErrorInfo()
            detail.Unpack(error_info)
            reason = error_info.reason or None
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            if bad.field_violations:
                field = bad.field_violations[0].field or None
    return reason, field, retry_after


def from_rpc(exc: Any) -> HippoError:
    """The HippoError for a failed grpc call (sync `grpc.RpcError` or `AioRpcError`:
    both have code(), details() and trailing_metadata())."""
    code = exc.code()
    name = code.name if code is not None else "UNKNOWN"
    reason, field, retry_after = _details(exc.trailing_metadata())
    message = exc.details() or name.lower().replace("_", " ")
    return error(name, message, reason=reason, field=field, retry_after=retry_after)
