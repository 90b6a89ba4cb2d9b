"""The caller tables (who may call which RPC under TLS) against the code and the protos.

Every RPC of an internal service is declared (an undeclared one would be refused to
everyone), only Hippo identities are named, and every call a service's adapters make
to a peer is allowed by that peer's table: the call graph is read from the source, so
a new call without a table entry fails here rather than as PERMISSION_DENIED in a
TLS deployment."""

from __future__ import annotations

import importlib
import re
from pathlib import Path

import pytest

from hippo_core.server.authz import OPERATOR

ROOT = Path(__file__).resolve().parents[1]
INTERNAL = ["embedding", "retrieval", "summariser", "audit", "injection"]
IDENTITIES = {"gateway", *INTERNAL, OPERATOR}
STUBS = {
    "EmbeddingServiceStub": "embedding",
    "RetrievalServiceStub": "retrieval",
    "SummariserServiceStub": "summariser",
    "AuditServiceStub": "audit",
    "InjectionServiceStub": "injection",
}


def table(service: str) -> tuple[str, dict[str, frozenset[str]]]:
    module = importlib.import_module(f"hippo_{service}.__main__")
    return module.FULL_NAME, module.CALLERS


def _stub_calls(text: str) -> set[tuple[str, str]]:
    peers = {peer for stub, peer in STUBS.items() if f"{stub}(" in text}
    if len(peers) != 1:
        return set()
    (peer,) = peers
    return {(peer, method) for method in re.findall(r"_?stub\.([A-Z]\w+)\b", text)}


def calls_from_source(caller: str) -> set[tuple[str, str]]:
    """(peer, method) for every `stub.Method(` in a module that makes a peer's stub,
    including the shared clients in hippo_core the service imports."""
    core = {
        f"hippo_core.{path.stem}": path
        for path in (ROOT / "libs" / "core" / "src" / "hippo_core").glob("*.py")
    }
    found = set()
    for path in (ROOT / "services" / caller / "src").rglob("*.py"):
        text = path.read_text()
        found |= _stub_calls(text)
        for module, core_path in core.items():
            if re.search(rf"\b{re.escape(module)}\b", text):
                found |= _stub_calls(core_path.read_text())
    return found


@pytest.mark.parametrize("service", INTERNAL)
def test_every_rpc_is_declared_and_only_hippo_identities_are_named(service: str) -> None:
    from google.protobuf import descriptor_pool

    full_name, callers = table(service)
    methods = descriptor_pool.Default().FindServiceByName(full_name).methods
    assert set(callers) == {f"/{full_name}/{m.name}" for m in methods}
    for allowed in callers.values():
        assert allowed and allowed <= IDENTITIES


@pytest.mark.parametrize("caller", ["gateway", "summariser", "injection"])
def test_every_call_a_service_makes_is_allowed_by_its_peer(caller: str) -> None:
    calls = calls_from_source(caller)
    assert calls, f"no peer calls found in {caller}'s source"
    for peer, method in calls:
        full_name, callers = table(peer)
        assert caller in callers[f"/{full_name}/{method}"], (peer, method)


def test_the_audit_log_takes_entries_and_erasure_only_from_whom_it_should() -> None:
    full_name, callers = table("audit")
    assert callers[f"/{full_name}/Append"] == {"gateway", "summariser"}
    assert callers[f"/{full_name}/ForgetUser"] == {"gateway"}
