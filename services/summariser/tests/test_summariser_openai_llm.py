"""The merge LLM's OpenAI-compatible adapter against a real server: the injection service's
/v1 routes on loopback (Gemma 3 270M, greedy, a few tokens), next to the TGI adapter on
the same host; the merge prompt's stop sequences; errors as the merger's two kinds; the
background mark; and the API key kept out of reprs and logs."""

from __future__ import annotations

import logging

import pytest
from pydantic import SecretStr
from summariser_harness import Injection

from hippo_core.listen import reserve_port
from hippo_summariser.__main__ import merge_llm
from hippo_summariser.adapters.openai_llm import OpenAiLlm
from hippo_summariser.adapters.tgi_llm import Generation, TgiLlm
from hippo_summariser.domain import prompt
from hippo_summariser.domain.ports import LlmRejected, LlmUnavailable
from hippo_summariser.settings import SummariserSettings

# The shape of a merge prompt: examples, then the line the model continues (stops at \n).
MERGE = (
    "Conversation: User: I met Dana at the bakery on Pine Street.\n"
    "Summary: The user met Dana at the bakery on Pine Street.\n\n"
    "Conversation: User: My adoption interview is on 12 June at 10am.\n"
    "Summary:"
)
SECRET = "sk-test-do-not-log-0123456789"


def _openai(url: str, style: str = "completions") -> OpenAiLlm:
    return OpenAiLlm(url, SecretStr(""), "google/gemma-3-270m", style, 60, Generation(), 2)  # type: ignore[arg-type]


async def test_a_merge_completion_with_stop_sequences(injection: Injection) -> None:
    done = await _openai(injection.http).complete(MERGE, max_new_tokens=24, stop=prompt.STOP)
    tgi = await TgiLlm(injection.http, 60, Generation()).complete(
        MERGE, max_new_tokens=24, stop=prompt.STOP
    )
    assert done.text.strip() and done.cut_by_length == tgi.cut_by_length
    assert done.tokens == tgi.tokens > 0
    # OpenAI's reply stops before the stop sequence; TGI's includes it.
    assert tgi.text.startswith(done.text) and "\n" not in done.text
    if not tgi.cut_by_length:
        assert any(tgi.text[len(done.text) :].startswith(s) for s in prompt.STOP)
    cut = await _openai(injection.http).complete(MERGE, max_new_tokens=2, stop=prompt.STOP)
    assert cut.cut_by_length and cut.tokens == 2
    chat = await _openai(injection.http, "chat").complete(MERGE, max_new_tokens=4, stop=())
    assert chat.tokens > 0


async def test_errors_are_rejected_or_unavailable(injection: Injection) -> None:
    with pytest.raises(LlmRejected, match="max_new_tokens"):
        await _openai(injection.http).complete(MERGE, max_new_tokens=5000, stop=())
    with pytest.raises(LlmUnavailable):
        await _openai(f"http://127.0.0.1:{reserve_port()}").complete(
            MERGE, max_new_tokens=2, stop=()
        )


def test_settings_choose_the_backend_mark_merges_background_and_keep_the_key_secret(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Invariant: the API key is sent, but never in a repr, a dump or a log line; merges
    are background work with either backend."""
    caplog.set_level(logging.DEBUG)
    assert isinstance(merge_llm(SummariserSettings(), None), TgiLlm)
    settings = SummariserSettings(
        llm_backend="openai",
        llm_url="http://vllm:8000/v1",
        llm_api_key=SecretStr(SECRET),
        llm_model="Qwen/Qwen3-8B",
    )
    adapter = merge_llm(settings, None)
    assert isinstance(adapter, OpenAiLlm)
    client = adapter._client
    assert client.api_key == SECRET and str(client.base_url) == "http://vllm:8000/v1/"
    assert client.default_headers["X-Hippo-Priority"] == "background"
    logging.getLogger("hippo.test").info("settings %s %r llm %r", settings, settings, adapter)
    for text in [repr(settings), settings.model_dump_json(), repr(adapter), caplog.text]:
        assert SECRET not in text
