"""What a turn's token count means: the turn as the model reads it in the prompt.

The prompt format is the injection host's `gemma-turns-v1` (docs/injection.md): each
turn is one line `<start_of_turn>{user|model}\n{text}<end_of_turn>\n`. A turn is counted
as that line, without <bos>, so the window's tokens are the sum of its turns' (measured:
over a whole LoCoMo conversation the per-line counts sum exactly to the count of the
concatenated lines, because each line starts at a special token). Gemma has no system or
tool role: those turns are counted as user lines, as a prompt builder would have to
render them.
"""

from __future__ import annotations

from hippo_summariser.domain.models import Role

START, END = "<start_of_turn>", "<end_of_turn>"


def render_line(role: Role, text: str) -> str:
    speaker = "model" if role is Role.ASSISTANT else "user"
    return f"{START}{speaker}\n{text}{END}\n"
