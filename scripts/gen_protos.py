"""Generate the Python code for every proto under protos/ into libs/proto/src.

The folder under protos/ equals the proto package and the import path
(protos/hippo/embedding/v1/embedding.proto -> hippo.embedding.v1.embedding_pb2), so
grpcio-tools writes working absolute imports and nothing is edited afterwards.

`--check` regenerates into a scratch folder and fails on any difference with the
committed tree: CI runs it so stale generated code cannot land.
"""

from __future__ import annotations

import argparse
import filecmp
import shutil
import sys
import tempfile
from pathlib import Path

from grpc_tools import protoc

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"
OUT = ROOT / "libs" / "proto" / "src"
PACKAGE = "hippo"  # top of the generated tree; hand-written packages are hippo_<role>


def generate(out: Path) -> None:
    sources = sorted(p.relative_to(PROTOS).as_posix() for p in PROTOS.rglob("*.proto"))
    if not sources:
        raise SystemExit("no .proto files under protos/")
    well_known = Path(protoc.__file__).parent / "_proto"
    args = [
        "grpc_tools.protoc",
        f"-I{PROTOS}",
        f"-I{well_known}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *sources,
    ]
    if protoc.main(args) != 0:
        raise SystemExit("protoc failed")
    # Regular packages (not namespace packages) keep mypy, setuptools and pytest simple.
    for folder in [out / PACKAGE, *(p for p in (out / PACKAGE).rglob("*") if p.is_dir())]:
        (folder / "__init__.py").touch()
    (out / PACKAGE / "py.typed").touch()


def tree(root: Path) -> set[str]:
    return {
        p.relative_to(root).as_posix()
        for p in root.rglob("*")
        if p.is_file() and "__pycache__" not in p.parts
    }


def check() -> int:
    with tempfile.TemporaryDirectory() as scratch:
        fresh = Path(scratch)
        generate(fresh)
        want, have = tree(fresh / PACKAGE), tree(OUT / PACKAGE)
        stale = sorted(
            name
            for name in want | have
            if name not in want
            or name not in have
            or not filecmp.cmp(fresh / PACKAGE / name, OUT / PACKAGE / name, shallow=False)
        )
    if stale:
        print("generated code is stale; run `make proto` and commit:", *stale, sep="\n  ")
        return 1
    print(f"generated code is up to date ({len(want)} files)")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true", help="fail if the committed code is stale")
    if parser.parse_args().check:
        return check()
    shutil.rmtree(OUT / PACKAGE, ignore_errors=True)
    OUT.mkdir(parents=True, exist_ok=True)
    generate(OUT)
    print(f"generated {len(tree(OUT / PACKAGE))} files under {OUT.relative_to(ROOT)}/{PACKAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
