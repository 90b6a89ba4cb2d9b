"""`hippo-memtok-rebuild` (`hippo memtok rebuild` runs it): the store's value vectors
again from their source words, for the model and layer these settings serve.

Embedded default: run with the injection service stopped (the store has one owner: its
key shard's WAL lock refuses a second). Cluster mode: the items are in PostgreSQL and
this command keeps a throwaway key index of its own, so it never contends with a
replica's; run it while no replica serves the old model (scaled down, or the new
release's replicas refusing to start until the store is theirs). Each user's items are
rewritten under that user's write lock, and every replica's key index picks the
rewritten items up from the change feed."""

from __future__ import annotations

import contextlib
import sys
import tempfile
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
    from hippo_injection.__main__ import cluster, load_engine, open_store

    engine = load_engine(settings)
    with contextlib.ExitStack() as stack:
        keys_dir = None
        if cluster(settings):
            scratch = stack.enter_context(tempfile.TemporaryDirectory(prefix="memtok-rebuild-"))
            keys_dir = Path(scratch) / "memtok-keys"
        store = open_store(settings, engine, _NoEmbedder(), verify_model=False, keys_dir=keys_dir)
        try:
            done = store.rebuild()
        finally:
            store.keys.close()
            store.items.close()
    return engine.info.model, settings.memtok_layer, done


def store_path(settings: InjectionSettings) -> Path:
    """The embedded store's file (what `missing` checks there)."""
    from hippo_injection.__main__ import sqlite_path

    return sqlite_path(settings)


def missing(settings: InjectionSettings) -> str:
    """Where the store should be when it is not there; empty when there is one to
    rebuild (in cluster mode the database is the store: opening it creates its schema)."""
    from hippo_injection.__main__ import cluster

    if cluster(settings) or store_path(settings).exists():
        return ""
    return str(store_path(settings))


def main() -> None:
    """The `hippo-memtok-rebuild` console script (`hippo memtok rebuild` runs it): the
    injection package's own command, so the CLI never reaches into its internals."""
    settings = InjectionSettings()
    where = missing(settings)  # cluster mode: the database is the store
    if where:
        print(f"no memtok store at {where}", file=sys.stderr)
        sys.exit(1)
    model, layer, done = rebuild(settings)
    print(f"rebuilt {done} memtoks for {model} at layer {layer}")


if __name__ == "__main__":
    main()
