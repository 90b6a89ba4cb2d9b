"""The services the local launcher and `hippo health` know, in start order.

Each entry names the service's module and its settings class: ports and every other
default come from the service's own settings, so there is one source of truth.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from pydantic_settings import BaseSettings

from hippo_core.settings import ServiceSettings


@dataclass(frozen=True)
class ServiceSpec:
    name: str
    module: str  # `python -m <module>` starts it
    settings_class: str  # "<module>.settings:<Class>"
    full_name: str  # proto service name = readiness health key

    def settings_type(self) -> type[ServiceSettings]:
        module, _, cls = self.settings_class.partition(":")
        settings_cls: type[ServiceSettings] = getattr(importlib.import_module(module), cls)
        return settings_cls

    def settings(self) -> ServiceSettings:
        """The service's settings as its process would read them from this environment."""
        return self.settings_type()()

    def env_prefix(self) -> str:
        return f"HIPPO_{self.name.upper()}_"


SERVICES: tuple[ServiceSpec, ...] = (
    ServiceSpec(
        "embedding",
        "hippo_embedding",
        "hippo_embedding.settings:EmbeddingSettings",
        "hippo.embedding.v1.EmbeddingService",
    ),
    # First start converts the GGUF (1-2 min, off the event loop; NOT_SERVING meanwhile).
    ServiceSpec(
        "injection",
        "hippo_injection",
        "hippo_injection.settings:InjectionSettings",
        "hippo.injection.v1.InjectionService",
    ),
    ServiceSpec(
        "retrieval",
        "hippo_retrieval",
        "hippo_retrieval.settings:RetrievalSettings",
        "hippo.retrieval.v1.RetrievalService",
    ),
    ServiceSpec(
        "audit",
        "hippo_audit",
        "hippo_audit.settings:AuditSettings",
        "hippo.audit.v1.AuditService",
    ),
    # Counts tokens with the injection service, merges through its HTTP API and records
    # merges in the audit log: after both.
    ServiceSpec(
        "summariser",
        "hippo_summariser",
        "hippo_summariser.settings:SummariserSettings",
        "hippo.summariser.v1.SummariserService",
    ),
    # The gateway calls every other service: it starts last.
    ServiceSpec(
        "gateway",
        "hippo_gateway",
        "hippo_gateway.settings:GatewaySettings",
        "hippo.memory.v1.MemoryService",
    ),
)


def settings_classes() -> list[tuple[str, type[BaseSettings]]]:
    out: list[tuple[str, type[BaseSettings]]] = [(s.name, s.settings_type()) for s in SERVICES]
    from hippo_cli.settings import CliSettings

    out.append(("cli", CliSettings))
    return out
