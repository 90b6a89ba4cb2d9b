"""The injection service through real gRPC, in its own process, with the real model."""

from __future__ import annotations

import time
from pathlib import Path

import grpc
import numpy as np
import pytest
from google.rpc import error_details_pb2, status_pb2
from tokenizers import Tokenizer

from hippo.injection.v1 import injection_pb2 as pb
from hippo.injection.v1 import injection_pb2_grpc
from hippo_core.testing import ServiceProcess, metric, scrape

Stub = injection_pb2_grpc.InjectionServiceStub
PROMPT = "The capital of France is"


def _foreign_states() -> bytes:
    """A well-formed states record of another model (18 layers, as Gemma 3 270M)."""
    import numpy as np

    from hippo_injection.adapters.states_codec import pack_states
    from hippo_injection.domain.types import MemoryStates

    keys = np.zeros((18, 1, 2, 4), dtype=np.float16)
    return pack_states(MemoryStates("another-model", 6, keys, keys[6:]))


_FOREIGN_STATES = _foreign_states()


def _generate(
    stub: Stub, request: pb.GenerateRequest, timeout: float = 60
) -> list[pb.GenerateResponse]:
    return list(stub.Generate(request, timeout=timeout))


def _field_violation(err: grpc.RpcError) -> str:
    raw = dict(err.trailing_metadata() or ())["grpc-status-details-bin"]  # type: ignore[attr-defined]
    bad = error_details_pb2.BadRequest()
    for detail in status_pb2.Status.FromString(raw).details:
        if detail.Unpack(bad):
            return str(bad.field_violations[0].field)
    raise AssertionError("no BadRequest detail")


def test_info_describes_the_model(stub: Stub) -> None:
    info = stub.Info(pb.InfoRequest(), timeout=10)
    assert (info.layers, info.hidden_size, info.vocab_size) == (18, 640, 262144)
    assert info.dtype == "float32" and info.device == "cpu" and info.context_length == 4096
    assert len(info.layer_mean_norms) == 18 and all(n > 0 for n in info.layer_mean_norms)
    assert info.prompt_format == "gemma-turns-v1" and info.vector_encoding == "float32-le"
    assert info.max_waiting == 1 and info.max_strength == 8


def test_count_tokens_is_exact_for_text_and_messages(stub: Stub, model_dir: Path) -> None:
    tokenizer = Tokenizer.from_file(str(model_dir / "tokenizer.json"))
    text = stub.CountTokens(pb.CountTokensRequest(text="Hello there, Hippo!"), timeout=10)
    assert text.tokens == 1 + len(
        tokenizer.encode("Hello there, Hippo!", add_special_tokens=False).ids
    )
    assert text.context_length == 4096
    messages = [
        pb.ChatMessage(role=pb.ROLE_SYSTEM, content="Answer in one word."),
        pb.ChatMessage(role=pb.ROLE_USER, content="What colour is the sky?"),
    ]
    chat = stub.CountTokens(pb.CountTokensRequest(messages=messages), timeout=10)
    assert chat.formatted == (
        "<start_of_turn>user\nAnswer in one word.\n\nWhat colour is the sky?<end_of_turn>\n"
        "<start_of_turn>model\n"
    )
    ids = tokenizer.encode(chat.formatted, add_special_tokens=False).ids
    assert chat.tokens == 1 + len(ids) and ids[0] == 105  # <start_of_turn> is one token
    # The count is the one Generate uses: its finish reports the same prompt size.
    reply = _generate(stub, pb.GenerateRequest(messages=messages, max_new_tokens=1))
    assert reply[-1].finish.prompt_tokens == chat.tokens


def test_generate_streams_tokens_that_add_up_to_the_reply(stub: Stub) -> None:
    request = pb.GenerateRequest(prompt=PROMPT, max_new_tokens=6)
    replies = _generate(stub, request)
    finish = replies[-1].finish
    assert all(not r.HasField("finish") for r in replies[:-1])
    assert finish.reason in (pb.FINISH_REASON_LENGTH, pb.FINISH_REASON_EOS_TOKEN)
    assert finish.generated_tokens == len(replies) and finish.seed == 0
    text = "".join(r.token.text for r in replies if not r.token.special)
    assert text == finish.generated_text and text.strip()
    assert all(r.token.logprob <= 0 for r in replies)
    assert [r.token.id for r in _generate(stub, request)] == [r.token.id for r in replies]


def test_stop_sequence_ends_the_reply(stub: Stub) -> None:
    first = _generate(stub, pb.GenerateRequest(prompt=PROMPT, max_new_tokens=6))
    stop = next(r.token.text for r in first[1:] if r.token.text.strip())
    replies = _generate(
        stub, pb.GenerateRequest(prompt=PROMPT, max_new_tokens=6, stop_sequences=[stop])
    )
    finish = replies[-1].finish
    assert finish.reason == pb.FINISH_REASON_STOP_SEQUENCE
    assert stop in finish.generated_text and len(replies) < len(first)


def test_sampling_with_a_seed_is_reproducible(stub: Stub) -> None:
    sampling = pb.Sampling(do_sample=True, temperature=1.0, top_k=50, top_p=0.95, seed=7)
    request = pb.GenerateRequest(prompt=PROMPT, max_new_tokens=5, sampling=sampling)
    a, b = _generate(stub, request), _generate(stub, request)
    assert [r.token.id for r in a] == [r.token.id for r in b] and a[-1].finish.seed == 7
    unseeded = pb.GenerateRequest(
        prompt=PROMPT, max_new_tokens=1, sampling=pb.Sampling(do_sample=True)
    )
    assert _generate(stub, unseeded)[-1].finish.seed != 0  # picked and reported


def _vector(values: np.ndarray) -> bytes:
    return values.astype("<f4").tobytes()


GOOD = _vector(np.ones(640))


@pytest.mark.parametrize(
    ("influence", "field", "fragment"),
    [
        (
            pb.Influence(vector=_vector(np.ones(639)), layer=6, strength=1),
            "influences[0].vector",
            "must hold 640 float32 values (2560 bytes), got 639",
        ),
        (
            pb.Influence(vector=GOOD + b"\x00", layer=6, strength=1),
            "influences[0].vector",
            "whole float32 values (4 bytes each), got 2561 bytes",
        ),
        (
            pb.Influence(
                vector=_vector(np.r_[np.ones(3), np.nan, np.ones(636)]), layer=6, strength=1
            ),
            "influences[0].vector",
            "NaN or inf at index 3",
        ),
        (
            pb.Influence(
                vector=_vector(np.r_[np.ones(9), -np.inf, np.ones(630)]), layer=6, strength=1
            ),
            "influences[0].vector",
            "NaN or inf at index 9",
        ),
        (
            pb.Influence(vector=GOOD, layer=18, strength=1),
            "influences[0].layer",
            "must be 0 to 17, got 18",
        ),
        (
            pb.Influence(vector=GOOD, layer=6, strength=9),
            "influences[0].strength",
            "within ±8, got 9",
        ),
        (
            pb.Influence(vector=GOOD, layer=6, strength=float("inf")),
            "influences[0].strength",
            "finite",
        ),
    ],
)
def test_bad_influence_is_invalid_argument_naming_the_field(
    stub: Stub, influence: pb.Influence, field: str, fragment: str
) -> None:
    for call in (
        lambda: _generate(stub, pb.GenerateRequest(prompt=PROMPT, influences=[influence])),
        lambda: stub.Score(
            pb.ScoreRequest(prompt=PROMPT, continuation=" Paris", influences=[influence]),
            timeout=30,
        ),
    ):
        with pytest.raises(grpc.RpcError) as caught:
            call()
        err = caught.value
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
        assert err.details().startswith(f"{field}: ") and fragment in err.details()  # type: ignore[attr-defined]
        assert _field_violation(err) == field


@pytest.mark.parametrize(
    ("request_", "field"),
    [
        (pb.GenerateRequest(), "prompt"),
        (
            pb.GenerateRequest(
                prompt="x", messages=[pb.ChatMessage(role=pb.ROLE_USER, content="y")]
            ),
            "prompt",
        ),
        (pb.GenerateRequest(prompt="x", max_new_tokens=5000), "max_new_tokens"),
        (
            pb.GenerateRequest(prompt="x", stop_sequences=["a", "b", "c", "d", "e"]),
            "stop_sequences",
        ),
        (
            pb.GenerateRequest(prompt="x", sampling=pb.Sampling(do_sample=True, top_p=1.5)),
            "sampling.top_p",
        ),
        (
            pb.GenerateRequest(prompt="x", attendable=pb.Attendable(texts=["m"], from_layer=30)),
            "attendable.from_layer",
        ),
        (pb.GenerateRequest(messages=[pb.ChatMessage(content="no role")]), "messages[0].role"),
        (
            pb.GenerateRequest(prompt="x", attendable=pb.Attendable(states=[b"not states"])),
            "attendable.states[0]",
        ),
        (
            pb.GenerateRequest(prompt="x", attendable=pb.Attendable(states=[_FOREIGN_STATES])),
            "attendable.states[0]",
        ),
    ],
)
def test_bad_generate_request_is_invalid_argument(
    stub: Stub, request_: pb.GenerateRequest, field: str
) -> None:
    with pytest.raises(grpc.RpcError) as caught:
        _generate(stub, request_)
    assert caught.value.code() == grpc.StatusCode.INVALID_ARGUMENT  # type: ignore[attr-defined]
    assert _field_violation(caught.value) == field


def test_value_vector_influence_changes_the_scores(stub: Stub) -> None:
    made = stub.MakeValueVector(
        pb.MakeValueVectorRequest(
            text="My favourite colour is teal.",
            layer=13,
            subtract_baseline=True,
            scale_to_layer_norm=True,
        ),
        timeout=60,
    )
    vector = np.frombuffer(made.vector, "<f4")
    assert made.dimension == 640 == vector.size and made.layer == 13 and made.tokens > 3
    assert made.norm == pytest.approx(made.layer_mean_norm, rel=1e-3)
    question = "Question: What is my favourite colour?\nAnswer:"
    plain = stub.Score(pb.ScoreRequest(prompt=question, continuation=" teal"), timeout=30)
    influenced = stub.Score(
        pb.ScoreRequest(
            prompt=question,
            continuation=" teal",
            influences=[pb.Influence(vector=made.vector, layer=13, strength=0.5)],
        ),
        timeout=30,
    )
    assert list(plain.token_ids) == list(influenced.token_ids)
    assert abs(influenced.total_logprob - plain.total_logprob) > 0.1
    as_memory = stub.Score(
        pb.ScoreRequest(
            prompt=question,
            continuation=" teal",
            attendable=pb.Attendable(texts=["My favourite colour is teal."]),
        ),
        timeout=30,
    )
    assert as_memory.total_logprob > plain.total_logprob  # the memory is used


def _wait_metric(server: ServiceProcess, name: str, value: float, timeout: float = 60) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if metric(scrape(server.metrics_url), name) == value:
            return
        time.sleep(0.05)
    raise AssertionError(f"{name} never reached {value}")


def test_full_queue_is_resource_exhausted_and_cancel_frees_the_model(
    stub: Stub, server: ServiceProcess
) -> None:
    from text_generation import Client
    from text_generation.errors import OverloadedError

    long = pb.GenerateRequest(prompt=PROMPT, max_new_tokens=400)
    running = stub.Generate(long, timeout=120)
    next(running)  # the first request holds the model
    waiting = stub.Generate(long, timeout=120)
    _wait_metric(server, "hippo_injection_queue_depth", 1)
    with pytest.raises(grpc.RpcError) as caught:
        _generate(stub, pb.GenerateRequest(prompt=PROMPT, max_new_tokens=1))
    assert caught.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED  # type: ignore[attr-defined]
    assert "max_waiting=1" in caught.value.details()  # type: ignore[attr-defined]
    with pytest.raises(OverloadedError):
        Client(server.http, timeout=30).generate(PROMPT, max_new_tokens=1)  # type: ignore[attr-defined]
    running.cancel()
    waiting.cancel()
    _wait_metric(server, "hippo_injection_queue_depth", 0)
    # Cancelled callers stopped generating: a new request gets the model and finishes.
    assert _generate(stub, pb.GenerateRequest(prompt=PROMPT, max_new_tokens=2), timeout=60)


def test_deadline_stops_generation(stub: Stub, server: ServiceProcess) -> None:
    before = metric(scrape(server.metrics_url), "hippo_injection_generated_tokens_total")
    with pytest.raises(grpc.RpcError) as caught:
        _generate(stub, pb.GenerateRequest(prompt=PROMPT, max_new_tokens=1000), timeout=2)
    assert caught.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED  # type: ignore[attr-defined]
    assert _generate(stub, pb.GenerateRequest(prompt=PROMPT, max_new_tokens=1), timeout=60)
    after = metric(scrape(server.metrics_url), "hippo_injection_generated_tokens_total")
    assert after - before == 1  # the abandoned reply was never counted as finished
