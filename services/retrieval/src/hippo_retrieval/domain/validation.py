"""The retrieval service's own contract, checked before anything is written.

The gateway validates the public API's limits; these checks keep the internal service
safe on its own (another caller, a bug upstream): a bad batch fails whole, naming the
field as the proto spells it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from hippo_core.errors import InvalidArgument
from hippo_retrieval.domain.models import Cursor, EmbeddingModel, NewTurn, Scope

MAX_ID = 128
MAX_DIMENSION = 65536
MAX_FILTERS = 8  # metadata pairs per Search or List
MAX_FILTER_VALUE_BYTES = 1024  # as a turn's metadata value
MAX_REPAIRS = 32  # query_repairs pairs per Search (the gateway's speller makes <= 12)
MAX_REPAIR_LETTERS = 64
# PostgreSQL's text type cannot hold U+0000; refused here, the same on both engines, so a
# turn that the embedded store accepts is never one that cluster mode would refuse.
NUL = "\x00"


@dataclass(frozen=True)
class Limits:
    max_turns: int = 1024
    dimension: int = 384
    max_memory_ids: int = 10_000
    max_get: int = 1000
    max_list: int = 1000  # rows per page of a listing


def require(field: str, value: str) -> None:
    if not value:
        raise InvalidArgument(field, "is required")
    if len(value) > MAX_ID:
        raise InvalidArgument(field, f"at most {MAX_ID} characters, got {len(value)}")
    no_nul(field, value)


def no_nul(field: str, value: str) -> None:
    if NUL in value:
        raise InvalidArgument(field, "must not contain NUL (U+0000) characters")


def check_turns(
    tenant: str, turns: Sequence[NewTurn], limits: Limits, model: EmbeddingModel
) -> None:
    """`model`: the live index's; a vector of it must have its dimension, another
    model's (embedded again for the index) only one finite row of a sane length."""
    require("tenant", tenant)
    if not 1 <= len(turns) <= limits.max_turns:
        raise InvalidArgument("turns", f"must hold 1..{limits.max_turns} turns, got {len(turns)}")
    for i, turn in enumerate(turns):
        require(f"turns[{i}].memory_id", turn.memory_id)
        require(f"turns[{i}].user_id", turn.user)
        require(f"turns[{i}].session_id", turn.session)
        no_nul(f"turns[{i}].text", turn.text)
        no_nul(f"turns[{i}].client_id", turn.client_id)
        if turn.vector is None:
            continue
        field = f"turns[{i}].vector"
        if turn.vector_model == model.name:
            check_vector(field, turn.vector, model.dimension)
        else:
            check_vector(field, turn.vector, turn.vector.size)
            if turn.vector.size > MAX_DIMENSION:
                raise InvalidArgument(field, f"at most {MAX_DIMENSION} values")
            require(f"turns[{i}].vector_model", turn.vector_model)


def check_repairs(repairs: Mapping[str, str]) -> None:
    """Search's `query_repairs`: a few lower-case words mapped to lower-case words."""
    if len(repairs) > MAX_REPAIRS:
        raise InvalidArgument("query_repairs", f"at most {MAX_REPAIRS} pairs, got {len(repairs)}")
    for typed, repaired in repairs.items():
        for word in (typed, repaired):
            if not (
                1 <= len(word) <= MAX_REPAIR_LETTERS
                and word.isascii()
                and word.isalpha()
                and word.islower()
            ):
                raise InvalidArgument(
                    f"query_repairs[{typed[:MAX_REPAIR_LETTERS]!r}]",
                    f"words must be 1..{MAX_REPAIR_LETTERS} lower-case letters a-z",
                )


def check_vector(field: str, vector: np.ndarray, dimension: int) -> None:
    if vector.shape != (dimension,):
        raise InvalidArgument(
            field, f"must hold {dimension} float32 values, got {vector.size}", reason="DIMENSION"
        )
    if not np.all(np.isfinite(vector)):
        raise InvalidArgument(field, "holds NaN or infinite values")


def check_limit(limit: int, limits: Limits) -> None:
    if not 1 <= limit <= limits.max_list:
        raise InvalidArgument("limit", f"must be 1..{limits.max_list}, got {limit}")


def check_list(scope: Scope, after: Cursor | None, limit: int, limits: Limits) -> None:
    require("tenant", scope.tenant)
    require("user_id", scope.user)
    if scope.session is not None:
        require("session_id", scope.session)
    if scope.start_us is not None and scope.end_us is not None and scope.start_us >= scope.end_us:
        raise InvalidArgument("start_us", "must be less than end_us")
    check_limit(limit, limits)
    if after is not None and after.seq < 1:
        raise InvalidArgument("after.seq", f"must be at least 1, got {after.seq}")


def check_filter(pairs: Sequence[tuple[str, str]], declared: frozenset[str]) -> None:
    """Metadata filters: at most MAX_FILTERS pairs, on declared keys only (the indexes
    hold no others, so any other key would silently match nothing)."""
    if len(pairs) > MAX_FILTERS:
        raise InvalidArgument("metadata", f"at most {MAX_FILTERS} entries, got {len(pairs)}")
    for key, value in pairs:
        if key not in declared:
            names = ", ".join(sorted(declared)) or "none"
            raise InvalidArgument(
                f"metadata[{key[:80]}]",
                f"is not a declared filter key (declared: {names}; HIPPO_RETRIEVAL_FILTER_KEYS)",
            )
        if len(value.encode("utf-8", "surrogatepass")) > MAX_FILTER_VALUE_BYTES:
            raise InvalidArgument(f"metadata[{key}]", f"at most {MAX_FILTER_VALUE_BYTES} bytes")
        no_nul(f"metadata[{key}]", value)
