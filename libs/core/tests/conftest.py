"""Fixtures for the runtime tests; the harness itself is in core_harness.py."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from core_harness import Harness, start

from hippo_core import logging as hippo_logging
from hippo_core.settings import ServiceSettings

# JSON logs through stdlib, as in production; before any test adds caplog's handler.
hippo_logging.configure("test", "debug")


@pytest.fixture
async def harness() -> AsyncIterator[Harness]:
    h = await start(ServiceSettings(grace_seconds=1.0, max_concurrent_rpcs=2))
    await asyncio.wait_for(h.runner.ready.wait(), 5)
    yield h
    await h.runner.stop()
