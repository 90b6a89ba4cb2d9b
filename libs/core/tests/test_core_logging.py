"""JSON log lines carry the service, level, request id and rendered tracebacks."""

from __future__ import annotations

import json
import logging

import structlog

from hippo_core import logging as hippo_logging


def test_lines_are_json_with_context_and_traceback() -> None:
    handler = logging.getLogger().handlers[0]
    captured: list[str] = []
    original = handler.emit
    handler.emit = lambda record: captured.append(handler.format(record))  # type: ignore[method-assign]
    try:
        structlog.contextvars.bind_contextvars(request_id="r-123")
        try:
            raise ValueError("kaboom")
        except ValueError:
            hippo_logging.get("t").exception("failed", detail=7)
        logging.getLogger("grpc._server").warning("from a library")
    finally:
        handler.emit = original  # type: ignore[method-assign]
        structlog.contextvars.clear_contextvars()
    ours, foreign = (json.loads(line) for line in captured)
    assert ours["event"] == "failed" and ours["request_id"] == "r-123" and ours["detail"] == 7
    assert ours["level"] == "error" and ours["service"] == "test"
    assert "ValueError: kaboom" in ours["exception"]
    assert foreign["event"] == "from a library" and foreign["logger"] == "grpc._server"
