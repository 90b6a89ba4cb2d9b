"""The summariser as a real process over gRPC: real CountTokens (Gemma's tokenizer in the
injection service), a real HTTP server speaking TGI's API as the merge LLM."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
from summariser_harness import Injection, append, exchange, flush, get, ready, stub, summariser
from tgi_double import TgiDouble, echo, last_case, note, said

from hippo.memory.v1 import memory_pb2
from hippo.summariser.v1 import summariser_pb2 as pb
from hippo.summariser.v1 import summariser_pb2_grpc
from hippo_core.testing import ServiceProcess, metric, scrape


@pytest.fixture
def server(
    tmp_path: Path, injection: Injection, tgi: TgiDouble
) -> Iterator[tuple[ServiceProcess, summariser_pb2_grpc.SummariserServiceStub]]:
    with summariser(tmp_path / "data", injection.addr, tgi.url) as proc:
        ready(proc)
        yield proc, stub(proc)


def test_turns_are_counted_with_the_models_tokenizer_as_chat_template_lines(
    server: tuple[ServiceProcess, summariser_pb2_grpc.SummariserServiceStub],
    injection: Injection,
) -> None:
    _, s = server
    turns = exchange(0)
    reply = append(s, turns)
    assert (reply.version, reply.appended, reply.merge_pending) == (1, 2, False)
    state = get(s)
    want = [
        injection.count(f"<start_of_turn>user\n{turns[0].text}<end_of_turn>\n"),
        injection.count(f"<start_of_turn>model\n{turns[1].text}<end_of_turn>\n"),
    ]
    assert [t.tokens for t in state.window] == want
    # The window's tokens are those of the rendered window, to the token.
    rendered = "".join(
        f"<start_of_turn>{'user' if t.role == memory_pb2.ROLE_USER else 'model'}\n"
        f"{t.text}<end_of_turn>\n"
        for t in state.window
    )
    assert state.window_tokens == sum(want) == injection.count(rendered)
    assert (state.window_budget, state.summary_budget, state.turns_total) == (96, 192, 2)
    assert [t.speaker for t in state.window] == ["Ada", "Bot"]
    assert append(s, turns).appended == 0  # a retried Remember changes nothing
    assert get(s).version == 1


def test_an_unknown_session_answers_empty_with_version_zero(
    server: tuple[ServiceProcess, summariser_pb2_grpc.SummariserServiceStub],
) -> None:
    state = get(server[1], session="never")
    assert (state.version, len(state.window), state.summary, state.merge_pending) == (
        0,
        0,
        "",
        False,
    )


def test_session_versions_answers_a_page_of_sessions_at_once(
    server: tuple[ServiceProcess, summariser_pb2_grpc.SummariserServiceStub],
) -> None:
    stub_ = server[1]
    append(stub_, exchange(0), user="versions", session="a")
    after = append(stub_, exchange(1), user="versions", session="b")
    request = pb.SessionVersionsRequest(
        tenant="acme", user_id="versions", session_ids=["a", "b", "never"]
    )
    versions = dict(stub_.SessionVersions(request, timeout=10).versions)
    assert versions == {"a": get(stub_, user="versions", session="a").version, "b": after.version}
    assert all(v > 0 for v in versions.values())
    for bad, field in [
        (pb.SessionVersionsRequest(tenant="acme", user_id="versions"), "session_ids"),
        (pb.SessionVersionsRequest(user_id="versions", session_ids=["a"]), "tenant"),
        (
            pb.SessionVersionsRequest(tenant="acme", user_id="v", session_ids=["a"] * 1001),
            "session_ids",
        ),
    ]:
        with pytest.raises(grpc.RpcError) as err:
            stub_.SessionVersions(bad, timeout=10)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert err.value.details().startswith(f"{field}: ")


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (pb.AppendRequest(user_id="u", session_id="s", turns=exchange(0)), "tenant"),
        (pb.AppendRequest(tenant="t", user_id="u", session_id="s"), "turns"),
        (
            pb.AppendRequest(
                tenant="t",
                user_id="u",
                session_id="s",
                turns=[pb.SessionTurn(memory_id="m", text="hi")],
            ),
            "turns[0].role",
        ),
        (
            pb.AppendRequest(
                tenant="t",
                user_id="u",
                session_id="s",
                turns=[pb.SessionTurn(memory_id="m", role=memory_pb2.ROLE_USER, text="x" * 40000)],
            ),
            "turns[0].text",
        ),
        (
            pb.AppendRequest(tenant="t", user_id="u" * 200, session_id="s", turns=exchange(0)),
            "user_id",
        ),
    ],
)
def test_bad_appends_are_refused_naming_the_field(
    server: tuple[ServiceProcess, summariser_pb2_grpc.SummariserServiceStub],
    request_: pb.AppendRequest,
    field: str,
) -> None:
    with pytest.raises(grpc.RpcError) as err:
        server[1].Append(request_, timeout=10)
    assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert err.value.details().startswith(f"{field}: ")


def test_each_merge_sends_only_the_old_summary_and_the_newly_dropped_turns(
    server: tuple[ServiceProcess, summariser_pb2_grpc.SummariserServiceStub], tgi: TgiDouble
) -> None:
    proc, s = server
    texts = {}
    merges = 0
    for i in range(12):
        turns = exchange(i)
        texts.update({t.memory_id: t for t in turns})
        before = get(s)
        seen = len(tgi.requests)
        append(s, turns)
        after = flush(s)
        assert not after.merge_pending
        window_ids = {t.memory_id for t in after.window}
        dropped = [t for t in [*before.window, *turns] if t.memory_id not in window_ids]
        prompts = tgi.prompts()[seen:]
        if not dropped:
            assert prompts == []
            continue
        merges += 1
        # One prompt per merge here (the echo keeps every fact: no stricter retry).
        assert len(prompts) == 1
        old, lines = last_case(prompts[0])
        assert old == (before.summary or "none yet.")
        assert lines == [f"{t.speaker}: {t.text}" for t in dropped]
        # The LLM's note (the default style restates the summary so far with the dropped
        # turns), as far as the budget allows: the oldest sentences go first.
        assert note(prompts[0]).endswith(after.summary)
        assert said(prompts[0]) in after.summary
        assert after.summary_tokens <= after.summary_budget
    assert merges >= 3
    state = get(s)
    assert state.merge_stats.merges == merges
    assert state.merge_stats.facts == state.merge_stats.facts_kept > 0
    assert state.merge_stats.last_retention == state.merge_stats.last_retention_llm == 1.0
    samples = scrape(proc.metrics_url)
    assert metric(samples, "hippo_summariser_merges_total", result="committed") == merges
    assert metric(samples, "hippo_summariser_merge_retention_count", stage="final") == merges


def test_a_summary_that_lost_numbers_is_repaired_and_retention_is_recorded(
    server: tuple[ServiceProcess, summariser_pb2_grpc.SummariserServiceStub], tgi: TgiDouble
) -> None:
    proc, s = server
    # An LLM that writes good prose but drops every number, even when told to keep them.
    tgi.respond = lambda prompt: "".join(c for c in echo(prompt) if not c.isdigit())
    for i in range(6):
        append(s, exchange(i))
    state = flush(s)
    assert state.merge_stats.merges >= 1
    stats = state.merge_stats
    assert stats.facts_kept_llm < stats.facts == stats.facts_kept
    assert stats.last_retention_llm < 1.0 and stats.last_retention == 1.0
    for i in range(2):  # the first exchanges were merged: their numbers survived
        assert f"{100 + i} euros" in state.summary and f"ZX-{7000 + i}" in state.summary
    assert "Also mentioned:" in state.summary
    strict = [p for p in tgi.prompts() if "Must mention:" in p.rsplit("\n\nSummary: ", 1)[1]]
    assert len(strict) == stats.merges  # one stricter retry per merge, then the repair
    samples = scrape(proc.metrics_url)
    checked = metric(samples, "hippo_summariser_facts_total", stage="checked")
    assert checked == stats.facts
    assert metric(samples, "hippo_summariser_facts_total", stage="kept") == checked
    assert metric(samples, "hippo_summariser_facts_total", stage="kept_llm") < checked
    assert metric(samples, "hippo_summariser_repairs_total", kind="facts_sentence") >= 1


def test_forget_erases_a_summary_built_from_an_erased_turn(
    tmp_path: Path,
    server: tuple[ServiceProcess, summariser_pb2_grpc.SummariserServiceStub],
) -> None:
    _, s = server
    for i in range(6):
        append(s, exchange(i))
    state = flush(s)
    assert "Rosa0" in state.summary
    reply = s.Forget(pb.ForgetRequest(tenant="acme", user_id="u1", memory_ids=["q0"]), timeout=10)
    assert (reply.summaries_erased, reply.turns_removed, reply.sessions_deleted) == (1, 0, 0)
    after = get(s)
    assert after.summary == "" and after.summary_tokens == 0
    assert after.turns_total == state.turns_total - 1
    files = b"".join(p.read_bytes() for p in (tmp_path / "data").iterdir() if p.is_file())
    assert b"Rosa0" not in files
    # A window turn goes without touching the (new) summary; a session goes whole.
    last = after.window[-1].memory_id
    reply = s.Forget(
        pb.ForgetRequest(tenant="acme", user_id="u1", session_id="s1", memory_ids=[last]),
        timeout=10,
    )
    assert (reply.turns_removed, reply.summaries_erased) == (1, 0)
    reply = s.Forget(pb.ForgetRequest(tenant="acme", user_id="u1", session_id="s1"), timeout=10)
    assert reply.sessions_deleted == 1 and get(s).version == 0


def test_tenants_and_users_never_see_each_other(
    server: tuple[ServiceProcess, summariser_pb2_grpc.SummariserServiceStub],
) -> None:
    _, s = server
    append(s, exchange(0), tenant="acme")
    append(s, exchange(1), tenant="globex")
    append(s, exchange(2), tenant="acme", user="u2")
    assert [t.memory_id for t in get(s, tenant="acme").window] == ["q0", "a0"]
    assert [t.memory_id for t in get(s, tenant="globex").window] == ["q1", "a1"]
    assert [t.memory_id for t in get(s, tenant="acme", user="u2").window] == ["q2", "a2"]
    reply = s.Forget(pb.ForgetRequest(tenant="globex", user_id="u1"), timeout=10)
    assert reply.sessions_deleted == 1
    assert [t.memory_id for t in get(s, tenant="acme").window] == ["q0", "a0"]
    # The same memory id in another tenant is another turn.
    assert append(s, exchange(0), tenant="globex").appended == 2


def test_flush_answers_within_its_deadline_while_a_merge_is_held(
    server: tuple[ServiceProcess, summariser_pb2_grpc.SummariserServiceStub], tgi: TgiDouble
) -> None:
    _, s = server
    tgi.released.clear()
    for i in range(6):
        append(s, exchange(i))
    assert tgi.received.wait(30)
    state = flush(s, timeout=3)  # would raise DEADLINE_EXCEEDED if it overran
    assert state.merge_pending and len(state.window) == 12
    tgi.released.set()
    assert not flush(s).merge_pending
