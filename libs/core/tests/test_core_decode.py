"""Malformed UTF-8 on the wire is reported by field path, not as INTERNAL."""

from __future__ import annotations

from hippo.embedding.v1 import embedding_pb2
from hippo.memory.v1 import memory_pb2
from hippo_core.server.decode import Undecodable, find_bad_utf8, tolerant

LONE_SURROGATE = b"\xed\xa0\x80"  # U+D800 encoded as if it were a character


def _field(number: int, payload: bytes) -> bytes:
    return bytes([number << 3 | 2, len(payload)]) + payload


def test_repeated_string_names_the_index() -> None:
    data = _field(1, b"fine") + _field(1, b"also fine") + _field(1, b"bad " + LONE_SURROGATE)
    assert find_bad_utf8(data, embedding_pb2.EmbedRequest.DESCRIPTOR) == "texts[2]"


def test_nested_message_path() -> None:
    good = memory_pb2.Turn(text="ok").SerializeToString()
    text_no = memory_pb2.Turn.DESCRIPTOR.fields_by_name["text"].number
    bad = _field(text_no, b"x" + LONE_SURROGATE)
    turns_no = memory_pb2.RememberRequest.DESCRIPTOR.fields_by_name["turns"].number
    data = _field(turns_no, good) + _field(turns_no, bad)
    assert find_bad_utf8(data, memory_pb2.RememberRequest.DESCRIPTOR) == "turns[1].text"


def test_tolerant_decoder_passes_good_and_marks_bad() -> None:
    decode = tolerant(embedding_pb2.EmbedRequest.FromString)
    assert decode is not None
    good = decode(embedding_pb2.EmbedRequest(texts=["héllo"]).SerializeToString())
    assert list(good.texts) == ["héllo"]
    bad = decode(_field(1, LONE_SURROGATE))
    assert isinstance(bad, Undecodable) and bad.error.field == "texts[0]"
    garbage = decode(b"\xff\xff\xff")
    assert isinstance(garbage, Undecodable) and garbage.error.field == "request"
