"""Crash-safe small-file writes: a crash leaves the old file or the new one, whole.
Shared by the services that keep small state files beside their stores (retrieval's
index generation pointer and vector-index metadata, audit's signing key) and the secrets
made once and then kept (gateway's fingerprint key, the launcher's cluster secrets)."""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path


def fsync_dir(path: Path) -> None:
    """Make a directory entry (a created or renamed file) durable."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: Path, data: bytes, mode: int = 0o600) -> None:
    """Replace `path` with `data`: temp file, fsync, rename, fsync of the directory (the
    rename is only durable once the directory entry is). Private to the owner by default:
    these files sit beside user data."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    fsync_dir(path.parent)


def secret_file(path: Path, make: Callable[[], bytes]) -> bytes:
    """The secret kept in `path`, made by `make()` and written there (mode 0600, durable)
    when the file does not exist yet. Written whole under a temporary name and then
    hard-linked into place, which fails if `path` exists: two processes starting at once
    cannot each keep a different secret, nor read a half-written one."""
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=path.name, suffix=".tmp")
        try:
            os.fchmod(fd, 0o600)
            with os.fdopen(fd, "wb") as f:
                f.write(make())
                f.flush()
                os.fsync(f.fileno())
            with contextlib.suppress(FileExistsError):  # another process won: keep theirs
                os.link(tmp, path)
        finally:
            Path(tmp).unlink(missing_ok=True)
        fsync_dir(path.parent)
    return path.read_bytes()
