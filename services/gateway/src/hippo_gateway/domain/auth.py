"""API keys -> callers: a tenant, roles, and the RPCs those roles allow.

The tenant comes from the key and only from the key. Keys are held as SHA-256 digests, so
a settings dump or a heap snapshot does not reveal them and an operator may configure
digests (`sha256:<hex>`) instead of keys at all.

Roles (docs/security.md): `read` (Recall, BuildContext, GetSession, ListMemories,
GetMemory, ListSessions, ListUsers, ExportUser), `write` (Remember, ImportTurns,
UpdateMemoryMetadata, ReportOutcome), `erase` (Forget), `audit-read` (ListAuditEntries,
VerifyAudit of the caller's tenant) and `admin` (everything, and VerifyAudit of the whole
log). Chat reads and stores turns, so it needs both read and write. A key configured
without roles is an application key: read, write, erase (audit bodies are not an
application's to read).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from hippo_core.errors import PermissionDenied, Unauthenticated
from hippo_gateway import metrics

_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
_TENANT = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")
HINT = "send `authorization: Bearer <key>` or `x-api-key: <key>` in the request metadata"

ROLES = ("read", "write", "erase", "audit-read", "admin")
DEFAULT_ROLES = ("read", "write", "erase")
# What each public RPC needs (all of them). A new RPC without an entry is refused to every
# key but admin's, so forgetting to list one fails closed.
REQUIRED: Mapping[str, tuple[str, ...]] = {
    "Remember": ("write",),
    "Recall": ("read",),
    "Forget": ("erase",),
    "BuildContext": ("read",),
    "Chat": ("read", "write"),
    "GetSession": ("read",),
    "ListMemories": ("read",),
    "GetMemory": ("read",),
    "ListSessions": ("read",),
    "ListUsers": ("read",),
    "UpdateMemoryMetadata": ("write",),
    "ExportUser": ("read",),
    "ImportTurns": ("write",),
    "VerifyAudit": ("audit-read",),
    "ListAuditEntries": ("audit-read",),
    "ReportOutcome": ("write",),
}


@dataclass(frozen=True)
class KeyGrant:
    """What one API key may do: its tenant and roles."""

    tenant: str
    roles: tuple[str, ...] = DEFAULT_ROLES


@dataclass(frozen=True)
class Caller:
    """An authenticated, authorised caller of one RPC."""

    tenant: str
    roles: frozenset[str]

    @property
    def admin(self) -> bool:
        return "admin" in self.roles


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def _grant(tenant_or_grant: str | KeyGrant) -> KeyGrant:
    grant = KeyGrant(tenant_or_grant) if isinstance(tenant_or_grant, str) else tenant_or_grant
    if not _TENANT.match(grant.tenant):
        raise ValueError(f"api_keys: tenant {grant.tenant!r} is not 1..128 of [A-Za-z0-9._:@-]")
    unknown = sorted(set(grant.roles) - set(ROLES))
    if unknown:
        raise ValueError(f"api_keys: unknown roles {unknown} (known: {', '.join(ROLES)})")
    if not grant.roles:
        raise ValueError(f"api_keys: a key of tenant {grant.tenant!r} has no roles")
    return grant


class Authenticator:
    def __init__(self, keys: Mapping[str, str | KeyGrant]) -> None:
        """`keys`: API key (or `sha256:<hex digest>` of one) -> tenant, or a KeyGrant."""
        self._grants: dict[str, KeyGrant] = {}
        for key, grant in keys.items():
            if not key:
                raise ValueError("api_keys: an API key is empty")
            m = _DIGEST.match(key)
            self._grants[m.group(1) if m else digest(key)] = _grant(grant)

    def __len__(self) -> int:
        return len(self._grants)

    def caller(self, metadata: Iterable[tuple[str, str | bytes]], rpc: str) -> Caller:
        """The caller of `rpc`: Unauthenticated without one valid key, PermissionDenied
        when the key's roles do not allow the RPC."""
        grant = self._grant(metadata)
        roles = frozenset(grant.roles)
        if "admin" not in roles:
            needed = REQUIRED.get(rpc, ("admin",))
            missing = [role for role in needed if role not in roles]
            if missing:
                metrics.AUTH_FAILURES.inc()
                raise PermissionDenied(
                    f"{rpc} needs the role(s) {', '.join(needed)}; this API key has "
                    f"{', '.join(sorted(roles))}",
                    reason="MISSING_ROLE",
                )
        return Caller(grant.tenant, roles)

    def _grant(self, metadata: Iterable[tuple[str, str | bytes]]) -> KeyGrant:
        keys = _credentials(metadata)
        if len(keys) > 1:
            # Which one wins would depend on header order through proxies: refuse instead.
            metrics.AUTH_FAILURES.inc()
            raise Unauthenticated(
                f"{len(keys)} credentials in one request: send exactly one ({HINT})",
                reason="AMBIGUOUS_CREDENTIALS",
            )
        key = keys[0] if keys else ""
        grant = self._grants.get(digest(key)) if key else None
        if grant is None:
            metrics.AUTH_FAILURES.inc()
            if not key:
                raise Unauthenticated(f"missing API key: {HINT}", reason="MISSING_API_KEY")
            raise Unauthenticated("unknown API key", reason="UNKNOWN_API_KEY")
        return grant


def _credentials(metadata: Iterable[tuple[str, str | bytes]]) -> Sequence[str]:
    """Every credential the metadata carries (x-api-key values and bearer tokens)."""
    keys: list[str] = []
    for name, value in metadata:
        if isinstance(value, bytes):
            continue
        if name == "x-api-key":
            keys.append(value.strip())
        elif name == "authorization":
            scheme, _, token = value.strip().partition(" ")
            if scheme.lower() != "bearer" or not token.strip():
                metrics.AUTH_FAILURES.inc()
                raise Unauthenticated(f"malformed authorization header: {HINT}")
            keys.append(token.strip())
    return keys
