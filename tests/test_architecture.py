"""Structural rules, checked on the source so they stay true as the code grows."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SERVICES = sorted(p for p in (ROOT / "services").iterdir() if (p / "src").is_dir())
# Domain code is pure: no transport, no generated messages.
# ("hippo" is the generated package; hand-written ones are hippo_<role>.)
FORBIDDEN_IN_DOMAIN = (
    "grpc",
    "grpc_health",
    "grpc_reflection",
    "grpc_status",
    "google.protobuf",
    "hippo",
)


def _imports(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from (alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.module


def _forbidden(module: str) -> bool:
    return any(module == f or module.startswith(f + ".") for f in FORBIDDEN_IN_DOMAIN)


def test_every_service_has_a_domain_package() -> None:
    assert SERVICES, "no services found"
    for service in SERVICES:
        assert list(service.glob("src/*/domain/__init__.py")), service.name


def test_domain_modules_import_neither_grpc_nor_generated_code() -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {module}"
        for service in SERVICES
        for path in service.glob("src/*/domain/**/*.py")
        for module in _imports(path)
        if _forbidden(module)
    ]
    assert not offenders, "\n".join(offenders)


def test_the_rule_catches_what_it_should() -> None:
    assert _forbidden("grpc") and _forbidden("grpc.aio") and _forbidden("hippo.embedding.v1")
    assert _forbidden("google.protobuf.message")
    assert (
        not _forbidden("hippo_core.errors") and not _forbidden("grpcx") and not _forbidden("numpy")
    )


def test_servicers_stay_thin() -> None:
    """No error handling or status setting in servicers: the interceptor owns that."""
    for path in ROOT.glob("services/*/src/*/servicer.py"):
        tree = ast.parse(path.read_text())
        assert not any(isinstance(n, ast.Try) for n in ast.walk(tree)), f"{path}: try/except"
        source = path.read_text()
        assert "set_code" not in source and ".abort(" not in source, path


def test_services_do_not_import_each_other() -> None:
    # The package, not a build's hippo_x.egg-info beside it (glob order is arbitrary).
    packages = {
        s.name: next(p for p in s.glob("src/hippo_*") if "." not in p.name).name for s in SERVICES
    }
    for name in packages:
        others = {p for n, p in packages.items() if n != name}
        for path in (ROOT / "services" / name / "src").rglob("*.py"):
            bad = [m for m in _imports(path) if m.split(".")[0] in others]
            assert not bad, f"{path} imports {bad}"


def test_generated_code_is_never_hand_edited_location() -> None:
    """Generated modules live only under libs/proto; nowhere else holds *_pb2.py."""
    stray = [
        p
        for p in ROOT.rglob("*_pb2*.py")
        if "libs/proto/src" not in p.as_posix() and ".venv" not in p.parts
    ]
    assert not stray, stray


SERVICE_PACKAGES = {p.name for s in SERVICES for p in s.glob("src/hippo_*") if "." not in p.name}
_MODULE_PATH = re.compile(r"(hippo_[a-z]+)\.([\w.]+?)(?::\w+)?")


def _cli_violations(source: str, filename: str = "<source>") -> list[str]:
    """What a CLI module reaches inside a service package, by import or by a module path
    in a string (importlib.import_module("hippo_x.internal")): only a service's settings
    (its configuration contract) may be read; everything else goes through the service's
    API, its process (`python -m`) or its own console scripts."""
    tree = ast.parse(source, filename=filename)
    found: list[str] = []
    for node in ast.walk(tree):
        modules: list[str] = []
        if isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            modules = [node.module]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            match = _MODULE_PATH.fullmatch(node.value)
            modules = [f"{match.group(1)}.{match.group(2)}"] if match else []
        for module in modules:
            top, _, rest = module.partition(".")
            if (top in SERVICE_PACKAGES and rest and rest != "settings") or (
                top in SERVICE_PACKAGES
                and not rest
                and isinstance(node, ast.Import | ast.ImportFrom)
            ):
                found.append(module)
    return found


def test_the_cli_reaches_no_service_internals() -> None:
    for path in (ROOT / "libs" / "cli" / "src").rglob("*.py"):
        bad = _cli_violations(path.read_text(), str(path))
        assert not bad, f"{path} reaches into {bad}"


def test_the_cli_rule_catches_imports_and_importlib_strings() -> None:
    assert _cli_violations(
        "import importlib\nimportlib.import_module('hippo_injection.memtok_rebuild')"
    ) == ["hippo_injection.memtok_rebuild"]
    assert _cli_violations("from hippo_gateway.domain import memory") == ["hippo_gateway.domain"]
    assert _cli_violations("import hippo_retrieval") == ["hippo_retrieval"]
    ok = "x = 'hippo_gateway.settings:GatewaySettings'\nrun(['-m', 'hippo_gateway'])"
    assert _cli_violations(ok) == []
