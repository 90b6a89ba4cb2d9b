"""Run the compose cluster's Hippo services in one podman pod, on a machine with podman
but no compose engine or image registry (the dev machines; see scripts/podman_images.sh).

deploy/compose/compose.yaml stays the one description of the containers: each service
with a `build:` section is started from its image with that file's user, read-only root,
dropped capabilities, tmpfs, named volumes, environment and stop grace, in its
depends_on order. The containers share one pod, so compose's service names resolve to
the pod's loopback (--add-host) and the file's peer addresses work unchanged.

Left out, with the reason: qdrant, otel-collector, grafana and prometheus have no image
source here (no registry); retrieval then keeps vectors in its in-process Qdrant engine
on its volume, and no traces are exported.

    python scripts/podman_cluster.py up      # start, wait until every container is healthy
    python scripts/podman_cluster.py down    # graceful stop (SIGTERM, compose's grace)
    python scripts/podman_cluster.py down --volumes
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import yaml  # type: ignore[import-untyped]

ROOT = Path(__file__).resolve().parents[1]
COMPOSE = ROOT / "deploy" / "compose" / "compose.yaml"
POD = "hippo"
# Settings that name a left-out service: dropped, so the service uses its default.
LEFT_OUT_SETTINGS = ("_OTLP_ENDPOINT", "_QDRANT_URL")


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], text=True, capture_output=True, check=check)


def hippo_services(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {name: svc for name, svc in spec["services"].items() if "build" in svc}


def start_order(services: dict[str, dict[str, Any]]) -> list[str]:
    order: list[str] = []

    def visit(name: str) -> None:
        if name in order or name not in services:
            return
        for dep in services[name].get("depends_on", {}):
            visit(dep)
        order.append(name)

    for name in services:
        visit(name)
    return order


def grace_seconds(svc: dict[str, Any]) -> int:
    return int(str(svc.get("stop_grace_period", "10s")).rstrip("s"))


def run_args(name: str, svc: dict[str, Any]) -> list[str]:
    args = ["run", "-d", "--pod", POD, "--name", f"{POD}-{name}", "--user", svc["user"]]
    if svc.get("read_only"):
        args.append("--read-only")
    args += [f"--cap-drop={c}" for c in svc.get("cap_drop", [])]
    args += [f"--security-opt={o.replace(':true', '')}" for o in svc.get("security_opt", [])]
    args += [f"--tmpfs={t}" for t in svc.get("tmpfs", [])]
    args += [f"--stop-timeout={grace_seconds(svc)}"]
    for vol in svc.get("volumes", []):
        src, dst = vol.split(":")[:2]
        args += ["-v", f"{POD}-{src}:{dst}"]
    for key, value in (svc.get("environment") or {}).items():
        if not key.endswith(LEFT_OUT_SETTINGS):
            args += ["-e", f"{key}={value}"]
    return [*args, f"localhost/{svc['image']}"]


def wait_healthy(name: str, timeout: float) -> float:
    """Seconds until the image's HEALTHCHECK passes. podman runs health checks from
    systemd timers, which this host lacks, so the check is run here, as the timer would."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        state = podman("inspect", "--format", "{{.State.Status}}", f"{POD}-{name}").stdout.strip()
        if state not in ("running", "created"):
            logs = podman("logs", "--tail", "20", f"{POD}-{name}", check=False)
            sys.exit(f"error: {name} is {state}:\n{logs.stdout}{logs.stderr}")
        if podman("healthcheck", "run", f"{POD}-{name}", check=False).returncode == 0:
            return time.monotonic() - start
        time.sleep(2)
    sys.exit(f"error: {name} not healthy after {timeout:.0f} s")


def up(timeout: float) -> None:
    services = hippo_services(yaml.safe_load(COMPOSE.read_text()))
    ports = [p for svc in services.values() for p in svc.get("ports", [])]
    hosts = [f"--add-host={name}:127.0.0.1" for name in services]
    podman("pod", "create", "--name", POD, *hosts, *[f"-p={p}" for p in ports])
    for name in start_order(services):
        podman(*run_args(name, services[name]))
        print(f"{name:<11} healthy after {wait_healthy(name, timeout):5.1f} s", flush=True)
    print("left out (no image source here): qdrant, otel-collector, grafana, prometheus")


def down(volumes: bool) -> None:
    services = hippo_services(yaml.safe_load(COMPOSE.read_text()))
    for name in reversed(start_order(services)):
        ctr = f"{POD}-{name}"
        if podman("container", "exists", ctr, check=False).returncode != 0:
            continue
        podman("stop", "-t", str(grace_seconds(services[name])), ctr, check=False)
        code = podman("inspect", "--format", "{{.State.ExitCode}}", ctr).stdout.strip()
        print(f"{name:<11} stopped, exit code {code}", flush=True)
        podman("rm", ctr)
    podman("pod", "rm", "-f", POD, check=False)
    if volumes:
        for vol in {v.split(":")[0] for s in services.values() for v in s.get("volumes", [])}:
            podman("volume", "rm", "-f", f"{POD}-{vol}", check=False)


def main() -> None:
    os.environ.setdefault("CONTAINERS_CONF", str(ROOT / "deploy" / "podman" / "containers.conf"))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="start the pod; wait until every container is healthy")
    p_up.add_argument("--timeout", type=float, default=900, help="seconds per container")
    p_down = sub.add_parser("down", help="stop gracefully and remove the containers")
    p_down.add_argument("--volumes", action="store_true", help="also remove the data")
    args = parser.parse_args()
    if args.cmd == "up":
        up(args.timeout)
    else:
        down(args.volumes)


if __name__ == "__main__":
    main()
