"""Helpers for tests and benchmarks that run real services as subprocesses.

Not used by services at run time. Kept in the shared runtime so every service's tests
start processes, wait for health and read metrics the same way.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from prometheus_client.parser import text_string_to_metric_families

from hippo_core.listen import reserve_port


def health_status(addr: str, service: str, timeout: float = 1.0) -> str:
    """The health status name, or 'UNREACHABLE' when the server does not answer."""
    with grpc.insecure_channel(addr) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=service), timeout=timeout
            )
        except grpc.RpcError:
            return "UNREACHABLE"
    return str(health_pb2.HealthCheckResponse.ServingStatus.Name(reply.status))


def scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """Every sample of a /metrics page: {(name, sorted labels): value}."""
    with urllib.request.urlopen(url, timeout=5) as reply:
        text = reply.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def metric(
    samples: Mapping[tuple[str, tuple[tuple[str, str], ...]], float], name: str, **labels: str
) -> float:
    """Sum of the samples called `name` whose labels include `labels`."""
    want = set(labels.items())
    return sum(v for (n, ls), v in samples.items() if n == name and want <= set(ls))


def service_children(parent: int) -> dict[str, int]:
    """The service processes a launcher started (`python -m <module>`): module name
    (hippo_retrieval, ...) -> pid, read from /proc."""
    found = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            argv = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if ppid == parent and b"-m" in argv:
            found[argv[argv.index(b"-m") + 1].decode()] = int(proc.name)
    return found


@dataclass
class ServiceProcess:
    process: subprocess.Popen[bytes]
    addr: str
    metrics_url: str
    log: Path

    def log_text(self) -> str:
        return self.log.read_text(errors="replace")

    def terminate(self, timeout: float = 30.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        return int(self.process.returncode)


@contextmanager
def service_process(
    module: str, prefix: str, env: Mapping[str, str] | None = None
) -> Iterator[ServiceProcess]:
    """Run `python -m module` on free loopback ports (or the `<prefix>PORT` given in `env`,
    e.g. to restart a service where its peers expect it); SIGTERM, then kill, after."""
    env = dict(env or {})
    port = int(env.pop(f"{prefix}PORT", 0)) or reserve_port()
    metrics_port = reserve_port()
    full_env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        f"{prefix}HOST": "127.0.0.1",
        f"{prefix}PORT": str(port),
        f"{prefix}METRICS_PORT": str(metrics_port),
        **env,
    }
    log = Path(tempfile.mkstemp(prefix=f"{module}-", suffix=".log")[1])
    with log.open("wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", module], env=full_env, stdout=out, stderr=subprocess.STDOUT
        )
    proc = ServiceProcess(
        process, f"127.0.0.1:{port}", f"http://127.0.0.1:{metrics_port}/metrics", log
    )
    try:
        yield proc
    finally:
        proc.terminate()


def wait_for(addr: str, service: str, status: str = "SERVING", timeout: float = 120.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if health_status(addr, service) == status:
            return
        time.sleep(0.1)
    raise TimeoutError(f"{service} at {addr} not {status} after {timeout} s")


T = TypeVar("T")


def eventually(
    check: Callable[[], T | None], what: str, timeout: float = 30, interval: float = 0.1
) -> T:
    """Poll `check` until it returns something other than None, and return that; fail
    the test naming `what` after `timeout` seconds (for effects that are asynchronous by
    design: index lag, audit delivery)."""
    end = time.monotonic() + timeout
    while True:
        value = check()
        if value is not None:
            return value
        assert time.monotonic() < end, f"not within {timeout} s: {what}"
        time.sleep(interval)
