"""A private local cluster for tests and benchmarks: `hippo up` on reserved ports in its
own data dir, stopped (gracefully) on exit. Not used by the services themselves.

`cluster=True` starts cluster mode (PostgreSQL + `replicas` processes per service), as
`make run-cluster` does; `tls=True` mTLS between every service (`hippo up --tls`), and
`env` then carries the operator's certificate for the `hippo` commands."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from hippo_cli import endpoints
from hippo_cli.registry import SERVICES
from hippo_core.listen import reserve_port

BANNER_END = "Ctrl-C stops everything"


@dataclass
class LocalCluster:
    env: dict[str, str]  # the environment `hippo` commands need to reach this cluster
    addrs: dict[str, str]  # service name -> gRPC target (every replica: ipv4:a,b)
    metrics: dict[str, str]  # service (embedded) or replica name (cluster) -> /metrics URL
    banner: str
    data_dir: Path
    replicas: dict[str, list[endpoints.Endpoint]] = field(default_factory=dict)
    shutdown: list[str] = field(default_factory=list)  # what `hippo up` printed when stopping
    launcher: subprocess.Popen[str] | None = None

    @property
    def gateway(self) -> str:
        return self.addrs["gateway"]

    def refresh(self) -> None:
        """Re-read where the replicas are (pids change when the launcher restarts one)."""
        self.replicas = endpoints.read(self.data_dir)


@contextmanager
def local_cluster(
    data_dir: Path,
    extra_env: Mapping[str, str] | None = None,
    timeout: float = 600,
    *,
    cluster: bool = False,
    replicas: int = 2,
    tls: bool = False,
) -> Iterator[LocalCluster]:
    env = dict(os.environ)
    assigned: list[endpoints.Endpoint] = []
    if not cluster:
        # Embedded mode listens where each service's settings say: give every port of
        # every service (gRPC, metrics, injection's HTTP API) a reserved one, so two
        # clusters, or one beside `make run`, never collide. Cluster mode reserves its own.
        for spec in SERVICES:
            ports = {}
            for name in spec.settings_type().model_fields:
                if name.endswith("port"):
                    ports[name] = reserve_port()
                    env[f"{spec.env_prefix()}{name.upper()}"] = str(ports[name])
            assigned.append(
                endpoints.Endpoint(
                    spec.name,
                    0,
                    f"127.0.0.1:{ports['port']}",
                    f"http://127.0.0.1:{ports['metrics_port']}/metrics",
                    0,
                )
            )
    env["HIPPO_CLI_DATA_DIR"] = str(data_dir)
    env.update(extra_env or {})
    hippo = str(Path(sys.executable).parent / "hippo")
    command = [hippo, "up", *(["--cluster", "--replicas", str(replicas)] if cluster else [])]
    command += ["--tls"] if tls else []
    launcher = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
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
    # A launcher of an older build (a benchmark's "before") writes no endpoints file: the
    # ports given to it are where it listens.
    running = endpoints.read(data_dir) or {e.service: [e] for e in assigned}
    addrs = {name: endpoints.target([e.addr for e in group]) for name, group in running.items()}
    metrics = {
        (e.name if cluster else e.service): e.metrics for group in running.values() for e in group
    }
    for name, target in addrs.items():
        env[f"HIPPO_CLI_{name.upper()}_ADDR"] = target
    if tls:  # the files `hippo up --tls` made (hippo_cli.launcher._make_certs)
        certs = data_dir / "tls"
        env["HIPPO_CLI_TLS__CA_FILE"] = str(certs / "ca.pem")
        env["HIPPO_CLI_TLS__CERT_FILE"] = str(certs / "operator.pem")
        env["HIPPO_CLI_TLS__KEY_FILE"] = str(certs / "operator.key")
    local = LocalCluster(env, addrs, metrics, banner, data_dir, running, launcher=launcher)
    # Keep reading what the launcher prints (restarts, then the shutdown): a full pipe
    # would block it mid-sentence.
    after: list[str] = []
    reader = threading.Thread(target=lambda: after.extend(launcher.stdout or ()), daemon=True)
    reader.start()
    try:
        yield local
    finally:
        launcher.send_signal(signal.SIGINT)
        launcher.wait(timeout=180)
        reader.join(10)
        local.shutdown = [line.rstrip("\n") for line in after]
