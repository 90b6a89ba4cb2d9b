"""`hippo replay FILE`: load a LoCoMo-format file through the Memory API.

Chronological within each conversation (session by session, turn by turn); each
conversation's `sample_id` becomes its user, `session_<n>` its session, each turn's
`dia_id` its client id (so a replay can be repeated or resumed: what is stored already is
not stored twice), the session's date the turns' time, speaker_a the user role and
speaker_b the assistant role. The speaker's name goes in metadata `speaker` and a shared
image's caption in `attachment`: both are indexed with the turn (docs/recall.md).

A busy cluster slows a replay down, never fails it (docs/cli.md): refused calls are
retried after the wait the server asks for (RetryInfo) or a capped exponential backoff,
the number of conversations in flight adapts (AIMD), and sessions fully acknowledged are
recorded in a progress file so a rerun after a kill only sends the rest.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import random
import sys
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import click
import grpc

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_cli import api, dates, locomo
from hippo_cli.settings import CliSettings
from hippo_core import backoff, files

BATCH = 64  # the API's limit of turns per Remember
ADD_AFTER = 8  # successful calls in a row before one more conversation may be in flight
MAX_HINT_SECONDS = 60.0  # the longest server-asked wait honoured, so a bogus hint cannot stall
BACKOFF_INITIAL, BACKOFF_MAX = 0.25, 30.0  # UNAVAILABLE / DEADLINE_EXCEEDED waits (seconds)
MAX_CALL_TIMEOUT = 120.0  # a call that keeps missing its deadline gets up to this long
PROGRESS_EVERY = 5.0  # seconds between progress lines on stderr


def memory_turn(turn: locomo.Turn, conversation: locomo.Conversation) -> memory_pb2.Turn:
    role = (
        memory_pb2.ROLE_USER
        if turn.speaker == conversation.speaker_a
        else memory_pb2.ROLE_ASSISTANT
    )
    metadata = {"speaker": turn.speaker}
    if turn.caption:  # what the shared picture showed: indexed with the turn
        metadata["attachment"] = turn.caption  # cut to the API's limit by the loader
    out = memory_pb2.Turn(role=role, text=turn.text, client_id=turn.dia_id, metadata=metadata)
    out.time.FromMicroseconds(turn.time_us)
    return out


def sessions(
    conversation: locomo.Conversation, user_prefix: str = ""
) -> list[tuple[int, list[memory_pb2.RememberRequest]]]:
    """Each session's number and its Remembers (split at the API's limit), in order."""
    by_session: dict[int, list[locomo.Turn]] = {}
    for turn in conversation.turns:
        by_session.setdefault(turn.session, []).append(turn)
    out: list[tuple[int, list[memory_pb2.RememberRequest]]] = []
    for n, turns in by_session.items():
        scope = memory_pb2.Scope(
            user_id=f"{user_prefix}{conversation.sample_id}", session_id=f"session_{n}"
        )
        calls = [
            memory_pb2.RememberRequest(
                scope=scope, turns=[memory_turn(t, conversation) for t in turns[i : i + BATCH]]
            )
            for i in range(0, len(turns), BATCH)
        ]
        out.append((n, calls))
    return out


def requests(
    conversation: locomo.Conversation, user_prefix: str = ""
) -> list[memory_pb2.RememberRequest]:
    """One Remember per session (split at the API's limit), in chronological order."""
    return [call for _, calls in sessions(conversation, user_prefix) for call in calls]


class GiveUp(Exception):
    """The cluster made no progress for the whole patience window, or refused for good."""


class Limiter:
    """How many conversations may have a Remember in flight: AIMD. Halved when the
    cluster says it is overloaded (RESOURCE_EXHAUSTED, DEADLINE_EXCEEDED), once per wave
    of refusals (the calls that started before the last cut do not cut again); one added
    back after ADD_AFTER successes; never above the ceiling (--concurrency).

    A refusal also pauses every sender, not only the refused one: the wait the server
    asks for is about the tenant or the service, so other conversations must not fill
    the gap the refused one leaves."""

    def __init__(self, ceiling: int) -> None:
        self.ceiling = self.limit = ceiling
        self.in_flight = 0
        self.epoch = 0  # bumped on every cut
        self._successes = 0
        self._resume_at = 0.0  # time.monotonic() before which nothing is sent
        self._changed = asyncio.Condition()

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        while True:
            pause = self._resume_at - time.monotonic()
            if pause > 0:
                # Jittered, so the paused senders do not all arrive in the same instant.
                await asyncio.sleep(pause * random.uniform(1.0, 1.2))
                continue
            async with self._changed:
                await self._changed.wait_for(lambda: self.in_flight < self.limit)
                if self._resume_at <= time.monotonic():  # no refusal while we queued
                    self.in_flight += 1
                    break
        try:
            yield
        finally:
            async with self._changed:
                self.in_flight -= 1
                self._changed.notify_all()

    def pause(self, seconds: float) -> None:
        self._resume_at = max(self._resume_at, time.monotonic() + seconds)

    def overloaded(self, epoch: int) -> None:
        """A call that started in `epoch` was refused for load."""
        if epoch == self.epoch:
            self.limit = max(1, self.limit // 2)
            self.epoch += 1
            self._successes = 0

    async def succeeded(self) -> None:
        self._successes += 1
        if self._successes >= ADD_AFTER and self.limit < self.ceiling:
            self._successes = 0
            async with self._changed:
                self.limit += 1
                self._changed.notify_all()


def retry_wait(exc: grpc.aio.AioRpcError, failures: int) -> float | None:
    """Seconds to wait before retrying a call that failed `failures` times in a row, or
    None when retrying cannot help. Remember is idempotent by client id, so a retry of a
    call that did reach the store stores nothing twice."""
    code = exc.code()
    if code == grpc.StatusCode.RESOURCE_EXHAUSTED:
        hint = api.retry_after(exc)
        if hint is not None:  # never sooner than asked; the jitter spreads the herd
            return min(hint, MAX_HINT_SECONDS) * random.uniform(1.0, 1.25)
        if api.status_details(exc) or "larger than max" in (exc.details() or ""):
            return None  # a quota waiting cannot free (stored turns), or an oversized call
        # No details at all: grpc's own max_concurrent_rpcs refusal; transient.
    elif code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED):
        return None
    return backoff.delay(failures, BACKOFF_INITIAL, BACKOFF_MAX, random.uniform(0.8, 1.2))


class Ledger:
    """The sessions fully acknowledged per conversation, kept across runs in a JSON file
    (written atomically: a kill leaves the old record or the new one, whole). A record
    for another version of the input is ignored; a finished replay deletes its record."""

    def __init__(self, path: Path, fingerprint: str, done: dict[str, set[int]]) -> None:
        self.path = path
        self._fingerprint = fingerprint
        self._done = done

    @classmethod
    def open(cls, path: Path, fingerprint: str, *, restart: bool) -> Ledger:
        done: dict[str, set[int]] = {}
        if not restart and path.exists():
            try:
                saved = json.loads(path.read_text(encoding="utf-8"))
                if saved.get("fingerprint") == fingerprint:
                    done = {k: set(v) for k, v in saved["sessions"].items()}
                else:
                    click.echo(f"replay: {path} is for another version of the input; "
                               "starting over", err=True)  # fmt: skip
            except (ValueError, KeyError, TypeError, AttributeError) as exc:
                click.echo(f"replay: ignoring unreadable {path} ({exc})", err=True)
        return cls(path, fingerprint, done)

    def is_done(self, sample_id: str, session: int) -> bool:
        return session in self._done.get(sample_id, set())

    def record(self, sample_id: str, session: int) -> None:
        self._done.setdefault(sample_id, set()).add(session)
        body = {
            "fingerprint": self._fingerprint,
            "sessions": {k: sorted(v) for k, v in sorted(self._done.items())},
        }
        self.path.parent.mkdir(parents=True, exist_ok=True)
        files.write_atomic(self.path, json.dumps(body, indent=1).encode())

    def finish(self) -> None:
        self.path.unlink(missing_ok=True)


@dataclass
class Run:
    """What one replay has done so far, for the progress lines and the summary."""

    total: int
    skipped: int = 0
    sent: int = 0
    created: int = 0
    deduplicated: int = 0
    retries: int = 0
    started: float = field(default_factory=time.monotonic)
    last_progress: float = field(default_factory=time.monotonic)
    last_error: str = ""

    def rate(self) -> float:
        return self.sent / max(1e-9, time.monotonic() - self.started)

    def line(self, limiter: Limiter) -> str:
        done = self.skipped + self.sent
        return (
            f"replay: {done}/{self.total} turns ({100 * done / max(1, self.total):.0f}%), "
            f"{self.rate():.0f} turns/s, concurrency {limiter.limit}/{limiter.ceiling}, "
            f"{self.retries} retries"
        )


async def _remember(
    stub: memory_pb2_grpc.MemoryServiceStub,
    request: memory_pb2.RememberRequest,
    settings: CliSettings,
    limiter: Limiter,
    run: Run,
    patience: float,
) -> memory_pb2.RememberResponse:
    """One Remember, retried until it is acknowledged, refused for good, or the cluster
    has made no progress for `patience` seconds."""
    failures = 0
    timeout = settings.timeout_seconds
    while True:
        try:
            async with limiter.slot():
                epoch = limiter.epoch
                reply: memory_pb2.RememberResponse = await stub.Remember(
                    request, metadata=api.metadata(settings), timeout=timeout
                )
        except grpc.aio.AioRpcError as exc:
            failures += 1
            wait = retry_wait(exc, failures)
            if wait is None:
                raise
            code = exc.code()
            run.last_error = f"{code.name}: {exc.details()}"
            if code in (grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.DEADLINE_EXCEEDED):
                limiter.overloaded(epoch)
                # A call that cannot finish in time under this load gets longer next time:
                # a loader would rather wait in a queue than retry into it (the embedding
                # service refuses work whose queue wait exceeds the caller's deadline, and a
                # slow embedder can need longer than the default for one full batch).
                timeout = min(max(MAX_CALL_TIMEOUT, timeout), timeout * 2)
            stalled = time.monotonic() - run.last_progress
            if stalled + wait > patience:
                raise GiveUp(
                    f"gave up: the cluster accepted nothing for {stalled:.0f} s (limit "
                    f"{patience:.0f} s, --give-up-after); last error {run.last_error}"
                ) from None
            run.retries += 1
            limiter.pause(wait)
            continue
        run.last_progress = time.monotonic()
        await limiter.succeeded()
        return reply


async def replay_all(
    settings: CliSettings,
    conversations: list[locomo.Conversation],
    ledger: Ledger,
    *,
    user_prefix: str = "",
    concurrency: int = 4,
    patience: float = 600.0,
    progress_every: float = PROGRESS_EVERY,
) -> Run:
    """Replay every session not in `ledger` (each conversation in order, up to
    `concurrency` conversations with a call in flight); each acknowledged session is
    recorded in `ledger`."""
    plans = {c.sample_id: sessions(c, user_prefix) for c in conversations}
    run = Run(total=sum(len(c.turns) for c in conversations))
    limiter = Limiter(concurrency)

    async def one(stub: memory_pb2_grpc.MemoryServiceStub, conv: locomo.Conversation) -> None:
        for n, calls in plans[conv.sample_id]:
            if ledger.is_done(conv.sample_id, n):
                continue
            for request in calls:
                reply = await _remember(stub, request, settings, limiter, run, patience)
                run.created += reply.created
                run.deduplicated += reply.deduplicated
                run.sent += len(request.turns)
            ledger.record(conv.sample_id, n)

    async def report() -> None:
        while True:
            await asyncio.sleep(progress_every)
            click.echo(run.line(limiter), err=True)

    for sample_id, plan in plans.items():
        run.skipped += sum(
            len(r.turns) for n, calls in plan if ledger.is_done(sample_id, n) for r in calls
        )
    reporter = asyncio.create_task(report())
    try:
        async with api.gateway(settings) as stub:
            await asyncio.gather(*(one(stub, c) for c in conversations))
    finally:
        reporter.cancel()
        click.echo(run.line(limiter), err=True)
    return run


def progress_path(settings: CliSettings, file: Path, user_prefix: str) -> Path:
    """Where a replay of `file` into this cluster (gateway, API key, user prefix) keeps
    its progress: under the CLI's data dir, since the input may sit on a read-only disk."""
    key = hashlib.sha256(settings.api_key.encode()).hexdigest()
    target = f"{file.resolve()}\n{settings.gateway_addr}\n{key}\n{user_prefix}"
    digest = hashlib.sha256(target.encode()).hexdigest()[:12]
    return Path(settings.data_dir) / "replay" / f"{file.name}.{digest}.progress.json"


@click.command()
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--user-prefix", default="", help="Put before each sample_id to make the user id.")
@click.option(
    "--concurrency",
    type=click.IntRange(1, 32),
    default=4,
    show_default=True,
    help="Most conversations with a call in flight; halved while the cluster is "
    "overloaded, grown back by one after 8 successes.",
)
@click.option(
    "--restart",
    is_flag=True,
    help="Ignore the progress file of an earlier, interrupted run and send everything "
    "again (what is already stored is not stored twice).",
)
@click.option(
    "--progress-file",
    type=click.Path(dir_okay=False, path_type=Path),
    default=None,
    help="Where to record the sessions acknowledged so far "
    "[default: <data_dir>/replay/<FILE name>.<hash>.progress.json].",
)
@click.option(
    "--give-up-after",
    type=click.FloatRange(min=1),
    default=600.0,
    show_default=True,
    help="Seconds without a single acknowledged call before the replay stops (it can be "
    "resumed by running the same command again).",
)
@click.option(
    "--date-order",
    type=click.Choice(dates.ORDERS),
    default=None,
    help="How FILE writes numeric day-month dates such as 08/05/2023: dmy (8 May) or mdy "
    "(5 August). Default: read from the file's own dates (one with a day over 12 tells); "
    "a file where none does is refused until this says.",
)
@click.pass_obj
def replay(
    settings: CliSettings,
    file: Path,
    user_prefix: str,
    concurrency: int,
    restart: bool,
    progress_file: Path | None,
    give_up_after: float,
    date_order: dates.Order | None,
) -> None:
    """Load a LoCoMo-format FILE through the API, in chronological order. The whole file
    is read and checked before anything is sent; a busy cluster slows the load down
    rather than failing it; an interrupted run resumes where it stopped."""
    try:
        conversations = locomo.load(file, date_order)
    except locomo.FileError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    for conv in conversations:
        user = f"{user_prefix}{conv.sample_id}"
        if not locomo.ID.fullmatch(user):
            click.echo(f"error: user id {user!r} (--user-prefix + sample_id) must be "
                       "1..128 of [A-Za-z0-9._:@-]", err=True)  # fmt: skip
            sys.exit(2)
    empty = [(c.sample_id, where) for c in conversations for where in c.skipped]
    if empty:  # nothing to remember in them; said, so a count that differs is explained
        click.echo(f"note: {len(empty)} turn(s) with no text and no image caption not "
                   f"stored (the first: conversation {empty[0][0]}, {empty[0][1]})",
                   err=True)  # fmt: skip
    # A resumed run must read the dates as the first did: --date-order is part of it.
    fingerprint = hashlib.sha256(file.read_bytes() + (date_order or "").encode()).hexdigest()
    path = progress_file or progress_path(settings, file, user_prefix)
    ledger = Ledger.open(path, fingerprint, restart=restart)
    started = time.monotonic()
    try:
        run = api.run(
            replay_all(
                settings,
                conversations,
                ledger,
                user_prefix=user_prefix,
                concurrency=concurrency,
                patience=give_up_after,
            )
        )
    except GiveUp as exc:
        click.echo(f"error: {exc}; run the same command again to resume ({path})", err=True)
        sys.exit(api.SERVER_ERROR)
    ledger.finish()
    took = time.monotonic() - started
    skipped = f", {run.skipped} skipped (acknowledged in an earlier run)" if run.skipped else ""
    click.echo(
        f"{run.total} turns of {len(conversations)} conversations: {run.created} stored, "
        f"{run.deduplicated} already stored{skipped}, in {took:.1f} s "
        f"({run.sent / took:.0f} turns/s, {run.retries} retries)"
    )
