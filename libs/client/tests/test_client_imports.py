"""The SDK ships alone: it imports the generated stubs, grpc and protobuf, nothing of
Hippo's runtime (hippo_core brings pydantic, structlog, OpenTelemetry, and pins 3.11)."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src" / "hippo_client"
ALLOWED = {"hippo", "hippo_client", "grpc", "google", "__future__"}


def _imports(path: Path) -> set[str]:
    tops: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            tops.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            tops.add(node.module.split(".")[0])
    return tops


def test_the_sdk_imports_only_the_stubs_grpc_protobuf_and_the_stdlib() -> None:
    for path in SRC.rglob("*.py"):
        foreign = _imports(path) - ALLOWED - set(sys.stdlib_module_names)
        assert not foreign, f"{path.name} imports {sorted(foreign)}"


def test_the_rule_sees_a_forbidden_import(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from hippo_core import client\nimport pydantic\n")
    assert _imports(bad) - ALLOWED - set(sys.stdlib_module_names) == {"hippo_core", "pydantic"}
