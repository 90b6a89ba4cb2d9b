"""Attendable key/value states (MemoryStates) as bytes: the memtok store's `states`
column and the wire form of `Attendable.states` (PlanInfluence hands a plan's states to
Generate through the gateway).

A record: a header (magic, packing, from_layer, layers, KV heads, tokens, head dim, the
model id's length), the model id (UTF-8), the keys, then the values. float16 little-endian,
or int8 with one float32 scale per (layer, head, token) row (a compressed memtok's): a
row's largest magnitude maps to 127, so each value is off by at most 1/254 of its row's
peak.
"""

from __future__ import annotations

import struct

import numpy as np

from hippo_injection.domain.memtok.models import Packing
from hippo_injection.domain.types import MemoryStates

_STATES = struct.Struct("<4sB6H")  # magic, packing, from_layer, layers, heads, tokens,
# head_dim, model id bytes
_MAGIC = b"HMS1"
_PACKINGS = {Packing.FLOAT16: 0, Packing.INT8: 1}
_CODES = {v: k for k, v in _PACKINGS.items()}


def _pack_rows(array: np.ndarray, packing: Packing) -> bytes:
    if packing is Packing.FLOAT16:
        return np.ascontiguousarray(array, dtype="<f2").tobytes()
    rows = np.asarray(array, dtype=np.float32)
    peak = np.abs(rows).max(axis=-1, keepdims=True)
    scale = np.where(peak > 0, peak / 127.0, 1.0).astype("<f4")
    quantised = np.clip(np.round(rows / scale), -127, 127).astype(np.int8)
    return bytes(scale.tobytes()) + bytes(quantised.tobytes())


def _unpack_rows(
    blob: memoryview, shape: tuple[int, ...], packing: Packing
) -> tuple[np.ndarray, int]:
    """The array of `shape` at the start of `blob` (float16), and the bytes it took."""
    count = int(np.prod(shape))
    if packing is Packing.FLOAT16:
        size = 2 * count
        return np.frombuffer(blob[:size], dtype="<f2").reshape(shape).astype(np.float16), size
    rows = count // shape[-1]
    scale = np.frombuffer(blob[: 4 * rows], dtype="<f4").reshape(*shape[:-1], 1)
    data = np.frombuffer(blob[4 * rows : 4 * rows + count], dtype=np.int8).reshape(shape)
    return (data.astype(np.float32) * scale).astype(np.float16), 4 * rows + count


def pack_states(states: MemoryStates, packing: Packing = Packing.FLOAT16) -> bytes:
    layers, heads, tokens, head_dim = states.keys.shape
    model = states.model_id.encode("utf-8")
    header = _STATES.pack(
        _MAGIC, _PACKINGS[packing], states.from_layer, layers, heads, tokens, head_dim, len(model)
    )
    return header + model + _pack_rows(states.keys, packing) + _pack_rows(states.values, packing)


def unpack_states(blob: bytes) -> MemoryStates:
    """ValueError when `blob` is not a whole record (a client's bytes reach this too)."""
    view = memoryview(blob)
    if len(view) < _STATES.size:
        raise ValueError("not a memory states record")
    magic, code, from_layer, layers, heads, tokens, head_dim, named = _STATES.unpack_from(view)
    if magic != _MAGIC or code not in _CODES or from_layer >= max(layers, 1):
        raise ValueError("not a memory states record")
    packing = _CODES[code]
    at = _STATES.size + named
    model_id = bytes(view[_STATES.size : at]).decode("utf-8", errors="strict")
    row_bytes = 2 * head_dim if packing is Packing.FLOAT16 else 4 + head_dim
    rows = (2 * layers - from_layer) * heads * tokens
    if len(view) != at + rows * row_bytes:
        raise ValueError("not a memory states record: wrong length")
    keys, used = _unpack_rows(view[at:], (layers, heads, tokens, head_dim), packing)
    values, _ = _unpack_rows(
        view[at + used :], (layers - from_layer, heads, tokens, head_dim), packing
    )
    return MemoryStates(model_id, from_layer, keys, values)
