"""`AsyncClient`: the Memory API from asyncio code, with `Client`'s methods as coroutines.

The same `calls.py` requests, results and retry rules as the blocking client; only the
channel (grpc.aio) and the waits (`asyncio.sleep`) differ. The channel is opened on the
first call, inside the running event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

import grpc

from hippo.memory.v1 import memory_pb2 as pb
from hippo.memory.v1 import memory_pb2_grpc as rpc
from hippo_client import calls, convert, errors, transport, types
from hippo_client.retry import Attempts, RetryPolicy
from hippo_client.transport import TlsConfig

R = TypeVar("R")
T = TypeVar("T")


class AsyncChatStream:
    """`ChatStream` for `async for`: yields the reply's text pieces; `start`, `end` and
    `text` as there. Retried only before its first event; `async with` or `cancel()`
    stops it early (then nothing is stored)."""

    def __init__(self, open_call: Callable[[float], Any], attempts: Attempts) -> None:
        self.start: types.ChatStart | None = None
        self.end: types.ChatEnd | None = None
        self._open = open_call
        self._attempts = attempts
        self._call: Any = None
        self._pieces: list[str] = []
        self._events = self._run()

    @property
    def text(self) -> str:
        return "".join(self._pieces)

    def __aiter__(self) -> AsyncChatStream:
        return self

    async def __anext__(self) -> str:
        return await self._events.__anext__()

    async def _run(self) -> AsyncGenerator[str, None]:
        while True:
            self._call = self._open(self._attempts.remaining())
            try:
                async for event in self._call:
                    kind = event.WhichOneof("event")
                    if kind == "start":
                        self.start = convert.chat_start(event.start)
                    elif kind == "token" and event.token.text:
                        self._pieces.append(event.token.text)
                        yield event.token.text
                    elif kind == "end":
                        self.end = convert.chat_end(event.end)
                return
            except grpc.RpcError as exc:
                error = errors.from_rpc(exc)
            if self.start is not None:
                raise error
            await asyncio.sleep(self._attempts.backoff(error))

    def cancel(self) -> None:
        if self._call is not None:
            self._call.cancel()

    async def __aenter__(self) -> AsyncChatStream:
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self.end is None:
            self.cancel()
        await self._events.aclose()


class AsyncClient:
    """`Client` for asyncio: the same arguments, methods and results, awaited. Close it
    with `await client.close()`, or use `async with`."""

    def __init__(
        self,
        address: str,
        api_key: str,
        *,
        timeout: float = 10.0,
        chat_timeout: float = 120.0,
        tls: TlsConfig | None = None,
        retries: RetryPolicy = RetryPolicy(),  # noqa: B008 - frozen, shared safely
    ) -> None:
        self._address = address
        self._metadata = transport.metadata(api_key)
        self._timeout = transport.timeout(timeout, timeout)
        self._chat_timeout = transport.timeout(chat_timeout, chat_timeout)
        self._tls = tls
        self._credentials = tls.credentials() if tls is not None else None  # read files now
        self._retries = retries
        self._channel: grpc.aio.Channel | None = None
        self._stub_: Any = None

    @property
    def _stub(self) -> Any:
        if self._stub_ is None:
            options = transport.options(self._tls)
            if self._credentials is None:
                self._channel = grpc.aio.insecure_channel(self._address, options=options)
            else:
                self._channel = grpc.aio.secure_channel(
                    self._address, self._credentials, options=options
                )
            self._stub_ = rpc.MemoryServiceStub(self._channel)
        return self._stub_

    async def _run(self, call: calls.Call[R], timeout: float | None) -> R:
        method = getattr(self._stub, call.method)
        attempts = Attempts(
            self._retries, transport.timeout(timeout, self._timeout), call.idempotent
        )
        while True:
            try:
                reply = await method(
                    call.request, timeout=attempts.remaining(), metadata=self._metadata
                )
            except grpc.RpcError as exc:
                await asyncio.sleep(attempts.backoff(errors.from_rpc(exc)))
            else:
                return call.result(reply)

    async def _pages(
        self, page: Callable[[str], calls.Call[types.Page[T]]], timeout: float | None
    ) -> AsyncIterator[T]:
        token = ""
        while True:
            result = await self._run(page(token), timeout)
            for item in result.items:
                yield item
            token = result.next_page_token
            if not token:
                return

    async def remember(
        self,
        user: str,
        session: str,
        turns: Iterable[types.Turn | tuple[str, str]],
        *,
        metadata: dict[str, str] | None = None,
        idempotency_key: str | None = None,
        wait_searchable: bool = False,
        timeout: float | None = None,
    ) -> types.RememberResult:
        """As `Client.remember`."""
        call = calls.remember(
            user,
            session,
            turns,
            metadata=metadata,
            idempotency_key=idempotency_key,
            wait_searchable=wait_searchable,
        )
        return await self._run(call, timeout)

    async def recall(
        self,
        user: str,
        query: str,
        *,
        session: str | None = None,
        top_k: int = 10,
        mode: types.RecallMode | None = "hybrid",
        since: datetime | None = None,
        until: datetime | None = None,
        roles: Sequence[types.Role] | None = None,
        metadata: Mapping[str, str] | None = None,
        timeout: float | None = None,
    ) -> types.RecallResult:
        """As `Client.recall`."""
        call = calls.recall(
            user,
            query,
            session=session,
            top_k=top_k,
            mode=mode,
            since=since,
            until=until,
            roles=roles,
            metadata=metadata,
        )
        return await self._run(call, timeout)

    async def build_context(
        self,
        user: str,
        session: str,
        query: str,
        *,
        token_budget: int = 0,
        layout: types.ContextLayout | None = None,
        mode: types.RecallMode | None = None,
        top_k: int = 0,
        timeout: float | None = None,
    ) -> types.Context:
        """As `Client.build_context`."""
        call = calls.build_context(
            user, session, query, token_budget=token_budget, layout=layout, mode=mode, top_k=top_k
        )
        return await self._run(call, timeout)

    def chat(
        self,
        user: str,
        session: str,
        message: str,
        *,
        token_budget: int = 0,
        max_new_tokens: int = 0,
        temperature: float = 0.0,
        top_p: float = 0.0,
        top_k: int = 0,
        seed: int = 0,
        stop: Sequence[str] = (),
        influence: types.InfluenceMode | None = None,
        timeout: float | None = None,
    ) -> AsyncChatStream:
        """As `Client.chat`, for `async for` (not awaited: the stream opens on the first
        iteration)."""
        request = calls.chat_request(
            user,
            session,
            message,
            token_budget=token_budget,
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=seed,
            stop=stop,
            influence=influence,
        )
        attempts = Attempts(
            self._retries, transport.timeout(timeout, self._chat_timeout), idempotent=True
        )
        return AsyncChatStream(
            lambda left: self._stub.Chat(request, timeout=left, metadata=self._metadata),
            attempts,
        )

    async def forget(
        self,
        user: str,
        *,
        session: str | None = None,
        memory_ids: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> types.ForgetResult:
        """As `Client.forget`."""
        call = calls.forget(user, session=session, memory_ids=memory_ids)
        return await self._run(call, timeout)

    async def get_session(
        self, user: str, session: str, *, timeout: float | None = None
    ) -> types.Session:
        """As `Client.get_session`."""
        return await self._run(calls.get_session(user, session), timeout)

    async def verify_audit(
        self, *, from_seq: int = 0, to_seq: int = 0, timeout: float | None = None
    ) -> types.AuditVerification:
        """As `Client.verify_audit`."""
        return await self._run(calls.verify_audit(from_seq=from_seq, to_seq=to_seq), timeout)

    async def list_audit_entries(
        self,
        user: str,
        *,
        session: str | None = None,
        page_size: int = 0,
        page_token: str = "",
        timeout: float | None = None,
    ) -> types.Page[types.AuditEntry]:
        """As `Client.list_audit_entries`."""
        call = calls.list_audit_entries(
            user, session=session, page_size=page_size, page_token=page_token
        )
        return await self._run(call, timeout)

    def audit_entries(
        self,
        user: str,
        *,
        session: str | None = None,
        page_size: int = 0,
        timeout: float | None = None,
    ) -> AsyncIterator[types.AuditEntry]:
        """As `Client.audit_entries`, for `async for`."""
        return self._pages(
            lambda token: calls.list_audit_entries(
                user, session=session, page_size=page_size, page_token=token
            ),
            timeout,
        )

    async def report_outcome(
        self,
        user: str,
        audit_seq: int,
        kind: types.OutcomeKind,
        *,
        session: str | None = None,
        note: str = "",
        timeout: float | None = None,
    ) -> int:
        """As `Client.report_outcome` (not retried)."""
        call = calls.report_outcome(user, audit_seq, kind, session=session, note=note)
        return await self._run(call, timeout)

    async def list_memories(
        self,
        user: str,
        *,
        session: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        roles: Sequence[types.Role] | None = None,
        metadata: Mapping[str, str] | None = None,
        order: types.ListOrder = "newest",
        page_size: int = 0,
        page_token: str = "",
        timeout: float | None = None,
    ) -> types.Page[types.Memory]:
        """As `Client.list_memories`."""
        call = calls.list_memories(
            user,
            session=session,
            since=since,
            until=until,
            roles=roles,
            metadata=metadata,
            order=order,
            page_size=page_size,
            page_token=page_token,
        )
        return await self._run(call, timeout)

    def memories(
        self,
        user: str,
        *,
        session: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        roles: Sequence[types.Role] | None = None,
        metadata: Mapping[str, str] | None = None,
        order: types.ListOrder = "newest",
        page_size: int = 0,
        timeout: float | None = None,
    ) -> AsyncIterator[types.Memory]:
        """As `Client.memories`, for `async for`."""
        return self._pages(
            lambda token: calls.list_memories(
                user,
                session=session,
                since=since,
                until=until,
                roles=roles,
                metadata=metadata,
                order=order,
                page_size=page_size,
                page_token=token,
            ),
            timeout,
        )

    async def get_memory(
        self, user: str, memory_id: str, *, timeout: float | None = None
    ) -> types.Memory:
        """As `Client.get_memory`."""
        return await self._run(calls.get_memory(user, memory_id), timeout)

    async def list_sessions(
        self, user: str, *, page_size: int = 0, page_token: str = "", timeout: float | None = None
    ) -> types.Page[types.SessionInfo]:
        """As `Client.list_sessions`."""
        call = calls.list_sessions(user, page_size=page_size, page_token=page_token)
        return await self._run(call, timeout)

    def sessions(
        self, user: str, *, page_size: int = 0, timeout: float | None = None
    ) -> AsyncIterator[types.SessionInfo]:
        """As `Client.sessions`, for `async for`."""
        return self._pages(
            lambda token: calls.list_sessions(user, page_size=page_size, page_token=token), timeout
        )

    async def list_users(
        self, *, page_size: int = 0, page_token: str = "", timeout: float | None = None
    ) -> types.Page[types.UserInfo]:
        """As `Client.list_users`."""
        return await self._run(
            calls.list_users(page_size=page_size, page_token=page_token), timeout
        )

    def users(
        self, *, page_size: int = 0, timeout: float | None = None
    ) -> AsyncIterator[types.UserInfo]:
        """As `Client.users`, for `async for`."""
        return self._pages(
            lambda token: calls.list_users(page_size=page_size, page_token=token), timeout
        )

    async def update_metadata(
        self,
        user: str,
        memory_id: str,
        *,
        set: Mapping[str, str] | None = None,
        remove: Iterable[str] = (),
        timeout: float | None = None,
    ) -> types.MetadataUpdate:
        """As `Client.update_metadata`."""
        call = calls.update_metadata(user, memory_id, set=set, remove=remove)
        return await self._run(call, timeout)

    async def history(
        self, user: str, memory_id: str, *, timeout: float | None = None
    ) -> AsyncIterator[types.AuditEntry]:
        """As `Client.history`, for `async for`."""
        async for entry in self.audit_entries(user, timeout=timeout):
            if memory_id in entry.memory_ids:
                yield entry

    async def export_user(
        self, user: str, *, timeout: float = 3600.0
    ) -> AsyncIterator[types.ExportItem]:
        """As `Client.export_user`, for `async for`."""
        request = pb.ExportUserRequest(user_id=user)
        attempts = Attempts(self._retries, transport.timeout(timeout, timeout), idempotent=True)
        while True:
            started = False
            try:
                stream = self._stub.ExportUser(
                    request, timeout=attempts.remaining(), metadata=self._metadata
                )
                async for message in stream:
                    item = convert.export_item(message)
                    started = True
                    if item is not None:
                        yield item
                return
            except grpc.RpcError as exc:
                error = errors.from_rpc(exc)
            if started:
                raise error
            await asyncio.sleep(attempts.backoff(error))

    async def import_turns(
        self, records: Iterable[types.Memory], *, batch_size: int = 256, timeout: float = 3600.0
    ) -> types.ImportResult:
        """As `Client.import_turns`."""
        upload = calls.Upload(calls.import_batches(records, batch_size))
        try:
            reply = await self._stub.ImportTurns(
                upload, timeout=transport.timeout(timeout, timeout), metadata=self._metadata
            )
        except grpc.RpcError as exc:
            raise (upload.error or errors.from_rpc(exc)) from None
        if upload.error is not None:
            raise upload.error
        return convert.import_result(reply)

    async def close(self) -> None:
        if self._channel is not None:
            await self._channel.close()
        self._channel = self._stub_ = None

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()
