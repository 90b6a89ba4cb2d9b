"""The images, run: the compose cluster's six services in a podman pod (scripts/
podman_cluster.py), a Remember/Recall/BuildContext round trip through the README's CLI
against the containerised gateway, a graceful stop (every container exits 0 on SIGTERM
within compose's grace), and the data still there after the containers are recreated on
the same volumes.

Runs where podman is installed and `make images` has built the six images; skipped
otherwise, with that reason (CI machines have no podman). Slow: the first start converts
the injection model into its volume (1-2 minutes on 2 cores).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "scripts" / "podman_cluster.py"
SERVICES = ("embedding", "injection", "retrieval", "summariser", "audit", "gateway")
ENV = {**os.environ, "CONTAINERS_CONF": str(ROOT / "deploy" / "podman" / "containers.conf")}


def _images_missing() -> list[str]:
    return [
        s
        for s in SERVICES
        if subprocess.run(
            ["podman", "image", "exists", f"localhost/hippo-{s}:0.1.0"], env=ENV
        ).returncode
        != 0
    ]


pytestmark = [
    pytest.mark.skipif(shutil.which("podman") is None, reason="podman is not installed"),
]


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


def test_round_trip_graceful_stop_and_restart_in_containers() -> None:
    missing = _images_missing()
    if missing:
        pytest.skip(f"images not built ({', '.join(missing)}): run `make images` first")
    cluster("down", "--volumes")
    try:
        started = cluster("up")
        assert all(f"{s}" in started and "healthy" in started for s in SERVICES), started

        hippo("remember", "--user", "alice", "--session", "s1", "I moved to Lisbon in May")
        hits = json.loads(hippo("recall", "where does she live now?", "--user", "alice", "--json"))
        assert "Lisbon" in json.dumps(hits)
        built = json.loads(
            hippo("context", "where do I live?", "--user", "alice", "--session", "s1", "--json")
        )
        assert "Lisbon" in json.dumps(built)

        stopped = cluster("down")
        assert stopped.count("exit code 0") == len(SERVICES), stopped

        cluster("up")
        again = json.loads(hippo("recall", "Lisbon", "--user", "alice", "--json"))
        assert "Lisbon" in json.dumps(again), "the memory did not survive the restart"
    finally:
        cluster("down", "--volumes")
