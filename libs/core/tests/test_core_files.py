"""Small state files: the atomic replace, and the secret made once and then kept."""

from __future__ import annotations

import multiprocessing
import os
import stat
from pathlib import Path

from hippo_core.files import secret_file, write_atomic


def test_write_atomic_replaces_whole_and_private(tmp_path: Path) -> None:
    path = tmp_path / "state"
    write_atomic(path, b"one")
    write_atomic(path, b"two")
    assert path.read_bytes() == b"two"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in tmp_path.iterdir()] == ["state"]  # no temp file left


def test_secret_file_is_made_once_then_kept(tmp_path: Path) -> None:
    path = tmp_path / "sub" / "key"
    made: list[int] = []

    def make() -> bytes:
        made.append(1)
        return os.urandom(16)

    first = secret_file(path, make)
    again = secret_file(path, make)
    assert first == again == path.read_bytes()
    assert len(first) == 16 and made == [1]
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert [p.name for p in path.parent.iterdir()] == ["key"]


def _race(path: str, out: multiprocessing.Queue[bytes]) -> None:  # type: ignore[type-arg]
    out.put(secret_file(Path(path), lambda: os.urandom(16)))


def test_processes_starting_at_once_keep_one_secret(tmp_path: Path) -> None:
    path = tmp_path / "key"
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [ctx.Process(target=_race, args=(str(path), out)) for _ in range(4)]
    for p in procs:
        p.start()
    seen = {out.get(timeout=60) for _ in procs}
    for p in procs:
        p.join(timeout=60)
    assert seen == {path.read_bytes()}
    assert len(path.read_bytes()) == 16
