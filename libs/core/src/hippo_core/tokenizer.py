"""A reading model's own tokenizer and prompt format, from its files (no model host).

Token budgets are exact only when counted by the tokenizer of the model that reads the
prompt. With the built-in model the LLM host counts (injection `CountTokens`); a team
that runs its own model (vLLM, TGI, llama.cpp, a hosted API) points `tokenizer_path` at
that model's folder instead, and the gateway and the summariser count here:

- `tokenizer.json` (the Hugging Face `tokenizers` format every HF model ships, and
  llama.cpp's servers accept the same vocabulary) gives the ids;
- `tokenizer_config.json` gives the BOS token and whether a prompt starts with it, and
  the chat template (`chat_template`, or a `chat_template.jinja` file beside it), which
  is rendered the way transformers renders it (a sandboxed Jinja environment with
  `messages`, `bos_token`, `eos_token`, `add_generation_prompt`, `raise_exception`);
- without a template, a plain base-model format (`BASE_FORMAT`): the model gets role
  labels on their own lines, which any base model continues.

A rendered prompt is counted as a server tokenises a prompt string: added tokens in it
(the template's markers) are parsed as such, and the BOS is added when the tokenizer's
post-processor adds one. Stored text reaches the template already neutralised
(`hippo_core.neutralise`), so only the template's own markers are control tokens.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

# role -> label of the base format; a prompt ends with the assistant's label opened.
BASE_LABELS = {"system": "System", "user": "User", "assistant": "Assistant"}
BASE_FORMAT = "base-v1"


@dataclass(frozen=True)
class Rendered:
    text: str
    tokens: int


class ModelTokenizer:
    """Built once per model folder; every method is pure and thread-safe."""

    def __init__(self, path: Path | str, *, context_length: int = 0) -> None:
        folder = Path(path)
        if folder.is_file():  # a tokenizer.json named directly
            folder, file = folder.parent, folder
        else:
            file = folder / "tokenizer.json"
        if not file.is_file():
            raise ValueError(f"tokenizer_path: no tokenizer.json at {file}")
        self._tokenizer = Tokenizer.from_file(str(file))
        self._tokenizer.no_padding()
        self._tokenizer.no_truncation()
        config = _json(folder / "tokenizer_config.json")
        self.bos_token = _token(config.get("bos_token"))
        self.eos_token = _token(config.get("eos_token"))
        template = config.get("chat_template")
        if isinstance(template, list):  # several named templates: the default one
            named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
            template = named.get("default")
        jinja_file = folder / "chat_template.jinja"
        if not template and jinja_file.is_file():
            template = jinja_file.read_text(encoding="utf-8")
        self.chat_template: str | None = template if isinstance(template, str) else None
        self._template = _compile(self.chat_template) if self.chat_template else None
        self.prompt_format = "chat-template" if self._template else BASE_FORMAT
        limit = int(config.get("model_max_length") or 0)
        # HF writes a huge sentinel when the model did not say; then only the setting counts.
        self.context_length = context_length or (limit if 0 < limit < 10**7 else 0)
        self.special_tokens = sorted(
            {t.content for t in self._tokenizer.get_added_tokens_decoder().values() if t.content}
        )

    def count_text(self, text: str) -> int:
        """Tokens of a bare text inside a prompt: no BOS, no format."""
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)

    def render(self, messages: Sequence[tuple[str, str]]) -> str:
        """(role, text) pairs as the prompt string the model reads, its reply opened."""
        if self._template is not None:
            return str(
                self._template.render(
                    messages=[{"role": r, "content": t} for r, t in messages],
                    bos_token=self.bos_token or "",
                    eos_token=self.eos_token or "",
                    add_generation_prompt=True,
                )
            )
        parts = [f"{BASE_LABELS[role]}:\n{text}\n\n" for role, text in messages]
        return "".join(parts) + f"{BASE_LABELS['assistant']}:\n"

    def count_prompt(self, prompt: str) -> int:
        """Tokens of a whole prompt string as a server tokenises it: added tokens parsed,
        the BOS added by the post-processor unless the text already starts with it."""
        # A template that writes the BOS itself: the post-processor must not add another.
        writes_bos = bool(self.bos_token) and prompt.startswith(self.bos_token or "")
        return len(self._tokenizer.encode(prompt, add_special_tokens=not writes_bos).ids)

    def rendered(self, messages: Sequence[tuple[str, str]]) -> Rendered:
        text = self.render(messages)
        return Rendered(text, self.count_prompt(text))


def _json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    loaded = json.loads(path.read_text(encoding="utf-8"))
    return loaded if isinstance(loaded, dict) else {}


def _token(value: object) -> str | None:
    if isinstance(value, dict):  # {"content": "<s>", ...} in older configs
        value = value.get("content")
    return value if isinstance(value, str) and value else None


def _compile(template: str) -> Any:
    """The template as transformers compiles it: sandboxed, blocks trimmed."""
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise TemplateError(message)

    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template)
