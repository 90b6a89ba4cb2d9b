"""The witness file: one signed checkpoint per line, appended and fsynced, never rewritten.

Kept apart from the log (its own path setting) so that it can live on another volume, or
be shipped off the machine by any log shipper, where whoever could rewrite the log
cannot reach it. A line is JSON:

    {"hash": "<hex>", "key_id": "<16 hex>", "signature": "<base64>", "size": N, "time_us": T}

A crash can leave the last line half-written; at open the torn tail (no final newline)
is cut off, which is the only change ever made to existing bytes of this file.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import os
from pathlib import Path

from hippo_audit.domain.models import Checkpoint, WitnessLine
from hippo_core.files import fsync_dir

log = logging.getLogger(__name__)


def encode(checkpoint: Checkpoint) -> bytes:
    line = {
        "hash": checkpoint.hash.hex(),
        "key_id": checkpoint.key_id,
        "signature": base64.b64encode(checkpoint.signature).decode(),
        "size": checkpoint.size,
        "time_us": checkpoint.time_us,
    }
    return (json.dumps(line, sort_keys=True) + "\n").encode()


def decode(number: int, text: bytes) -> WitnessLine:
    try:
        raw = json.loads(text)
        checkpoint = Checkpoint(
            size=int(raw["size"]),
            hash=bytes.fromhex(raw["hash"]),
            time_us=int(raw["time_us"]),
            key_id=str(raw["key_id"]),
            signature=base64.b64decode(raw["signature"], validate=True),
        )
    except (ValueError, KeyError, TypeError, binascii.Error) as exc:
        return WitnessLine(number, None, type(exc).__name__)
    if len(checkpoint.hash) != 32 or checkpoint.size < 1:
        return WitnessLine(number, None, "bad size or hash")
    return WitnessLine(number, checkpoint)


class FileWitness:
    """`Witness` on a local file."""

    def __init__(self, path: Path) -> None:
        self._path = Path(path)
        self._path.parent.mkdir(parents=True, exist_ok=True)
        self._repair()

    def _repair(self) -> None:
        if not self._path.exists():
            return
        data = self._path.read_bytes()
        if data and not data.endswith(b"\n"):
            keep = data.rfind(b"\n") + 1
            log.warning("witness: cutting a torn last line (%d bytes)", len(data) - keep)
            with self._path.open("r+b") as f:
                f.truncate(keep)
                os.fsync(f.fileno())

    def append(self, checkpoint: Checkpoint) -> None:
        created = not self._path.exists()
        # One write of one whole line, then fsync: O_APPEND keeps concurrent writers (there
        # are none, by design) from interleaving, and a crash tears at most this line.
        fd = os.open(self._path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, encode(checkpoint))
            os.fsync(fd)
        finally:
            os.close(fd)
        if created:
            fsync_dir(self._path.parent)

    def read(self) -> list[WitnessLine]:
        if not self._path.exists():
            return []
        lines = self._path.read_bytes().split(b"\n")
        if lines and lines[-1] == b"":
            lines.pop()
        return [decode(i, text) for i, text in enumerate(lines, start=1)]

    def latest(self) -> Checkpoint | None:
        for line in reversed(self.read()):
            if line.checkpoint is not None:
                return line.checkpoint
        return None
