"""Run the compose cluster's Hippo services in one podman pod, on a machine with podman
but no compose engine or image registry (the dev machines; see scripts/podman_images.sh).

deploy/compose/compose.yaml stays the one description of the containers: each service
with a `build:` section is started from its image with that file's user, read-only root,
dropped capabilities, tmpfs, named volumes, environment and stop grace, in its
depends_on order. The containers share one pod, so compose's service names resolve to
the pod's loopback (--add-host) and the file's peer addresses work unchanged.

Prometheus runs from an image of Debian's package (deploy/podman/prometheus.Containerfile,
built by `make images`) with compose's command, config, alert rules and volume. Left
out, with the reason: qdrant, otel-collector and grafana have no image source here (no
registry); retrieval then keeps vectors in its in-process Qdrant engine on its volume,
and no traces are exported.

    python scripts/podman_cluster.py up      # start, wait until every container is healthy
    python scripts/podman_cluster.py up --postgres   # cluster mode: PostgreSQL as the
                                     # state of record (an image of Debian's package)
    python scripts/podman_cluster.py down    # graceful stop (SIGTERM, compose's grace)
    python scripts/podman_cluster.py down --volumes
"""

from __future__ import annotations

import argparse
import os
import secrets
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
# Services compose pulls from a registry, run here from images made of Debian's packages.
LOCAL_IMAGES = {"prometheus": "localhost/hippo-prometheus:debian"}
LEFT_OUT = "qdrant, otel-collector, grafana"
POSTGRES_IMAGE = "localhost/hippo-postgres:debian"
POSTGRES_GRACE = 20
# Cluster-mode secrets, made on the first `up --postgres` and kept for the volumes' life:
# initdb sets the password once, and audit's checkpoints verify only under the key that
# signed them (the same files `hippo up --cluster` makes under its data dir).
SECRETS = ROOT / "var" / "podman"


def cluster_secrets() -> tuple[str, list[str]]:
    """PostgreSQL's password, and the `--env` pairs every replica must share."""
    from hippo_cli.launcher import new_signing_key
    from hippo_core.files import secret_file

    password = secret_file(SECRETS / "postgres-password", lambda: secrets.token_hex(18).encode())
    key = secret_file(SECRETS / "audit-signing.key", new_signing_key)
    return password.decode().strip(), [f"--env=HIPPO_AUDIT_SIGNING_KEY={key.decode().strip()}"]


def database_settings(url: str) -> list[str]:
    """`--env` pairs pointing every service that has a store at PostgreSQL, as `hippo up
    --cluster` does."""
    from hippo_cli.registry import SERVICES

    return [
        f"--env=HIPPO_{spec.name.upper()}_DATABASE__URL={url}"
        for spec in SERVICES
        if "database" in spec.settings_type().model_fields
    ]


def podman(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["podman", *args], text=True, capture_output=True, check=check)


def hippo_services(spec: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The services this pod runs: every built one, and those with a local image."""
    return {
        name: svc
        for name, svc in spec["services"].items()
        if "build" in svc or name in LOCAL_IMAGES
    }


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


def run_args(name: str, svc: dict[str, Any], extra: list[str]) -> list[str]:
    args = ["run", "-d", "--pod", POD, "--name", f"{POD}-{name}", *extra]
    if "user" in svc:
        args += ["--user", svc["user"]]
    if svc.get("read_only"):
        args.append("--read-only")
    args += [f"--cap-drop={c}" for c in svc.get("cap_drop", [])]
    args += [f"--security-opt={o.replace(':true', '')}" for o in svc.get("security_opt", [])]
    args += [f"--tmpfs={t}" for t in svc.get("tmpfs", [])]
    args += [f"--stop-timeout={grace_seconds(svc)}"]
    for vol in svc.get("volumes", []):
        src, dst, *mode = vol.split(":")
        if src.startswith("."):  # a bind mount, relative to the compose file
            src = str((COMPOSE.parent / src).resolve())
            args += ["-v", ":".join([src, dst, *mode])]
        else:
            args += ["-v", f"{POD}-{src}:{dst}"]
    for key, value in (svc.get("environment") or {}).items():
        if not key.endswith(LEFT_OUT_SETTINGS):
            args += ["-e", f"{key}={value}"]
    image = LOCAL_IMAGES.get(name) or f"localhost/{svc['image']}"
    return [*args, image, *svc.get("command", [])]


def wait_healthy(name: str, timeout: float) -> float:
    """Seconds until the image's HEALTHCHECK passes. podman runs health checks from
    systemd timers, which this host lacks, so the check is run here, as the timer would."""
    start = time.monotonic()
    while time.monotonic() - start < timeout:
        state = podman("inspect", "--format", "{{.State.Status}}", f"{POD}-{name}").stdout.strip()
        if state not in ("running", "created"):
            logs = podman("logs", "--tail", "20", f"{POD}-{name}", check=False)
            sys.exit(f"error: {name} is {state}:\n{logs.stdout}{logs.stderr}")
        probe = podman("healthcheck", "run", f"{POD}-{name}", check=False)
        # No HEALTHCHECK in the image (Prometheus): running is as far as it goes.
        if probe.returncode == 0 or "has no defined healthcheck" in probe.stderr:
            return time.monotonic() - start
        time.sleep(2)
    sys.exit(f"error: {name} not healthy after {timeout:.0f} s")


def up(timeout: float, postgres: bool) -> None:
    services = hippo_services(yaml.safe_load(COMPOSE.read_text()))
    ports = [p for svc in services.values() for p in svc.get("ports", [])]
    hosts = [f"--add-host={name}:127.0.0.1" for name in [*services, "postgres"]]
    podman("pod", "create", "--name", POD, *hosts, *[f"-p={p}" for p in ports])
    extra: list[str] = []
    if postgres:
        password, shared = cluster_secrets()
        podman(
            "run", "-d", "--pod", POD, "--name", f"{POD}-postgres", "--read-only",
            "--tmpfs=/tmp:mode=1777", "--cap-drop=ALL", "--security-opt=no-new-privileges",
            f"--stop-timeout={POSTGRES_GRACE}", f"--env=POSTGRES_PASSWORD={password}",
            "-v", f"{POD}-postgres:/var/lib/postgresql/data", POSTGRES_IMAGE,
        )  # fmt: skip
        print(f"{'postgres':<11} healthy after {wait_healthy('postgres', timeout):5.1f} s")
        extra = [*database_settings(f"postgresql://hippo:{password}@postgres:5432/hippo"), *shared]
    for name in start_order(services):
        podman(*run_args(name, services[name], extra))
        print(f"{name:<11} healthy after {wait_healthy(name, timeout):5.1f} s", flush=True)
    print(f"left out (no image source here): {LEFT_OUT}")


def stop(name: str, grace: int) -> None:
    """SIGTERM (the image's STOPSIGNAL), `grace` seconds, then remove; says the exit code."""
    ctr = f"{POD}-{name}"
    if podman("container", "exists", ctr, check=False).returncode != 0:
        return
    podman("stop", "-t", str(grace), ctr, check=False)
    code = podman("inspect", "--format", "{{.State.ExitCode}}", ctr).stdout.strip()
    print(f"{name:<11} stopped, exit code {code}", flush=True)
    podman("rm", ctr)


def down(volumes: bool) -> None:
    services = hippo_services(yaml.safe_load(COMPOSE.read_text()))
    for name in reversed(start_order(services)):
        stop(name, grace_seconds(services[name]))
    stop("postgres", POSTGRES_GRACE)  # last: the services' store
    podman("pod", "rm", "-f", POD, check=False)
    if volumes:
        podman("volume", "rm", "-f", f"{POD}-postgres", check=False)
        named = {v.split(":")[0] for s in services.values() for v in s.get("volumes", [])}
        for vol in {v for v in named if not v.startswith(".")}:  # not bind mounts
            podman("volume", "rm", "-f", f"{POD}-{vol}", check=False)
        for secret in SECRETS.glob("*"):  # they belonged to the data just removed
            secret.unlink()


def main() -> None:
    os.environ.setdefault("CONTAINERS_CONF", str(ROOT / "deploy" / "podman" / "containers.conf"))
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="cmd", required=True)
    p_up = sub.add_parser("up", help="start the pod; wait until every container is healthy")
    p_up.add_argument("--timeout", type=float, default=900, help="seconds per container")
    p_up.add_argument(
        "--postgres", action="store_true", help="cluster mode: PostgreSQL as the state of record"
    )
    p_down = sub.add_parser("down", help="stop gracefully and remove the containers")
    p_down.add_argument("--volumes", action="store_true", help="also remove the data")
    args = parser.parse_args()
    if args.cmd == "up":
        up(args.timeout, args.postgres)
    else:
        down(args.volumes)


if __name__ == "__main__":
    main()
