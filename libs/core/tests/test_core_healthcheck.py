"""The container/`helm test` health probe: exit 0 only when every target is SERVING."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from hippo_core import healthcheck

READY = "hippo.test.v1.TestService"
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@pytest.fixture
def server() -> Iterator[tuple[str, health.HealthServicer]]:
    srv = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    servicer = health.HealthServicer()
    health_pb2_grpc.add_HealthServicer_to_server(servicer, srv)
    port = srv.add_insecure_port("127.0.0.1:0")
    srv.start()
    try:
        yield f"127.0.0.1:{port}", servicer
    finally:
        srv.stop(None)


def test_serving_liveness_and_readiness_exit_zero(
    server: tuple[str, health.HealthServicer], capsys: pytest.CaptureFixture[str]
) -> None:
    addr, servicer = server
    servicer.set("", SERVING)
    servicer.set(READY, SERVING)
    assert healthcheck.main([addr, f"{addr}/{READY}"]) == 0
    assert f"{addr}/{READY}: SERVING" in capsys.readouterr().out


def test_any_target_not_serving_fails(server: tuple[str, health.HealthServicer]) -> None:
    """Warm-up and drain report NOT_SERVING on the readiness key: the probe must fail."""
    addr, servicer = server
    servicer.set("", SERVING)
    servicer.set(READY, NOT_SERVING)
    assert healthcheck.main([addr, f"{addr}/{READY}"]) == 1
    assert healthcheck.check(f"{addr}/hippo.other.v1.Unknown", 2.0) == "FAILED (NOT_FOUND)"


def test_unreachable_fails_within_timeout() -> None:
    # Port 1 on loopback: nothing listens, the channel fails fast or hits the deadline.
    status = healthcheck.check("127.0.0.1:1", 1.0)
    assert status in ("FAILED (UNAVAILABLE)", "FAILED (DEADLINE_EXCEEDED)")


def test_runs_as_a_module(server: tuple[str, health.HealthServicer]) -> None:
    """The Dockerfiles' HEALTHCHECK runs `python -m hippo_core.healthcheck`."""
    addr, servicer = server
    servicer.set("", SERVING)
    run = subprocess.run(
        [sys.executable, "-m", "hippo_core.healthcheck", "--timeout", "5", addr],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stderr
    servicer.set("", NOT_SERVING)
    run = subprocess.run(
        [sys.executable, "-m", "hippo_core.healthcheck", addr],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 1
    assert "NOT_SERVING" in run.stdout
