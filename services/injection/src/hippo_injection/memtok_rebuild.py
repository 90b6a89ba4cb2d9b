"""`hippo memtok rebuild`: the store's value vectors again from their source words, for
the model and layer these settings serve. Run with the injection service stopped: the
store has one owner (its key shard's WAL lock refuses a second)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from hippo_injection.domain.memtok.models import Vector
from hippo_injection.settings import InjectionSettings


class _NoEmbedder:
    """A rebuild keeps the key vectors (the embedding model did not change)."""

    def embed(self, texts: Sequence[str]) -> Vector:
        raise RuntimeError("a rebuild does not embed")


def rebuild(settings: InjectionSettings) -> tuple[str, int, int]:
    """(model id, layer, items rebuilt)."""
    from hippo_injection.__main__ import load_engine
    from hippo_injection.memtok_wiring import open_store

    engine = load_engine(settings)
    store = open_store(settings, engine, _NoEmbedder(), verify_model=False)
    try:
        done = store.rebuild()
    finally:
        store.keys.close()
        store.items.close()
    return engine.info.model, settings.memtok_layer, done


def store_path(settings: InjectionSettings) -> Path:
    return Path(settings.data_dir) / "memtok.sqlite3"
