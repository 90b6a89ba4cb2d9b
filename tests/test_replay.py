"""`hippo replay` against a local cluster that is deliberately easy to overload: the
gateway allows the tenant 8 calls/s (burst 2, answered RESOURCE_EXHAUSTED with RetryInfo
beyond) and the embedding queue holds 16 texts. A replay must finish anyway, store every
turn once, apply nothing of a bad file, and resume after a SIGKILL."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import locomo_sample
import pytest

from hippo_cli.cluster import LocalCluster, local_cluster

BIN = Path(sys.executable).parent


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalCluster]:
    env = {
        "HIPPO_GATEWAY_DEFAULT_QUOTA": json.dumps({"requests_per_second": 8, "burst": 2}),
        "HIPPO_EMBEDDING_MAX_QUEUED_TEXTS": "16",
    }
    with local_cluster(tmp_path_factory.mktemp("var"), env) as running:
        yield running


def _hippo(cluster: LocalCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(BIN / "hippo"), *args], env=cluster.env, capture_output=True, text=True, timeout=120
    )


def _erased(cluster: LocalCluster, user: str) -> int:
    forgot = _hippo(cluster, "forget", "--user", user, "--yes")
    assert forgot.returncode == 0, forgot.stderr
    found = re.search(r"erased (\d+) memories", forgot.stdout)
    assert found, forgot.stdout
    return int(found.group(1))


def test_replay_at_concurrency_8_completes_under_a_tiny_quota(
    busy: LocalCluster, tmp_path: Path
) -> None:
    """Refusals slow the replay down and never fail it; every turn is stored once."""
    data = locomo_sample.write(tmp_path / "archive.json", conversations=6)
    result = _hippo(busy, "replay", "--concurrency", "8", "--user-prefix", "busy-", str(data))
    assert result.returncode == 0, result.stderr
    assert "72 turns of 6 conversations: 72 stored, 0 already stored" in result.stdout
    retries = re.search(r"(\d+) retries\)", result.stdout)
    assert retries and int(retries.group(1)) > 0, result.stdout  # the quota did refuse
    assert re.search(r"replay: 72/72 turns \(100%\), \d+ turns/s, concurrency \d/8", result.stderr)
    assert [_erased(busy, f"busy-conv-{n}") for n in range(6)] == [12] * 6


def test_a_bad_date_fails_the_file_before_anything_is_sent(
    busy: LocalCluster, tmp_path: Path
) -> None:
    samples = [locomo_sample.conversation(0), locomo_sample.conversation(1)]
    samples[1]["conversation"]["session_3_date_time"] = "31.02.2023"
    data = tmp_path / "bad.json"
    data.write_text(json.dumps(samples))
    result = _hippo(busy, "replay", "--user-prefix", "bad-", str(data))
    assert result.returncode == 2
    assert (
        f"error: {data}: conversation conv-1: session_3_date_time: cannot read the date: "
        "'31.02.2023'" in result.stderr
    )
    assert "Traceback" not in result.stderr
    for user in ("bad-conv-0", "bad-conv-1"):  # not even the good conversation was sent
        recall = _hippo(busy, "recall", "budget", "--user", user, "--mode", "lexical")
        assert "no memories found" in recall.stdout, recall.stdout + recall.stderr


def test_a_killed_replay_resumes_and_stores_each_turn_once(
    busy: LocalCluster, tmp_path: Path
) -> None:
    conversations = 8
    data = tmp_path / "kill.json"
    data.write_text(
        json.dumps([locomo_sample.conversation(n, sessions=6) for n in range(conversations)])
    )
    command = [str(BIN / "hippo"), "replay", "--concurrency", "2", "--user-prefix", "kill-"]
    proc = subprocess.Popen(
        [*command, str(data)],
        env=busy.env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    progress_dir = busy.data_dir / "replay"
    deadline = time.monotonic() + 60
    recorded = 0
    while recorded < 6 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
        for path in progress_dir.glob("kill.json.*.progress.json"):
            sessions = json.loads(path.read_text())["sessions"]
            recorded = sum(len(v) for v in sessions.values())
    proc.kill()
    assert proc.wait() == -9, "the replay finished before it could be killed part-way"
    (progress,) = progress_dir.glob("kill.json.*.progress.json")

    rerun = subprocess.run(
        [*command, str(data)], env=busy.env, capture_output=True, text=True, timeout=120
    )
    assert rerun.returncode == 0, rerun.stderr
    total = conversations * 6 * 4
    skipped = re.search(r"(\d+) skipped \(acknowledged in an earlier run\)", rerun.stdout)
    assert skipped and int(skipped.group(1)) >= 6 * 4, rerun.stdout
    assert not progress.exists()  # a finished replay leaves no record to resume from

    again = _hippo(busy, "replay", "--restart", "--user-prefix", "kill-", str(data))
    assert f"{total} turns of {conversations} conversations: 0 stored, {total} already" in (
        again.stdout
    ), again.stdout + again.stderr
    assert [_erased(busy, f"kill-conv-{n}") for n in range(conversations)] == [24] * conversations
