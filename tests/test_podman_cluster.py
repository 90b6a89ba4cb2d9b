"""The images, run: the compose cluster's six services and Prometheus in a podman pod
(scripts/podman_cluster.py), once with their embedded stores and once in cluster mode
with PostgreSQL in the pod as the state of record; each time a Remember/Recall/
BuildContext round trip through the README's CLI against the containerised gateway,
Prometheus scraping all six, a graceful stop (every container exits 0 on SIGTERM within
compose's grace), and the data still there after the containers are recreated on the
same volumes.

Runs where podman is installed (skipped otherwise, with that reason: CI machines have no
podman). Images that are missing are built first with scripts/podman_images.sh (`make
images`: ~5 minutes on 2 cores; skipped if runc or mmdebstrap, which it needs, are
missing). Slow: the first start converts the injection model into its volume (~50 s).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "podman_cluster.py"
SERVICES = ("embedding", "injection", "retrieval", "summariser", "audit", "gateway")
IMAGES = [f"hippo-{s}:0.1.0" for s in SERVICES] + [
    "hippo-prometheus:debian",
    "hippo-postgres:debian",
]
ENV = {**os.environ, "CONTAINERS_CONF": str(ROOT / "deploy" / "podman" / "containers.conf")}


def _images_missing() -> list[str]:
    return [
        image
        for image in IMAGES
        if subprocess.run(["podman", "image", "exists", f"localhost/{image}"], env=ENV).returncode
        != 0
    ]


pytestmark = [
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed"),
]


@pytest.fixture(scope="module")
def images() -> None:
    """Build what `make images` would, if any image is missing."""
    missing = _images_missing()
    if not missing:
        return
    absent = [tool for tool in ("runc", "mmdebstrap") if shutil.which(tool) is None]
    if absent:
        pytest.skip(f"images missing ({', '.join(missing)}) and {', '.join(absent)} not installed")
    built = subprocess.run(
        ["bash", str(ROOT / "scripts" / "podman_images.sh")],
        env=ENV,
        capture_output=True,
        text=True,
        timeout=3600,
    )
    assert built.returncode == 0, built.stdout + built.stderr[-4000:]
    assert _images_missing() == []


def cluster(*args: str) -> str:
    out = subprocess.run(
        [sys.executable, str(SCRIPT), *args], env=ENV, capture_output=True, text=True, timeout=1800
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def hippo(*args: str) -> str:
    out = subprocess.run(
        [str(Path(sys.executable).parent / "hippo"), *args],
        env={**os.environ, "HIPPO_CLI_GATEWAY_ADDR": "127.0.0.1:50051"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return out.stdout


def postgres_count(table: str) -> int:
    password = (ROOT / "var" / "podman" / "postgres-password").read_text().strip()
    psql = ["psql", "-h", "/tmp", "-U", "hippo", "-d", "hippo", "-Atc"]
    out = subprocess.run(
        ["podman", "exec", "-e", f"PGPASSWORD={password}", "hippo-postgres", *psql,
         f"SELECT count(*) FROM {table}"],
        env=ENV, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    return int(out.stdout)


def scraped_services(timeout: float = 90) -> set[str]:
    """The services whose /metrics Prometheus scraped successfully (15 s interval)."""
    deadline = time.monotonic() + timeout
    up: set[str] = set()
    while time.monotonic() < deadline:
        with urllib.request.urlopen("http://127.0.0.1:9090/api/v1/targets", timeout=5) as r:
            targets = json.load(r)["data"]["activeTargets"]
        up = {t["labels"]["service"] for t in targets if t["health"] == "up"}
        if up == set(SERVICES):
            break
        time.sleep(3)
    return up


@pytest.mark.parametrize("mode", ["embedded", "postgres"])
@pytest.mark.timeout(3600)  # building the images, when missing, happens in the fixture
def test_round_trip_graceful_stop_and_restart_in_containers(images: None, mode: str) -> None:
    cluster("down", "--volumes")
    try:
        up = ["up", "--postgres"] if mode == "postgres" else ["up"]
        started = cluster(*up)
        healthy = {line.split()[0] for line in started.splitlines() if "healthy after" in line}
        assert healthy >= set(SERVICES), started

        hippo("remember", "--user", "alice", "--session", "s1", "I moved to Lisbon in May")
        hits = json.loads(hippo("recall", "where does she live now?", "--user", "alice", "--json"))
        assert "Lisbon" in json.dumps(hits)
        built = json.loads(
            hippo("context", "where do I live?", "--user", "alice", "--session", "s1", "--json")
        )
        assert "Lisbon" in json.dumps(built)

        assert scraped_services() == set(SERVICES)
        if mode == "postgres":  # the state of record is PostgreSQL's, not a volume's file
            assert postgres_count("hippo_retrieval.turns") >= 1
            assert postgres_count("hippo_audit.entries") >= 1

        stopped = cluster("down")
        # + prometheus (+ postgres)
        assert stopped.count("exit code 0") == len(SERVICES) + 1 + (mode == "postgres"), stopped

        cluster(*up)
        again = json.loads(hippo("recall", "Lisbon", "--user", "alice", "--json"))
        assert "Lisbon" in json.dumps(again), "the memory did not survive the restart"
    finally:
        cluster("down", "--volumes")
