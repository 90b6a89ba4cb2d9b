"""Deterministic memory ids, so a retried write has exactly one effect.

A turn with a client id gets uuid5(tenant, user, session, client id); without one, a
request's idempotency key and the turn's position stand in. Neither: a random id (the
write is then not idempotent, which the API documents).
"""

from __future__ import annotations

import uuid

_NAMESPACE = uuid.UUID("6f1c2a52-93c4-4b8e-9a57-0d1b6c9e4f10")  # fixed forever: ids depend on it


def memory_id(
    tenant: str,
    user: str,
    session: str,
    *,
    client_id: str = "",
    idempotency_key: str = "",
    position: int = 0,
) -> str:
    if client_id:
        name = f"c\x1f{tenant}\x1f{user}\x1f{session}\x1f{client_id}"
    elif idempotency_key:
        name = f"k\x1f{tenant}\x1f{user}\x1f{session}\x1f{idempotency_key}\x1f{position}"
    else:
        return str(uuid.uuid4())
    return str(uuid.uuid5(_NAMESPACE, name))
