"""A service stopped by one signal exits 0 even when a second one follows: a terminal's
Ctrl-C reaches every process of the group, and `hippo up` then sends each SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

CHILD = textwrap.dedent(
    """
    import sys, time
    from hippo_core.server.app import Service, run
    from hippo_core.settings import ServiceSettings

    run(Service("signals", [], lambda server: None), ServiceSettings(port=0, metrics_port=0,
        grace_seconds=0.5))
    print("returned", flush=True)
    time.sleep(2)  # an interpreter's teardown, made long enough to be hit
    """
)


def _wait_for(process: subprocess.Popen[str], text: str, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    assert process.stdout is not None
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        if text in line:
            return
        if not line and process.poll() is not None:
            raise AssertionError(f"exited {process.returncode} before {text!r}")
    raise AssertionError(f"no {text!r} within {timeout} s")


def test_a_second_stop_signal_after_a_clean_stop_is_ignored() -> None:
    process = subprocess.Popen(
        [sys.executable, "-c", CHILD],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=dict(os.environ, HIPPO_LOG_LEVEL="info"),
    )
    try:
        _wait_for(process, '"event": "serving"')
        process.send_signal(signal.SIGINT)
        _wait_for(process, "returned")
        process.send_signal(signal.SIGTERM)  # hippo up's, after the terminal's SIGINT
        process.send_signal(signal.SIGINT)
        assert process.wait(timeout=30) == 0
    finally:
        if process.poll() is None:
            process.kill()
