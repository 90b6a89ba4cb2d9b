"""Start-up and shutdown of the service process: both front doors follow the model."""

from __future__ import annotations

import time
import urllib.error
import urllib.request
from pathlib import Path

from injection_harness import FULL_NAME, MODEL_DIR

from hippo_core.listen import reserve_port
from hippo_core.testing import health_status, service_process


def _http_status(url: str) -> int | None:
    try:
        with urllib.request.urlopen(url, timeout=2) as reply:
            return int(reply.status)
    except urllib.error.HTTPError as err:
        return int(err.code)
    except OSError:
        return None  # not listening


def test_http_health_is_503_until_loaded_then_sigterm_stops_cleanly(model_dir: Path) -> None:
    http_port = reserve_port()
    env = {"HIPPO_INJECTION_MODEL_DIR": str(MODEL_DIR), "HIPPO_INJECTION_HTTP_PORT": str(http_port)}
    health = f"http://127.0.0.1:{http_port}/health"
    with service_process("hippo_injection", "HIPPO_INJECTION_", env) as proc:
        seen: list[tuple[int | None, str]] = []
        end = time.monotonic() + 240
        while time.monotonic() < end:
            grpc_status = health_status(proc.addr, FULL_NAME)
            seen.append((_http_status(health), grpc_status))
            if grpc_status == "SERVING":
                break
            time.sleep(0.05)
        assert seen[-1][1] == "SERVING", proc.log_text()[-2000:]
        # While the model loaded, HTTP answered 503 as gRPC answered NOT_SERVING.
        assert (503, "NOT_SERVING") in seen, seen[:5]
        assert _http_status(health) == 200
        code = proc.terminate(timeout=30)
        assert code == 0, proc.log_text()[-2000:]
        assert _http_status(health) is None  # the HTTP server went down with the process
        log = proc.log_text()
        assert '"event": "draining"' in log and '"event": "stopped"' in log
