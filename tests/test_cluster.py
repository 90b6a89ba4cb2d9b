"""The local cluster through the launcher, as `make run` starts it, and the CLI against it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from hippo_core.testing import free_port

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    port, metrics_port = free_port(), free_port()
    env = {
        **os.environ,
        "HIPPO_EMBEDDING_PORT": str(port),
        "HIPPO_EMBEDDING_METRICS_PORT": str(metrics_port),
        "HIPPO_CLI_EMBEDDING_ADDR": f"127.0.0.1:{port}",
        "HIPPO_CLI_DATA_DIR": str(tmp_path_factory.mktemp("var")),
    }
    launcher = subprocess.Popen(
        [str(BIN / "hippo"), "up"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    banner: list[str] = []
    assert launcher.stdout is not None
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        line = launcher.stdout.readline()
        if not line:
            break
        banner.append(line)
        if "Ctrl-C stops everything" in line:
            break
    text = "".join(banner)
    assert "Hippo is up" in text, text
    try:
        yield {**env, "banner": text}
    finally:
        launcher.send_signal(signal.SIGINT)
        rest, _ = launcher.communicate(timeout=60)
        env["shutdown"] = rest
        assert launcher.returncode == 0, rest
        assert "embedding stopped (exit code 0)" in rest


def _hippo(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "hippo"), *args], env=env, capture_output=True, text=True, timeout=60
    )


def test_banner_shows_endpoints_and_a_first_example(cluster: dict[str, str]) -> None:
    banner = cluster["banner"]
    assert f"grpc 127.0.0.1:{cluster['HIPPO_EMBEDDING_PORT']}" in banner
    assert "hippo embed" in banner and "EmbeddingServiceStub" in banner


def test_hippo_health_reports_serving(cluster: dict[str, str]) -> None:
    result = _hippo(cluster, "health", "--json")
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["embedding"]["status"] == "SERVING"


def test_hippo_embed_prints_vectors_and_similarity(cluster: dict[str, str]) -> None:
    result = _hippo(
        cluster,
        "embed",
        "--json",
        "I love hiking",
        "Trekking in the hills is my passion",
        "Tax forms",
    )
    assert result.returncode == 0, result.stderr
    vectors = json.loads(result.stdout)["vectors"]
    assert len(vectors) == 3 and len(vectors[0]) == 384
    dot = lambda a, b: sum(x * y for x, y in zip(a, b, strict=True))  # noqa: E731
    assert dot(vectors[0], vectors[1]) > dot(vectors[0], vectors[2])
    table = _hippo(cluster, "embed", "hello world")
    assert "384" in table.stdout and "|v|=1.000" in table.stdout


def test_cli_errors_are_readable(cluster: dict[str, str]) -> None:
    result = _hippo(cluster, "embed", "x" * 9000)
    assert result.returncode == 2
    assert "INVALID_ARGUMENT: texts[0]: at most 8192 characters, got 9000" in result.stderr


def test_health_fails_when_nothing_listens() -> None:
    env = {**os.environ, "HIPPO_CLI_EMBEDDING_ADDR": f"127.0.0.1:{free_port()}"}
    result = _hippo(env, "health")
    assert result.returncode == 1 and "UNREACHABLE" in result.stdout
