"""hippo-client: the Python SDK for Hippo's Memory API (`hippo.memory.v1`).

    from hippo_client import Client

    with Client("127.0.0.1:50051", "hippo-local-dev-key") as hippo:
        hippo.remember("alice", "s1", [("user", "I moved to Lisbon in May")])
        for hit in hippo.recall("alice", "where does she live?"):
            print(hit.fused_score, hit.memory.text)

`AsyncClient` has the same methods as coroutines. Results are frozen dataclasses
(`types`), failures `HippoError`s (`errors`); docs/api.md documents every call.
"""

from hippo_client._version import __version__
from hippo_client.aio import AsyncChatStream, AsyncClient
from hippo_client.client import ChatStream, Client
from hippo_client.errors import (
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    HippoError,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    Unauthenticated,
    Unavailable,
    Unimplemented,
)
from hippo_client.retry import RetryPolicy
from hippo_client.transport import TlsConfig
from hippo_client.types import (
    AppliedInfluence,
    AuditEntry,
    AuditVerification,
    ChatEnd,
    ChatMessage,
    ChatStart,
    Context,
    ContextZone,
    ExportedSession,
    ExportFooter,
    ExportHeader,
    ForgetResult,
    Hit,
    ImportResult,
    Memory,
    MetadataUpdate,
    Page,
    RecallResult,
    RememberResult,
    Session,
    SessionInfo,
    TokenCounts,
    Turn,
    UserInfo,
)

__all__ = [
    "AppliedInfluence",
    "AsyncChatStream",
    "AsyncClient",
    "AuditEntry",
    "AuditVerification",
    "Cancelled",
    "ChatEnd",
    "ChatMessage",
    "ChatStart",
    "ChatStream",
    "Client",
    "Context",
    "ContextZone",
    "DeadlineExceeded",
    "ExportFooter",
    "ExportHeader",
    "ExportedSession",
    "FailedPrecondition",
    "ForgetResult",
    "HippoError",
    "Hit",
    "ImportResult",
    "Internal",
    "InvalidArgument",
    "Memory",
    "MetadataUpdate",
    "NotFound",
    "Page",
    "PermissionDenied",
    "RecallResult",
    "RememberResult",
    "ResourceExhausted",
    "RetryPolicy",
    "Session",
    "SessionInfo",
    "TlsConfig",
    "TokenCounts",
    "Turn",
    "Unauthenticated",
    "Unavailable",
    "Unimplemented",
    "UserInfo",
    "__version__",
]
