"""API keys -> tenants. The tenant comes from the key and only from the key.

Keys are held as SHA-256 digests, so a settings dump or a heap snapshot does not reveal
them and an operator may configure digests (`sha256:<hex>`) instead of keys at all.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable, Mapping

from hippo_core.errors import Unauthenticated
from hippo_gateway import metrics

_DIGEST = re.compile(r"^sha256:([0-9a-f]{64})$")
_TENANT = re.compile(r"^[A-Za-z0-9._:@-]{1,128}$")
HINT = "send `authorization: Bearer <key>` or `x-api-key: <key>` in the request metadata"


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


class Authenticator:
    def __init__(self, keys: Mapping[str, str]) -> None:
        """`keys`: API key (or `sha256:<hex digest>` of one) -> tenant."""
        self._tenants: dict[str, str] = {}
        for key, tenant in keys.items():
            if not _TENANT.match(tenant):
                raise ValueError(f"api_keys: tenant {tenant!r} is not 1..128 of [A-Za-z0-9._:@-]")
            if not key:
                raise ValueError("api_keys: an API key is empty")
            m = _DIGEST.match(key)
            self._tenants[m.group(1) if m else digest(key)] = tenant

    def __len__(self) -> int:
        return len(self._tenants)

    def tenant(self, metadata: Iterable[tuple[str, str | bytes]]) -> str:
        """The caller's tenant from gRPC metadata, or Unauthenticated."""
        key = None
        for name, value in metadata:
            if isinstance(value, bytes):
                continue
            if name == "x-api-key":
                key = value.strip()
            elif name == "authorization" and key is None:
                scheme, _, token = value.strip().partition(" ")
                if scheme.lower() != "bearer" or not token.strip():
                    metrics.AUTH_FAILURES.inc()
                    raise Unauthenticated(f"malformed authorization header: {HINT}")
                key = token.strip()
        tenant = self._tenants.get(digest(key)) if key else None
        if tenant is None:
            metrics.AUTH_FAILURES.inc()
            if not key:
                raise Unauthenticated(f"missing API key: {HINT}", reason="MISSING_API_KEY")
            raise Unauthenticated("unknown API key", reason="UNKNOWN_API_KEY")
        return tenant
