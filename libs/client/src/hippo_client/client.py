"""`Client`: the Memory API from blocking code.

Every method is one of `calls.py` run with the client's key, deadline and retry policy;
`AsyncClient` (aio.py) runs the same ones. Each call has one deadline (`timeout=` per
call, else the client's) that covers all its attempts and backoff waits.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Generator, Iterable, Iterator, Mapping, Sequence
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


class ChatStream(Iterator[str]):
    """A streamed reply. Iterating yields its text pieces, in order; `start` (a
    `ChatStart`) is set when the first event arrives, `end` (a `ChatEnd`: finish reason,
    the stored memory ids, `audit_seq`) once the iteration is exhausted, and `text` is
    the reply so far. A failure raises a `HippoError` from the iteration. The stream is
    retried only before its first event; use it as a context manager, or call
    `cancel()`, to stop early (then nothing is stored)."""

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

    def __iter__(self) -> ChatStream:
        return self

    def __next__(self) -> str:
        return next(self._events)

    def _run(self) -> Generator[str, None, None]:
        while True:
            self._call = self._open(self._attempts.remaining())
            try:
                for event in self._call:
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
            time.sleep(self._attempts.backoff(error))

    def cancel(self) -> None:
        if self._call is not None:
            self._call.cancel()

    def __enter__(self) -> ChatStream:
        return self

    def __exit__(self, *exc: object) -> None:
        if self.end is None:
            self.cancel()
        self._events.close()


class Client:
    """The Memory API at `address` ("host:port"), as the tenant of `api_key`.

    `timeout` is each call's deadline in seconds (every method takes `timeout=` to
    override it), `chat_timeout` a whole chat stream's. `tls=None` is a plaintext
    channel. `retries` says how UNAVAILABLE and RESOURCE_EXHAUSTED are retried, for calls
    that are safe to repeat. Close it, or use it as a context manager."""

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
        self._metadata = transport.metadata(api_key)
        self._timeout = transport.timeout(timeout, timeout)
        self._chat_timeout = transport.timeout(chat_timeout, chat_timeout)
        self._retries = retries
        options = transport.options(tls)
        if tls is None:
            self._channel = grpc.insecure_channel(address, options=options)
        else:
            self._channel = grpc.secure_channel(address, tls.credentials(), options=options)
        self._stub = rpc.MemoryServiceStub(self._channel)

    def _run(self, call: calls.Call[R], timeout: float | None) -> R:
        method = getattr(self._stub, call.method)
        attempts = Attempts(
            self._retries, transport.timeout(timeout, self._timeout), call.idempotent
        )
        while True:
            try:
                reply = method(call.request, timeout=attempts.remaining(), metadata=self._metadata)
            except grpc.RpcError as exc:
                time.sleep(attempts.backoff(errors.from_rpc(exc)))
            else:
                return call.result(reply)

    def _pages(
        self, page: Callable[[str], calls.Call[types.Page[T]]], timeout: float | None
    ) -> Iterator[T]:
        token = ""
        while True:
            result = self._run(page(token), timeout)
            yield from result.items
            token = result.next_page_token
            if not token:
                return

    def remember(
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
        """Store turns, given as `(role, text)` pairs or `Turn`s, in one session: all of
        them or none. See `calls.remember` for `metadata` and `idempotency_key`."""
        call = calls.remember(
            user,
            session,
            turns,
            metadata=metadata,
            idempotency_key=idempotency_key,
            wait_searchable=wait_searchable,
        )
        return self._run(call, timeout)

    def recall(
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
        """Hybrid (or lexical, semantic) search over the user's memories, best first
        (Mem0: `search`). `metadata` keeps memories with all these pairs (declared keys)."""
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
        return self._run(call, timeout)

    def build_context(
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
        """The prompt for `query` in a session under a token budget."""
        call = calls.build_context(
            user, session, query, token_budget=token_budget, layout=layout, mode=mode, top_k=top_k
        )
        return self._run(call, timeout)

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
    ) -> ChatStream:
        """Answer `message` with the served model; iterate the result for the text, then
        read its `.end`. The exchange is stored when the stream ends. Not idempotent."""
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
        return ChatStream(
            lambda left: self._stub.Chat(request, timeout=left, metadata=self._metadata),
            attempts,
        )

    def forget(
        self,
        user: str,
        *,
        session: str | None = None,
        memory_ids: Sequence[str] | None = None,
        timeout: float | None = None,
    ) -> types.ForgetResult:
        """Erase memories by id, or one session, or (neither given) all of the user."""
        return self._run(calls.forget(user, session=session, memory_ids=memory_ids), timeout)

    def get_session(
        self, user: str, session: str, *, timeout: float | None = None
    ) -> types.Session:
        """A session's window, summary and counts (version 0: no such session)."""
        return self._run(calls.get_session(user, session), timeout)

    def verify_audit(
        self, *, from_seq: int = 0, to_seq: int = 0, timeout: float | None = None
    ) -> types.AuditVerification:
        """Check the audit log's hash chain (needs the audit-read role)."""
        return self._run(calls.verify_audit(from_seq=from_seq, to_seq=to_seq), timeout)

    def list_audit_entries(
        self,
        user: str,
        *,
        session: str | None = None,
        page_size: int = 0,
        page_token: str = "",
        timeout: float | None = None,
    ) -> types.Page[types.AuditEntry]:
        """One page of the user's audit entries, oldest first."""
        call = calls.list_audit_entries(
            user, session=session, page_size=page_size, page_token=page_token
        )
        return self._run(call, timeout)

    def audit_entries(
        self,
        user: str,
        *,
        session: str | None = None,
        page_size: int = 0,
        timeout: float | None = None,
    ) -> Iterator[types.AuditEntry]:
        """Every audit entry of the user, oldest first, fetching pages as it goes
        (`timeout` is each page's)."""
        return self._pages(
            lambda token: calls.list_audit_entries(
                user, session=session, page_size=page_size, page_token=token
            ),
            timeout,
        )

    def report_outcome(
        self,
        user: str,
        audit_seq: int,
        kind: types.OutcomeKind,
        *,
        session: str | None = None,
        note: str = "",
        timeout: float | None = None,
    ) -> int:
        """Record an outcome about an earlier entry; returns the new entry's seq. Not
        retried: every call appends one."""
        call = calls.report_outcome(user, audit_seq, kind, session=session, note=note)
        return self._run(call, timeout)

    def list_memories(
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
        """One page of the user's memories (or one session's), newest first unless
        `order="oldest"`; pass the page's `next_page_token` for the next."""
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
        return self._run(call, timeout)

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
    ) -> Iterator[types.Memory]:
        """Every memory `list_memories` would page through, fetching pages as it goes
        (Mem0: `get_all`; `timeout` is each page's)."""
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

    def get_memory(
        self, user: str, memory_id: str, *, timeout: float | None = None
    ) -> types.Memory:
        """One of the user's memories by id (Mem0: `get`); `NotFound` when absent."""
        return self._run(calls.get_memory(user, memory_id), timeout)

    def list_sessions(
        self, user: str, *, page_size: int = 0, page_token: str = "", timeout: float | None = None
    ) -> types.Page[types.SessionInfo]:
        """One page of the user's sessions, by session id."""
        return self._run(
            calls.list_sessions(user, page_size=page_size, page_token=page_token), timeout
        )

    def sessions(
        self, user: str, *, page_size: int = 0, timeout: float | None = None
    ) -> Iterator[types.SessionInfo]:
        """Every session of the user that holds turns, with counts and times."""
        return self._pages(
            lambda token: calls.list_sessions(user, page_size=page_size, page_token=token), timeout
        )

    def list_users(
        self, *, page_size: int = 0, page_token: str = "", timeout: float | None = None
    ) -> types.Page[types.UserInfo]:
        """One page of the tenant's users, by user id."""
        return self._run(calls.list_users(page_size=page_size, page_token=page_token), timeout)

    def users(
        self, *, page_size: int = 0, timeout: float | None = None
    ) -> Iterator[types.UserInfo]:
        """Every user of the tenant that holds turns, with counts and times."""
        return self._pages(
            lambda token: calls.list_users(page_size=page_size, page_token=token), timeout
        )

    def update_metadata(
        self,
        user: str,
        memory_id: str,
        *,
        set: Mapping[str, str] | None = None,
        remove: Iterable[str] = (),
        timeout: float | None = None,
    ) -> types.MetadataUpdate:
        """Add, replace (`set`) or drop (`remove`) metadata keys of a memory; its text
        never changes (Mem0's `update` of metadata). Audited."""
        call = calls.update_metadata(user, memory_id, set=set, remove=remove)
        return self._run(call, timeout)

    def history(
        self, user: str, memory_id: str, *, timeout: float | None = None
    ) -> Iterator[types.AuditEntry]:
        """The audit entries that name `memory_id` (its write, reads, changes, erasure),
        oldest first (Mem0: `history`; needs the audit-read role). Pages through all of
        the user's entries: for a user with a long history prefer `audit_entries`."""
        return (e for e in self.audit_entries(user, timeout=timeout) if memory_id in e.memory_ids)

    def export_user(self, user: str, *, timeout: float = 3600.0) -> Iterator[types.ExportItem]:
        """Everything stored for the user: an `ExportHeader`, every `Memory` oldest
        first, every `ExportedSession`, then an `ExportFooter` (its absence means the
        export broke off). `timeout` is the whole stream's. Retried only before the first
        item arrives."""
        request = pb.ExportUserRequest(user_id=user)
        attempts = Attempts(self._retries, transport.timeout(timeout, timeout), idempotent=True)
        while True:
            started = False
            try:
                stream = self._stub.ExportUser(
                    request, timeout=attempts.remaining(), metadata=self._metadata
                )
                for message in stream:
                    item = convert.export_item(message)
                    started = True
                    if item is not None:
                        yield item
                return
            except grpc.RpcError as exc:
                error = errors.from_rpc(exc)
            if started:
                raise error
            time.sleep(attempts.backoff(error))

    def import_turns(
        self, records: Iterable[types.Memory], *, batch_size: int = 256, timeout: float = 3600.0
    ) -> types.ImportResult:
        """Store memories keeping their ids (typically `export_user`'s), with Remember's
        validation; ids already stored are skipped, so running it again resumes a failed
        import. `records` is read once: not retried (call it again to resume)."""
        upload = calls.Upload(calls.import_batches(records, batch_size))
        try:
            reply = self._stub.ImportTurns(
                upload, timeout=transport.timeout(timeout, timeout), metadata=self._metadata
            )
        except grpc.RpcError as exc:
            raise (upload.error or errors.from_rpc(exc)) from None
        if upload.error is not None:  # the stream ended early: what was sent is stored
            raise upload.error
        return convert.import_result(reply)

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
