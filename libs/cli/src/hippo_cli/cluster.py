"""A private local cluster for tests and benchmarks: `hippo up` on free ports in its own
data dir, stopped (gracefully) on exit. Not used by the services themselves."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from hippo_cli.registry import SERVICES
from hippo_core.listen import reserve_port

BANNER_END = "Ctrl-C stops everything"


@dataclass
class LocalCluster:
    env: dict[str, str]  # the environment `hippo` commands need to reach this cluster
    addrs: dict[str, str]  # service name -> host:port
    metrics: dict[str, str]  # service name -> /metrics URL
    banner: str
    shutdown: list[str] = field(default_factory=list)  # what `hippo up` printed when stopping

    @property
    def gateway(self) -> str:
        return self.addrs["gateway"]


@contextmanager
def local_cluster(
    data_dir: Path, extra_env: Mapping[str, str] | None = None, timeout: float = 600
) -> Iterator[LocalCluster]:
    env = dict(os.environ)
    addrs, metrics = {}, {}
    for spec in SERVICES:
        # Every port a service listens on (gRPC, metrics, and e.g. injection's HTTP API):
        # two clusters, or a cluster beside `make run`, must never collide.
        fields = spec.settings_type().model_fields
        ports = {name: reserve_port() for name in fields if name.endswith("port")}
        for name, number in ports.items():
            env[f"{spec.env_prefix()}{name.upper()}"] = str(number)
        addrs[spec.name] = f"127.0.0.1:{ports['port']}"
        env[f"HIPPO_CLI_{spec.name.upper()}_ADDR"] = addrs[spec.name]
        metrics[spec.name] = f"http://127.0.0.1:{ports['metrics_port']}/metrics"
    env["HIPPO_CLI_DATA_DIR"] = str(data_dir)
    env.update(extra_env or {})
    hippo = str(Path(sys.executable).parent / "hippo")
    launcher = subprocess.Popen(
        [hippo, "up"], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    assert launcher.stdout is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = launcher.stdout.readline()
        if not line:
            break
        lines.append(line)
        if BANNER_END in line:
            break
    banner = "".join(lines)
    if BANNER_END not in banner:
        launcher.kill()
        raise RuntimeError(f"the cluster did not start:\n{banner}")
    cluster = LocalCluster(env, addrs, metrics, banner)
    try:
        yield cluster
    finally:
        launcher.send_signal(signal.SIGINT)
        rest, _ = launcher.communicate(timeout=120)
        cluster.shutdown = rest.splitlines()
