"""One memtok as a row, the same in SQLite and PostgreSQL: the columns, and the packing of
its vectors.

Value vectors are stored compactly: float16 normally, int8 with one float32 scale for
items compressed before deletion. Key vectors are float32 little-endian (they are also
the key index's source on a rebuild).

An item's attendable states (MemoryStates: its source words' keys and values as the
model computed them) are the `states` column, outside NAMES: tens of KiB each, so they
are read only for the items a plan attends (`states_of`), never with the rows. Packed
as the item's values are: float16, or int8 with one float32 scale per (layer, head,
token) row when the item is compressed."""

from __future__ import annotations

import struct
from collections.abc import Sequence

import numpy as np

from hippo_injection.domain.memtok.models import Memtok, Packing, Source, Vector
from hippo_injection.domain.types import MemoryStates

NAMES = (
    "id", "tenant", "user_id", "word", "source_words", "key", "value", "packing", "scale",
    "layer", "model_id", "count", "keep", "rank_max", "surprise", "emphasis", "stakes",
    "conditional", "source", "created_us", "last_seen_us", "grace_until_us", "resurface_at_us",
)  # fmt: skip
COLUMNS = ", ".join(NAMES)
# Columns an existing row takes from a new write (id, tenant and user never change).
UPDATED = ", ".join(f"{n} = excluded.{n}" for n in NAMES[3:])


def pack(value: Vector, packing: Packing) -> tuple[bytes, float]:
    v = np.asarray(value, dtype=np.float32)
    if packing is Packing.FLOAT16:
        return v.astype("<f2").tobytes(), 1.0
    peak = float(np.abs(v).max()) if v.size else 0.0
    scale = peak / 127.0 if peak > 0 else 1.0
    return np.clip(np.round(v / scale), -127, 127).astype(np.int8).tobytes(), scale


def unpack(blob: bytes, packing: Packing, scale: float) -> Vector:
    if packing is Packing.FLOAT16:
        return np.frombuffer(blob, dtype="<f2").astype(np.float32)
    return (np.frombuffer(blob, dtype=np.int8).astype(np.float32) * scale).astype(np.float32)


def to_row(m: Memtok) -> tuple[object, ...]:
    value, scale = pack(m.value, m.packing)
    return (
        m.id, m.tenant, m.user, m.word, m.source_words,
        np.asarray(m.key, dtype="<f4").tobytes(), value, m.packing.value, scale,
        m.layer, m.model_id, m.count, m.keep, m.rank_max, m.surprise, m.emphasis,
        m.stakes, bool(m.conditional), m.source.value, m.created_us,
        m.last_seen_us, m.grace_until_us, m.resurface_at_us,
    )  # fmt: skip


def from_row(row: Sequence[object]) -> Memtok:
    packing = Packing(str(row[7]))
    return Memtok(
        id=str(row[0]),
        tenant=str(row[1]),
        user=str(row[2]),
        word=str(row[3]),
        source_words=str(row[4]),
        key=np.frombuffer(bytes(row[5]), dtype="<f4").astype(np.float32),  # type: ignore[call-overload]
        value=unpack(bytes(row[6]), packing, float(row[8])),  # type: ignore[call-overload,arg-type]
        packing=packing,
        layer=int(row[9]),  # type: ignore[call-overload]
        model_id=str(row[10]),
        count=int(row[11]),  # type: ignore[call-overload]
        keep=float(row[12]),  # type: ignore[arg-type]
        rank_max=float(row[13]),  # type: ignore[arg-type]
        surprise=float(row[14]),  # type: ignore[arg-type]
        emphasis=float(row[15]),  # type: ignore[arg-type]
        stakes=float(row[16]),  # type: ignore[arg-type]
        conditional=bool(row[17]),
        source=Source(str(row[18])),
        created_us=int(row[19]),  # type: ignore[call-overload]
        last_seen_us=int(row[20]),  # type: ignore[call-overload]
        grace_until_us=int(row[21]),  # type: ignore[call-overload]
        resurface_at_us=int(row[22]),  # type: ignore[call-overload]
    )


_STATES = struct.Struct("<4sB5H")  # magic, packing, from_layer, layers, heads, tokens, head_dim
_MAGIC = b"HMS1"
_PACKINGS = {Packing.FLOAT16: 0, Packing.INT8: 1}


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


def pack_states(states: MemoryStates, packing: Packing) -> bytes:
    layers, heads, tokens, head_dim = states.keys.shape
    header = _STATES.pack(
        _MAGIC, _PACKINGS[packing], states.from_layer, layers, heads, tokens, head_dim
    )
    return header + _pack_rows(states.keys, packing) + _pack_rows(states.values, packing)


def unpack_states(blob: bytes, model_id: str) -> MemoryStates:
    view = memoryview(blob)
    magic, code, from_layer, layers, heads, tokens, head_dim = _STATES.unpack_from(view)
    if magic != _MAGIC:
        raise ValueError("not a memory states record")
    packing = {v: k for k, v in _PACKINGS.items()}[code]
    at = _STATES.size
    keys, used = _unpack_rows(view[at:], (layers, heads, tokens, head_dim), packing)
    values, _ = _unpack_rows(
        view[at + used :], (layers - from_layer, heads, tokens, head_dim), packing
    )
    return MemoryStates(model_id, from_layer, keys, values)


def states_rows(items: Sequence[Memtok]) -> list[tuple[bytes, str, str, str]]:
    """(packed states, id, tenant, user) of the items that carry states: the parameters
    of each engine's `UPDATE memtoks SET states = ... WHERE id, tenant, user_id`."""
    return [
        (pack_states(m.states, m.packing), m.id, m.tenant, m.user)
        for m in items
        if m.states is not None
    ]
