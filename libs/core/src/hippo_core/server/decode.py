"""Request decoding that turns malformed text into INVALID_ARGUMENT naming the field.

Protobuf rejects a string field that is not valid UTF-8 (a lone surrogate sent by a
Java or Go client, a truncated character) with a DecodeError; grpc would answer that
with INTERNAL before any of our code runs. We decode ourselves and, on failure, scan the
wire format to name the offending field (`texts[3]`, `turns[0].text`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from google.protobuf.descriptor import Descriptor, FieldDescriptor
from google.protobuf.message import DecodeError

from hippo_core.errors import InvalidArgument


class Undecodable:
    """Stands in for a request that could not be decoded; the handler raises `error`."""

    def __init__(self, error: InvalidArgument) -> None:
        self.error = error


def tolerant(deserializer: Callable[[bytes], Any] | None) -> Callable[[bytes], Any] | None:
    """Wrap a generated `Message.FromString` so decode errors become `Undecodable`."""
    if deserializer is None:
        return None
    message_cls = getattr(deserializer, "__self__", None)
    descriptor = getattr(message_cls, "DESCRIPTOR", None)

    def decode(data: bytes) -> Any:
        try:
            return deserializer(data)
        except DecodeError:
            field = None if descriptor is None else find_bad_utf8(data, descriptor)
            if field is not None:
                problem = "is not valid UTF-8 (a lone surrogate or a truncated character)"
                return Undecodable(InvalidArgument(field, problem, reason="INVALID_UTF8"))
            return Undecodable(InvalidArgument("request", "is not a valid protobuf message"))

    return decode


def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data) or shift > 63:
            raise IndexError("truncated varint")
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, pos
        shift += 7


def find_bad_utf8(data: bytes, descriptor: Descriptor, prefix: str = "") -> str | None:
    """The path of the first string field whose bytes are not UTF-8, or None."""
    seen: dict[int, int] = {}
    pos = 0
    try:
        while pos < len(data):
            key, pos = _varint(data, pos)
            number, wire_type = key >> 3, key & 7
            if wire_type == 0:
                _, pos = _varint(data, pos)
            elif wire_type == 1:
                pos += 8
            elif wire_type == 5:
                pos += 4
            elif wire_type == 2:
                size, pos = _varint(data, pos)
                chunk, pos = data[pos : pos + size], pos + size
                field = descriptor.fields_by_number.get(number)
                if field is None:
                    continue
                index = seen[number] = seen.get(number, -1) + 1
                name = prefix + field.name + (f"[{index}]" if field.is_repeated else "")
                if field.type == FieldDescriptor.TYPE_STRING:
                    try:
                        chunk.decode("utf-8")
                    except UnicodeDecodeError:
                        return name
                elif field.type == FieldDescriptor.TYPE_MESSAGE and field.message_type:
                    found = find_bad_utf8(chunk, field.message_type, name + ".")
                    if found is not None:
                        return found
            else:  # groups are not used in proto3; give up rather than guess
                return None
    except IndexError:
        return None
    return None
