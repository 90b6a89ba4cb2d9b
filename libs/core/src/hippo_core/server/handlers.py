"""Rebuild a grpc method handler around a wrapper, whatever its streaming shape.

Every interceptor here wraps the behaviour the same way: an async function of
(request, context) for unary responses, an async generator for streamed ones. Servicers
that stream with `await context.write(...)` (the stock health Watch does) still work.
"""

from __future__ import annotations

import inspect
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import grpc

Unary = Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]
Streaming = Callable[[Any, grpc.aio.ServicerContext], AsyncIterator[Any]]


def as_stream(behavior: Callable[..., Any]) -> Streaming:
    """A response-streaming behaviour as an async generator, whichever style it uses."""

    async def stream(request: Any, context: grpc.aio.ServicerContext) -> AsyncIterator[Any]:
        result = behavior(request, context)
        if inspect.isasyncgen(result):
            async for item in result:
                yield item
        else:
            await result

    return stream


def rewrap(
    handler: grpc.RpcMethodHandler,
    unary: Callable[[Unary], Unary],
    streaming: Callable[[Streaming], Streaming],
    decode: Callable[[Any], Any] | None = None,
) -> grpc.RpcMethodHandler:
    deserializer = handler.request_deserializer
    if decode is not None:
        deserializer = decode(deserializer)
    out = handler.response_serializer
    if handler.unary_unary:
        return grpc.unary_unary_rpc_method_handler(
            unary(handler.unary_unary), request_deserializer=deserializer, response_serializer=out
        )
    if handler.unary_stream:
        return grpc.unary_stream_rpc_method_handler(
            streaming(as_stream(handler.unary_stream)),
            request_deserializer=deserializer,
            response_serializer=out,
        )
    if handler.stream_unary:
        return grpc.stream_unary_rpc_method_handler(
            unary(handler.stream_unary), request_deserializer=deserializer, response_serializer=out
        )
    return grpc.stream_stream_rpc_method_handler(
        streaming(as_stream(handler.stream_stream)),
        request_deserializer=deserializer,
        response_serializer=out,
    )
