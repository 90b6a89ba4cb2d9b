"""`hippo replay` without a cluster: the dates it reads, the file checks that run before
anything is sent, and the loader's retries, adaptive concurrency and progress record
against an in-process gateway that refuses on cue."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import grpc
import locomo_sample
import pytest
from click.testing import CliRunner
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2

from hippo.memory.v1 import memory_pb2, memory_pb2_grpc
from hippo_cli import dates, locomo, replay
from hippo_cli.main import cli
from hippo_cli.settings import CliSettings

MAY_8 = datetime(2023, 5, 8, tzinfo=UTC)
AT_1356 = datetime(2023, 5, 8, 13, 56, tzinfo=UTC)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1:56 pm on 8 May, 2023", AT_1356),  # LoCoMo's own
        ("1:56pm on 8 May, 2023", AT_1356),
        ("1:56 p.m. on 8 May, 2023", AT_1356),
        ("2023-05-08T13:56:00Z", AT_1356),
        ("2023-05-08T15:56:00+02:00", AT_1356),  # an offset is converted to UTC
        ("2023-05-08 13:56:00", AT_1356),  # a space for the T, no zone: UTC
        ("2023-05-08", MAY_8),
        ("08.05.2023, 13:56:00", AT_1356),
        ("08.05.2023 13:56", AT_1356),
        ("8.5.2023", MAY_8),
        ("2023/05/08", MAY_8),
        ("8 May 2023", MAY_8),
        ("8 May 2023, 1:56 PM", AT_1356),
        ("May 8, 2023", MAY_8),
        ("May 8, 2023 1:56 pm", AT_1356),
        ("May 8, 2023 at 13:56", AT_1356),
        ("Sep 8, 2023", datetime(2023, 9, 8, tzinfo=UTC)),
        # What chat exports add around a date: a weekday, ordinals, brackets, a zone name.
        ("Monday, 8 May 2023", MAY_8),
        ("Mon 8 May 2023, 1:56 pm", AT_1356),
        ("Monday, May 8th, 2023", MAY_8),
        ("8th May 2023 at 13:56", AT_1356),
        ("[08.05.2023, 13:56:00]", AT_1356),
        ("2023-05-08 13:56:00 UTC", AT_1356),
        ("2023.05.08", MAY_8),
        ("2023-05-08 15:56:00 +0200", AT_1356),  # a space before the offset, as logs write it
        ("Mon, 08 May 2023 15:56:00 +0200", AT_1356),  # e-mail style (RFC 2822)
        # Unix time: seconds, or milliseconds from 13 digits (a JSON number too).
        ("1683554160", AT_1356),
        ("1683554160000", AT_1356),
        (1683554160, AT_1356),
        # Day-month dates with one reading: a day over 12.
        ("25/05/2023, 13:56", datetime(2023, 5, 25, 13, 56, tzinfo=UTC)),
        ("5/25/23, 1:56 PM", datetime(2023, 5, 25, 13, 56, tzinfo=UTC)),
        ("25-05-2023", datetime(2023, 5, 25, tzinfo=UTC)),
        # Other spellings exports and people write.
        ("8th of May 2023", MAY_8),
        ("8-May-2023", MAY_8),
        ("08-May-23", MAY_8),
        ("Sept 8, 2023", datetime(2023, 9, 8, tzinfo=UTC)),
        ("Sep. 8, 2023", datetime(2023, 9, 8, tzinfo=UTC)),
        ("13:56, 8 May 2023", AT_1356),  # the time first
        ("1:56 pm, May 8, 2023", AT_1356),
        ("2023-05-08 1:56 PM", AT_1356),
        ("08.05.23", MAY_8),
        ("20230508", MAY_8),  # ISO 8601's basic form
        # A zone after a space: offsets and the common abbreviations.
        ("08 May 2023 14:56:00 CET", AT_1356),
        ("Mon, 08 May 2023 06:56:00 PDT", AT_1356),
        ("08.05.2023 15:56 UTC+2", AT_1356),
        ("08.05.2023 15:56 GMT+02:00", AT_1356),
        ("25/05/2023 08:56 -0500", datetime(2023, 5, 25, 13, 56, tzinfo=UTC)),
        ("2023-05-08 13:56 Z", AT_1356),
        ("8 May 2023 11:56 utc-2", AT_1356),
    ],
)
def test_each_accepted_date_format_reads_as_utc(text: str, expected: datetime) -> None:
    assert dates.parse(text) == expected
    assert locomo.parse_date(text) == expected


@pytest.mark.parametrize("text", ["08/05/2023", "5/8/23 1:56 pm", "08-05-2023"])
def test_slashed_day_month_dates_are_refused_as_ambiguous(text: str) -> None:
    with pytest.raises(dates.AmbiguousDate, match=r"ambiguous .*--date-order dmy\|mdy"):
        dates.parse(text)


def test_a_day_month_order_reads_every_slashed_date_one_way() -> None:
    assert dates.parse("08/05/2023, 13:56", "dmy") == AT_1356
    assert dates.parse("05/08/2023 1:56 pm", "mdy") == AT_1356
    assert dates.parse("5/8/23", "mdy") == MAY_8  # two-digit years as strptime's %y
    with pytest.raises(ValueError, match="no month 25"):
        dates.parse("05/25/2023", "dmy")  # the order given wins over a guess
    # The order a set of dates agrees on: one date with a field over 12 tells.
    assert dates.order_of(["05/08/2023", "25/05/2023", "8 May 2023"]) == "dmy"
    assert dates.order_of(["05/08/2023", "05/25/2023"]) == "mdy"
    assert dates.order_of(["05/08/2023", "2023-05-08", "08.05.2023"]) is None
    with pytest.raises(ValueError, match="'13/05/2023' is day first, '05/13/2023' month"):
        dates.order_of(["13/05/2023", "05/13/2023"])


def _file(tmp_path: Path, *session_dates: str) -> Path:
    sample = locomo_sample.conversation(0, sessions=len(session_dates))
    for n, value in enumerate(session_dates, start=1):
        sample["conversation"][f"session_{n}_date_time"] = value
    path = tmp_path / "chats.json"
    path.write_text(json.dumps([sample]))
    return path


def test_a_file_settles_its_own_day_month_order(tmp_path: Path) -> None:
    """One date with a day over 12 says how the file's ambiguous ones read; a file whose
    dates never say is refused until --date-order does, and so is one that says both."""
    times = lambda convs: sorted({t.time_us for t in convs[0].turns})  # noqa: E731
    day_first = _file(tmp_path, "04/05/2023, 10:00", "25/05/2023, 09:30")
    assert times(locomo.load(day_first)) == [
        int(datetime(2023, 5, 4, 10, tzinfo=UTC).timestamp()) * 1_000_000,
        int(datetime(2023, 5, 25, 9, 30, tzinfo=UTC).timestamp()) * 1_000_000,
    ]
    month_first = _file(tmp_path, "04/05/2023", "05/25/2023")
    assert times(locomo.load(month_first))[0] == int(
        datetime(2023, 4, 5, tzinfo=UTC).timestamp()) * 1_000_000  # fmt: skip
    unsaid = _file(tmp_path, "04/05/2023", "05/06/2023")
    with pytest.raises(locomo.FileError, match=r"session_1_date_time: .*--date-order"):
        locomo.load(unsaid)
    assert times(locomo.load(unsaid, "mdy"))[0] == int(
        datetime(2023, 4, 5, tzinfo=UTC).timestamp()) * 1_000_000  # fmt: skip
    both = _file(tmp_path, "13/05/2023", "05/13/2023")
    with pytest.raises(locomo.FileError, match=r"chats.json: day-month dates in both orders"):
        locomo.load(both)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("8 May 2023 13:56 IST", "'IST' names several (India, Ireland or Israel)"),
        ("8 May 2023 13:56 XYZT", "'XYZT' is not one this reader knows: write the offset"),
        ("8 May 2023 13:56 +25:00", "'+25:00' is not a UTC offset"),
    ],
)
def test_a_zone_that_is_unknown_or_ambiguous_is_refused_not_read_as_utc(
    text: str, expected: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(expected)):
        dates.parse(text)


@pytest.mark.parametrize("text", ["yesterday", "31.02.2023", "", "13:56", "8 May 2023 noon"])
def test_unreadable_dates_name_the_accepted_formats(text: str) -> None:
    with pytest.raises(ValueError, match=re.escape("accepted are e.g. '1:56 pm on 8 May, 2023'")):
        dates.parse(text)


def test_a_bad_date_names_file_conversation_field_and_value(tmp_path: Path) -> None:
    samples = [locomo_sample.conversation(0), locomo_sample.conversation(1)]
    samples[1]["conversation"]["session_3_date_time"] = "the third of May"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(samples))
    with pytest.raises(locomo.FileError) as caught:
        locomo.load(path)
    message = str(caught.value)
    assert message.startswith(f"{path}: conversation conv-1: session_3_date_time: ")
    assert "'the third of May'" in message


@pytest.mark.parametrize(
    ("change", "expected"),
    [
        (lambda s: s["conversation"]["session_2"][0].update(dia_id="D 2"), "session_2[0]: dia_id"),
        (lambda s: s["conversation"]["session_2"][0].pop("speaker"), "session_2[0]: speaker"),
        (lambda s: s["qa"].append({"answer": "x"}), "qa[0]: question must be"),
        (lambda s: s["conversation"]["session_1"][1].update(dia_id="D1:1"), "appears twice"),
        (lambda s: s["conversation"].update(session_1_date_time="1 Jan 1960"), "before 1970"),
        (lambda s: s["conversation"].pop("session_2_date_time"), "session_2_date_time is miss"),
        (lambda s: s.update(sample_id="has spaces"), "sample_id must be"),
    ],
)
def test_other_file_problems_are_found_before_sending(
    tmp_path: Path, change: Any, expected: str
) -> None:
    sample = locomo_sample.conversation(0)
    change(sample)
    path = tmp_path / "bad.json"
    path.write_text(json.dumps([sample]))
    with pytest.raises(locomo.FileError, match=re.escape(expected)):
        locomo.load(path)


def _messy(tmp_path: Path) -> Path:
    """A real export's habits, each with one sensible reading (locomo's docstring)."""
    long_text = " ".join(["word"] * 16_000)  # 80,000 bytes: three turns of the API's 32 KiB
    session = [
        {"speaker": "Ana", "dia_id": 7, "text": "A number for an id."},
        {"speaker": "Ben", "text": "No id: made from my place."},
        {"speaker": "Ana", "dia_id": "pic", "text": "", "blip_caption": "a red bicycle"},
        {"speaker": "Ben", "dia_id": "blank", "text": "\u200b "},  # nothing to store
        {"speaker": "Ana", "dia_id": "nul", "text": "before\x00after", "blip_caption": "é" * 600},
        {"speaker": "Ben", "dia_id": "long", "text": long_text},
    ]
    qa = [
        {"question": "Which bike?", "answer": "red", "evidence": ["pic"], "category": "single-hop"},
        {"question": "Blank?", "answer": "", "evidence": ["blank", "7"]},
    ]
    sample = {
        "conversation": {"session_1": session, "session_1_date_time": "8-May-2023"},
        "qa": qa,
    }
    path = tmp_path / "export.json"
    path.write_text(json.dumps([sample]))
    return path


def test_a_messy_export_is_read_not_refused(tmp_path: Path) -> None:
    (conv,) = locomo.load(_messy(tmp_path))
    assert (conv.sample_id, conv.speaker_a, conv.speaker_b) == ("conversation-1", "Ana", "Ben")
    by_id = {t.dia_id: t for t in conv.turns}
    assert list(by_id) == ["7", "D1:2", "pic", "nul", "long", "long.2", "long.3"]
    assert by_id["pic"].text == "[image: a red bicycle]" and by_id["pic"].caption == ""
    assert by_id["nul"].text == "beforeafter"
    assert len(by_id["nul"].caption.encode()) <= 1024  # the API's metadata value limit
    parts = [by_id[d].text for d in ("long", "long.2", "long.3")]
    assert "".join(parts) == " ".join(["word"] * 16_000)  # split, nothing lost
    assert all(len(p.encode()) <= 32 * 1024 and not p.startswith(" ") for p in parts)
    assert conv.skipped == ("session_1[3]",)
    first, second = conv.questions
    assert (first.category, first.evidence) == (4, ("pic",))
    assert (second.category, second.evidence) == (0, ("7",))  # the skipped turn is no evidence


async def test_hippo_replay_stores_a_messy_export_and_says_what_it_skipped(
    serve: Any, tmp_path: Path
) -> None:
    gateway = Gateway([])
    settings = await serve(gateway)
    env = {"HIPPO_CLI_GATEWAY_ADDR": settings.gateway_addr, "HIPPO_CLI_DATA_DIR": str(tmp_path)}
    args = ["replay", str(_messy(tmp_path))]
    done = await asyncio.to_thread(CliRunner().invoke, cli, args, env=env)
    assert done.exit_code == 0, done.output
    assert "note: 1 turn(s) with no text and no image caption not stored" in done.output
    assert "(the first: conversation conversation-1, session_1[3])" in done.output
    stored = {cid: text for (user, cid), text in gateway.stored.items()}
    assert {u for u, _ in gateway.stored} == {"conversation-1"}
    assert sorted(stored) == sorted(["7", "D1:2", "pic", "nul", "long", "long.2", "long.3"])
    assert stored["pic"] == "[image: a red bicycle]"


# --- the loader against a gateway that refuses on cue ---------------------------------


def _details(*details: Any) -> bytes:
    packed = []
    for d in details:
        a = any_pb2.Any()
        a.Pack(d)
        packed.append(a)
    status = status_pb2.Status(code=8, message="busy", details=packed)
    return bytes(status.SerializeToString())


def _retry_info(seconds: float) -> error_details_pb2.RetryInfo:
    delay = duration_pb2.Duration()
    delay.FromNanoseconds(int(seconds * 1e9))
    return error_details_pb2.RetryInfo(retry_delay=delay)


class Gateway(memory_pb2_grpc.MemoryServiceServicer):
    """Stores turns by (user, client id), as the real one does; fails the first calls as
    `script` says: (code, RetryInfo seconds or None, QuotaFailure?)."""

    def __init__(self, script: list[tuple[grpc.StatusCode, float | None, bool]]) -> None:
        self.script = list(script)
        self.stored: dict[tuple[str, str], str] = {}
        self.times: dict[tuple[str, str], int] = {}  # microseconds
        self.refused_at: list[float] = []
        self.accepted_at: list[float] = []
        self.deadlines: list[float | None] = []
        self.in_flight = 0
        self.most_in_flight = 0

    async def Remember(
        self, request: memory_pb2.RememberRequest, context: grpc.aio.ServicerContext
    ) -> memory_pb2.RememberResponse:
        self.deadlines.append(context.time_remaining())
        if self.script:
            code, hint, quota = self.script.pop(0)
            self.refused_at.append(time.monotonic())
            details: list[Any] = [_retry_info(hint)] if hint is not None else []
            if quota:
                details.append(error_details_pb2.QuotaFailure())
            trailer = (("grpc-status-details-bin", _details(*details)),) if details else ()
            await context.abort(code, "refused on cue", trailing_metadata=trailer)
        self.in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self.in_flight)
        await asyncio.sleep(0.01)
        self.in_flight -= 1
        self.accepted_at.append(time.monotonic())
        created = 0
        for turn in request.turns:
            key = (request.scope.user_id, turn.client_id)
            created += key not in self.stored
            self.stored[key] = turn.text
            self.times[key] = turn.time.ToMicroseconds()
        return memory_pb2.RememberResponse(
            created=created, deduplicated=len(request.turns) - created
        )


@pytest.fixture
async def serve() -> AsyncIterator[Any]:
    servers: list[grpc.aio.Server] = []

    async def start(gateway: Gateway) -> CliSettings:
        server = grpc.aio.server()
        memory_pb2_grpc.add_MemoryServiceServicer_to_server(gateway, server)
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        servers.append(server)
        return CliSettings(gateway_addr=f"127.0.0.1:{port}", timeout_seconds=5)

    yield start
    for server in servers:
        await server.stop(None)


async def test_hippo_replay_reads_slashed_dates_as_date_order_says(
    serve: Any, tmp_path: Path
) -> None:
    gateway = Gateway([])
    settings = await serve(gateway)
    path = _file(tmp_path, "04/05/2023", "05/06/2023")  # no day over 12: no order told
    env = {"HIPPO_CLI_GATEWAY_ADDR": settings.gateway_addr, "HIPPO_CLI_DATA_DIR": str(tmp_path)}
    refused = await asyncio.to_thread(CliRunner().invoke, cli, ["replay", str(path)], env=env)
    assert refused.exit_code == 2 and "--date-order dmy|mdy" in refused.output
    assert gateway.stored == {}  # nothing sent
    args = ["replay", str(path), "--date-order", "mdy"]
    done = await asyncio.to_thread(CliRunner().invoke, cli, args, env=env)
    assert done.exit_code == 0, done.output
    april_5 = int(datetime(2023, 4, 5, tzinfo=UTC).timestamp()) * 1_000_000
    assert min(gateway.times.values()) == april_5


def _archive(tmp_path: Path, conversations: int = 3) -> list[locomo.Conversation]:
    return locomo.load(locomo_sample.write(tmp_path / "archive.json", conversations))


def _ledger(tmp_path: Path) -> replay.Ledger:
    return replay.Ledger.open(tmp_path / "progress.json", "fp", restart=False)


async def test_retry_info_is_waited_for_and_every_turn_lands_once(
    serve: Any, tmp_path: Path
) -> None:
    """A RESOURCE_EXHAUSTED with RetryInfo is retried no sooner than asked; UNAVAILABLE
    and DEADLINE_EXCEEDED with backoff; the replay completes with each turn stored once."""
    busy = (grpc.StatusCode.RESOURCE_EXHAUSTED, 0.3, True)  # a rate quota: hint + quota
    script = [busy, busy, (grpc.StatusCode.DEADLINE_EXCEEDED, None, False)]
    gateway = Gateway(script)
    settings = await serve(gateway)
    conversations = _archive(tmp_path)
    run = await replay.replay_all(settings, conversations, _ledger(tmp_path), concurrency=1)
    total = sum(len(c.turns) for c in conversations)
    assert len(gateway.stored) == total == run.created and run.deduplicated == 0
    assert run.retries == 3
    # With one call in flight, the first acceptance follows the last refusal; the two
    # 0.3 s hints were both honoured before it.
    assert gateway.accepted_at[0] - gateway.refused_at[0] >= 0.6


async def test_concurrency_halves_on_overload_and_never_exceeds_the_ceiling(
    serve: Any, tmp_path: Path
) -> None:
    busy = (grpc.StatusCode.RESOURCE_EXHAUSTED, 0.05, False)
    gateway = Gateway([busy] * 4)
    settings = await serve(gateway)
    conversations = _archive(tmp_path, conversations=6)
    run = await replay.replay_all(settings, conversations, _ledger(tmp_path), concurrency=4)
    assert len(gateway.stored) == run.created == sum(len(c.turns) for c in conversations)
    assert gateway.most_in_flight <= 4


async def test_a_refused_call_is_retried_with_a_longer_deadline(serve: Any, tmp_path: Path) -> None:
    """RESOURCE_EXHAUSTED (a queue longer than the call's deadline) and DEADLINE_EXCEEDED
    both double the next try's deadline, so a batch a slow embedder needs longer for
    than the default still lands."""
    script = [
        (grpc.StatusCode.RESOURCE_EXHAUSTED, 0.01, False),
        (grpc.StatusCode.DEADLINE_EXCEEDED, None, False),
    ]
    gateway = Gateway(script)
    settings = await serve(gateway)  # timeout_seconds=5
    conversations = _archive(tmp_path, conversations=1)
    run = await replay.replay_all(settings, conversations, _ledger(tmp_path), concurrency=1)
    assert run.retries == 2 and len(gateway.stored) == run.created
    first, second, third = gateway.deadlines[:3]
    assert first is not None and second is not None and third is not None
    # grpc rounds the deadline it sends up a little (~0.1 s seen at 10 s).
    assert first <= 5.2 and 9.5 < second <= 10.3 and 19.5 < third <= 20.5


def test_limiter_is_aimd() -> None:
    async def main() -> None:
        limiter = replay.Limiter(8)
        epoch = limiter.epoch
        for _ in range(5):  # one wave of refusals cuts once
            limiter.overloaded(epoch)
        assert limiter.limit == 4
        limiter.overloaded(limiter.epoch)
        limiter.overloaded(limiter.epoch)
        limiter.overloaded(limiter.epoch)
        assert limiter.limit == 1  # never below one
        for _ in range(replay.ADD_AFTER * 20):
            await limiter.succeeded()
        assert limiter.limit == 8  # grown back one at a time, capped at the ceiling

    asyncio.run(main())


async def test_a_quota_waiting_cannot_free_fails_at_once(serve: Any, tmp_path: Path) -> None:
    """RESOURCE_EXHAUSTED with QuotaFailure and no RetryInfo (max_stored_turns) is final."""
    gateway = Gateway([(grpc.StatusCode.RESOURCE_EXHAUSTED, None, True)])
    settings = await serve(gateway)
    started = time.monotonic()
    with pytest.raises(grpc.aio.AioRpcError) as caught:
        await replay.replay_all(settings, _archive(tmp_path), _ledger(tmp_path), concurrency=1)
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert time.monotonic() - started < 2


async def test_gives_up_after_the_patience_window(serve: Any, tmp_path: Path) -> None:
    gateway = Gateway([(grpc.StatusCode.DEADLINE_EXCEEDED, None, False)] * 1000)
    settings = await serve(gateway)
    with pytest.raises(replay.GiveUp, match=r"accepted nothing for .* DEADLINE_EXCEEDED"):
        await replay.replay_all(
            settings, _archive(tmp_path), _ledger(tmp_path), concurrency=2, patience=1.5
        )


async def test_acknowledged_sessions_are_recorded_and_skipped(serve: Any, tmp_path: Path) -> None:
    gateway = Gateway([])
    settings = await serve(gateway)
    conversations = _archive(tmp_path, conversations=2)
    ledger = _ledger(tmp_path)
    ledger.record("conv-0", 1)
    ledger.record("conv-1", 3)
    saved = json.loads((tmp_path / "progress.json").read_text())
    assert saved == {"fingerprint": "fp", "sessions": {"conv-0": [1], "conv-1": [3]}}
    reopened = _ledger(tmp_path)
    run = await replay.replay_all(settings, conversations, reopened, concurrency=2)
    assert run.skipped == 8 and run.sent == run.created == 16
    assert ("conv-0", "D1:1") not in {(u, c) for u, c in gateway.stored}
    other_input = replay.Ledger.open(tmp_path / "progress.json", "other", restart=False)
    assert not other_input.is_done("conv-0", 1)  # its record is for another version
    restarted = replay.Ledger.open(tmp_path / "progress.json", "fp", restart=True)
    assert not restarted.is_done("conv-0", 1)
