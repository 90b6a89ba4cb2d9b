"""The prompt format, "gemma-turns-v1": Gemma's turn markers on a base model.

The GGUF ships no chat template, but Gemma's control tokens are in its vocabulary
(`<start_of_turn>` = 105, `<end_of_turn>` = 106), so conversations use Gemma's own
layout: a prompt written this way also works unchanged on an instruction-tuned Gemma
behind a real TGI server. Other services count tokens and build prompts with it, so
CountTokens renders through this module exactly as Generate does.

    <start_of_turn>user
    {system}\n\n{user}<end_of_turn>
    <start_of_turn>model
    {assistant}<end_of_turn>
    <start_of_turn>model          <- opened for the reply

<bos> is not part of the text: the engine puts the id in front of every prompt.
"""

from __future__ import annotations

from collections.abc import Sequence

from hippo_core.errors import InvalidArgument
from hippo_injection.domain.types import Message, Prompt, Role

NAME = "gemma-turns-v1"
START = "<start_of_turn>"
END = "<end_of_turn>"
_ROLE = {Role.USER: "user", Role.ASSISTANT: "model"}


def render_messages(messages: Sequence[Message]) -> str:
    """The conversation as text, ending with an opened model turn."""
    return "".join(render_parts(messages))


def render_parts(messages: Sequence[Message]) -> list[str]:
    """`render_messages` in pieces: each marker (START, END) is a piece of its own, so
    the messages' text can be tokenised as plain text and the markers as control ids."""
    system = [m.content for m in messages if m.role is Role.SYSTEM]
    turns = [m for m in messages if m.role is not Role.SYSTEM]
    if messages and messages[0].role is not Role.SYSTEM and system:
        raise InvalidArgument("messages", "a system message may only come first")
    if len(system) > 1:
        raise InvalidArgument("messages", f"at most 1 system message, got {len(system)}")
    if not turns:
        raise InvalidArgument("messages", "must hold at least 1 user or assistant message")
    parts: list[str] = []
    for i, message in enumerate(turns):
        content = message.content
        if i == 0 and system:
            # Gemma's own template folds the system text into the first user turn.
            if message.role is not Role.USER:
                raise InvalidArgument("messages", "a system message must be followed by a user one")
            content = f"{system[0]}\n\n{content}"
        parts += [START, f"{_ROLE[message.role]}\n{content}", END, "\n"]
    parts += [START, "model\n"]
    return parts


def render(prompt: Prompt) -> str:
    """The text Generate tokenises (after <bos>) for this prompt."""
    if prompt.text is not None:
        return prompt.text
    return render_messages(prompt.messages)
