"""One memtok as a row, the same in SQLite and PostgreSQL: the columns, and the packing of
its vectors.

Value vectors are stored compactly: float16 normally, int8 with one float32 scale for
items compressed before deletion. Key vectors are float32 little-endian (they are also
the key index's source on a rebuild).

An item's attendable states (MemoryStates: its source words' keys and values as the
model computed them) are the `states` column, outside NAMES: tens of KiB each, so they
are read only for the items a plan attends (`ItemStore.states`), never with the rows;
packed (states_codec.py) as the item's values are: float16, or int8 when compressed."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hippo_injection.adapters.states_codec import pack_states
from hippo_injection.domain.memtok.models import Memtok, Packing, Source, Vector

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


def states_rows(items: Sequence[Memtok]) -> list[tuple[bytes, str, str, str]]:
    """(packed states, id, tenant, user) of the items that carry states: the parameters
    of each engine's `UPDATE memtoks SET states = ... WHERE id, tenant, user_id`."""
    return [
        (pack_states(m.states, m.packing), m.id, m.tenant, m.user)
        for m in items
        if m.states is not None
    ]
