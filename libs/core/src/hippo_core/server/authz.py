"""Which Hippo service may call which RPC: one interceptor, one table per service.

With TLS on, an internal service's server requires a client certificate from the CA,
and this interceptor admits a call only if the certificate's identity (its URI SAN
spiffe://hippo/<name>, see hippo_core.tls) is listed for the method. A method missing
from the table is refused: a new RPC is closed until someone says who may call it.
Health and reflection stay open to any verified caller (probes, `hippo health`).
Refusals are PermissionDenied, mapped by ErrorInterceptor (this one sits inside it).

With TLS off there are no identities and the interceptor is not installed: only the
network (the chart's NetworkPolicy, loopback for `make run`) protects the services.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Collection, Mapping
from typing import Any

import grpc

from hippo_core import tls
from hippo_core.errors import PermissionDenied
from hippo_core.server.handlers import Streaming, Unary, rewrap
from hippo_core.server.interceptors import EXEMPT, Continuation

# The operator's identity: the `hippo` CLI with an operator certificate (audit verify,
# reindex, memtok settings, seeding).
OPERATOR = "operator"

Callers = Mapping[str, frozenset[str]]


def callers(full_name: str, table: Mapping[str, Collection[str]]) -> Callers:
    """`{"/<full_name>/<Method>": identities}` from `{"Method": identities}`."""
    return {f"/{full_name}/{method}": frozenset(who) for method, who in table.items()}


class CallerInterceptor(grpc.aio.ServerInterceptor):
    """PERMISSION_DENIED unless the verified caller is allowed to call the method."""

    def __init__(self, allowed: Callers) -> None:
        self._allowed = allowed

    async def intercept_service(
        self, continuation: Continuation, details: grpc.HandlerCallDetails
    ) -> grpc.RpcMethodHandler | None:
        handler = await continuation(details)
        if handler is None or details.method.startswith(EXEMPT):
            return handler
        method = details.method
        allowed = self._allowed.get(method, frozenset())

        def admit(context: grpc.aio.ServicerContext) -> None:
            who = tls.identity(context.auth_context())
            if who is None or who not in allowed:
                caller = who or "a caller without a Hippo identity"
                raise PermissionDenied(
                    f"{caller} may not call {method}", reason="CALLER_NOT_ALLOWED"
                )

        def unary(behavior: Unary) -> Unary:
            async def call(request: Any, context: grpc.aio.ServicerContext) -> Any:
                admit(context)
                return await behavior(request, context)

            return call

        def streaming(behavior: Streaming) -> Streaming:
            async def call(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
                admit(context)
                async for item in behavior(request, context):
                    yield item

            return call

        return rewrap(handler, unary, streaming)
