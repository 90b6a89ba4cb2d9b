"""Each RPC once: its request from the caller's arguments, how its reply converts, and
whether a retry is safe. `Client` and `AsyncClient` only run these, so both always send
the same thing; a new RPC is a function here and a one-line method on each client.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Generic, TypeVar

from hippo.memory.v1 import memory_pb2 as pb
from hippo_client import convert, types
from hippo_client.errors import InvalidArgument

R = TypeVar("R")


@dataclass(frozen=True)
class Call(Generic[R]):
    """One unary call: the stub method's name, the request, the reply's conversion, and
    whether sending it twice has the effect of sending it once."""

    method: str
    request: Any
    result: Callable[[Any], R]
    idempotent: bool


def remember(
    user: str,
    session: str,
    turns: Iterable[types.Turn | tuple[str, str]],
    *,
    metadata: dict[str, str] | None = None,
    idempotency_key: str | None = None,
    wait_searchable: bool = False,
) -> Call[types.RememberResult]:
    """`metadata` is added to every turn (a turn's own keys win). Without an
    `idempotency_key` the SDK makes one for this call, so that its own retries store each
    turn once (the ids it derives are fresh per call, as they would be without a key);
    pass your own to make retries of yours idempotent too, or `""` to send none (then
    only turns that all have a `client_id` are retried)."""
    converted = convert.turns_in(turns)
    for turn in converted:
        for key, value in (metadata or {}).items():
            if key not in turn.metadata:
                turn.metadata[key] = value
    key = idempotency_key if idempotency_key is not None else f"sdk-{uuid.uuid4().hex}"
    request = pb.RememberRequest(
        scope=convert.scope(user, session),
        turns=converted,
        idempotency_key=key,
        wait_searchable=wait_searchable,
    )
    # The proto's rule: idempotent when the request has a key or every turn a client id.
    idempotent = bool(key) or all(t.client_id for t in converted)
    return Call("Remember", request, convert.remember_result, idempotent)


def recall(
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
) -> Call[types.RecallResult]:
    """`since` is inclusive, `until` exclusive; `roles=None` means every role; `metadata`
    keeps memories having all these pairs (declared filter keys only)."""
    request = pb.RecallRequest(
        scope=convert.scope(user, session),
        query=query,
        mode=convert.enum_in(convert.MODES, mode, "mode"),
        top_k=top_k,
        time_range=convert.time_range(since, until),
        roles=convert.roles_in(roles),
        metadata=dict(metadata or {}),
    )
    return Call("Recall", request, convert.recall_result, idempotent=True)


def build_context(
    user: str,
    session: str,
    query: str,
    *,
    token_budget: int = 0,
    layout: types.ContextLayout | None = None,
    mode: types.RecallMode | None = None,
    top_k: int = 0,
) -> Call[types.Context]:
    """Zero and None select the server's defaults (2048 tokens, boundary weighted,
    hybrid, 10 memories)."""
    request = pb.BuildContextRequest(
        scope=convert.scope(user, session),
        query=query,
        token_budget=token_budget,
        layout=convert.enum_in(convert.LAYOUTS, layout, "layout"),
        mode=convert.enum_in(convert.MODES, mode, "mode"),
        top_k=top_k,
    )
    return Call("BuildContext", request, convert.context, idempotent=True)


def chat_request(
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
) -> pb.ChatRequest:
    """Zeros select the defaults (256 new tokens, greedy); `influence=None` the user's
    recorded mode, else the service's."""
    if isinstance(stop, str):
        stop = [stop]
    return pb.ChatRequest(
        scope=convert.scope(user, session),
        message=message,
        token_budget=token_budget,
        params=pb.GenerationParameters(
            max_new_tokens=max_new_tokens,
            temperature=temperature,
            top_p=top_p,
            top_k=top_k,
            seed=seed,
            stop=list(stop),
        ),
        influence=convert.enum_in(convert.INFLUENCE, influence, "influence"),
    )


def forget(
    user: str, *, session: str | None = None, memory_ids: Sequence[str] | None = None
) -> Call[types.ForgetResult]:
    """Memory ids (of the user, or of one session when given), else one session, else
    everything of the user."""
    if memory_ids is not None:
        if isinstance(memory_ids, str):
            memory_ids = [memory_ids]
        if not memory_ids:
            # An empty list would otherwise read as "forget the whole user".
            raise InvalidArgument("memory_ids: give at least one id", field="memory_ids")
        ids = pb.MemoryIds(scope=convert.scope(user, session), memory_ids=list(memory_ids))
        request = pb.ForgetRequest(memory_ids=ids)
    elif session:
        request = pb.ForgetRequest(session=convert.scope(user, session))
    else:
        request = pb.ForgetRequest(user_id=user)
    return Call("Forget", request, convert.forget_result, idempotent=True)


def get_session(user: str, session: str) -> Call[types.Session]:
    request = pb.GetSessionRequest(scope=convert.scope(user, session))
    return Call("GetSession", request, lambda reply: convert.session(user, session, reply), True)


def verify_audit(*, from_seq: int = 0, to_seq: int = 0) -> Call[types.AuditVerification]:
    request = pb.VerifyAuditRequest(from_seq=from_seq, to_seq=to_seq)
    return Call("VerifyAudit", request, convert.verification, idempotent=True)


def list_audit_entries(
    user: str, *, session: str | None = None, page_size: int = 0, page_token: str = ""
) -> Call[types.Page[types.AuditEntry]]:
    request = pb.ListAuditEntriesRequest(
        scope=convert.scope(user, session), page_size=page_size, page_token=page_token
    )
    return Call("ListAuditEntries", request, convert.audit_page, idempotent=True)


def report_outcome(
    user: str,
    audit_seq: int,
    kind: types.OutcomeKind,
    *,
    session: str | None = None,
    note: str = "",
) -> Call[int]:
    request = pb.ReportOutcomeRequest(
        scope=convert.scope(user, session),
        audit_seq=audit_seq,
        kind=convert.enum_in(convert.OUTCOMES, kind, "kind"),
        note=note,
    )
    # Every call appends an entry: a retry would record the outcome twice.
    return Call("ReportOutcome", request, lambda reply: int(reply.audit_seq), False)


def list_memories(
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
) -> Call[types.Page[types.Memory]]:
    request = pb.ListMemoriesRequest(
        scope=convert.scope(user, session),
        time_range=convert.time_range(since, until),
        roles=convert.roles_in(roles),
        order=convert.enum_in(convert.ORDERS, order, "order"),
        page_size=page_size,
        page_token=page_token,
        metadata=dict(metadata or {}),
    )
    return Call("ListMemories", request, convert.memories_page, idempotent=True)


def get_memory(user: str, memory_id: str) -> Call[types.Memory]:
    request = pb.GetMemoryRequest(user_id=user, memory_id=memory_id)
    return Call("GetMemory", request, lambda reply: convert.memory(reply.memory), True)


def list_sessions(
    user: str, *, page_size: int = 0, page_token: str = ""
) -> Call[types.Page[types.SessionInfo]]:
    request = pb.ListSessionsRequest(user_id=user, page_size=page_size, page_token=page_token)
    return Call("ListSessions", request, convert.sessions_page, idempotent=True)


def list_users(*, page_size: int = 0, page_token: str = "") -> Call[types.Page[types.UserInfo]]:
    request = pb.ListUsersRequest(page_size=page_size, page_token=page_token)
    return Call("ListUsers", request, convert.users_page, idempotent=True)


def update_metadata(
    user: str,
    memory_id: str,
    *,
    set: Mapping[str, str] | None = None,
    remove: Iterable[str] = (),
) -> Call[types.MetadataUpdate]:
    """Setting what is already set changes nothing, so a retry is harmless (each call
    that changes something is audited once)."""
    if isinstance(remove, str):
        remove = [remove]
    request = pb.UpdateMemoryMetadataRequest(
        user_id=user, memory_id=memory_id, set=dict(set or {}), remove=list(remove)
    )
    return Call("UpdateMemoryMetadata", request, convert.metadata_update, idempotent=True)


def import_batches(
    records: Iterable[types.Memory], batch_size: int = 256
) -> Iterator[pb.ImportTurnsRequest]:
    """Memories (from an export, or built by hand) as ImportTurns messages. The size is
    checked now; each memory as its batch is built."""
    if not 1 <= batch_size <= 256:
        raise InvalidArgument(f"batch_size: {batch_size} is not in 1..256", field="batch_size")
    return _batches(records, batch_size)


def _batches(records: Iterable[types.Memory], size: int) -> Iterator[pb.ImportTurnsRequest]:
    batch: list[pb.MemoryRecord] = []
    for memory in records:
        batch.append(convert.record_in(memory))
        if len(batch) == size:
            yield pb.ImportTurnsRequest(records=batch)
            batch = []
    if batch:
        yield pb.ImportTurnsRequest(records=batch)


class Upload:
    """A client stream's requests, remembering an error raised while building one: grpc
    reads the iterator on its own thread and would report only CANCELLED."""

    def __init__(self, messages: Iterator[Any]) -> None:
        self._messages = messages
        self.error: Exception | None = None

    def __iter__(self) -> Iterator[Any]:
        return self

    def __next__(self) -> Any:
        try:
            return next(self._messages)
        except StopIteration:
            raise
        except Exception as exc:
            self.error = exc
            raise StopIteration from exc
