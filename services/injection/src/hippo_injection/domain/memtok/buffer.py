"""The reply buffer of the embedded default: in this process's memory (one process
serves every user, so the next query always reaches it; a restart drops the buffered
words, which only means they are not promoted)."""

from __future__ import annotations

from collections.abc import Sequence

from hippo_injection.domain.memtok.models import Observation


class MemoryReplyBuffer:
    def __init__(self) -> None:
        self._buffers: dict[tuple[str, str], list[tuple[Observation, int]]] = {}

    def replace(self, tenant: str, user: str, entries: Sequence[tuple[Observation, int]]) -> None:
        if entries:
            self._buffers[(tenant, user)] = list(entries)
        else:
            self._buffers.pop((tenant, user), None)

    def take(self, tenant: str, user: str) -> list[tuple[Observation, int]]:
        return self._buffers.pop((tenant, user), [])

    def peek(self, tenant: str, user: str) -> list[tuple[Observation, int]]:
        return list(self._buffers.get((tenant, user), []))

    def drop(self, tenant: str, user: str) -> None:
        self._buffers.pop((tenant, user), None)
