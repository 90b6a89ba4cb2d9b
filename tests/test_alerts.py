"""Alert rules (charts/hippo/rules/hippo-alerts.yaml): they parse, they fire on the series
they are meant for (promtool unit tests in tests/alerts/), every metric they read is
exported by a service, and every alert has a runbook section in docs/operations.md."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import yaml
from prometheus_tools import PROMTOOL, needs_promtool

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "charts" / "hippo" / "rules" / "hippo-alerts.yaml"
UNIT_TESTS = ROOT / "tests" / "alerts" / "hippo-alerts.test.yaml"
OPERATIONS = ROOT / "docs" / "operations.md"


def alerts() -> list[dict[str, object]]:
    groups = yaml.safe_load(RULES.read_text())["groups"]
    return [rule for group in groups for rule in group["rules"]]


@needs_promtool
def test_promtool_check_rules() -> None:
    assert PROMTOOL is not None
    run = subprocess.run(
        [PROMTOOL, "check", "rules", str(RULES)],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in run.stdout


@needs_promtool
def test_promtool_unit_tests() -> None:
    """Each alert fires on its symptom (with the annotations an operator reads) and stays
    quiet on healthy series and on callers' own mistakes."""
    assert PROMTOOL is not None
    run = subprocess.run(
        [PROMTOOL, "test", "rules", str(UNIT_TESTS)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=UNIT_TESTS.parent,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    tested = set(re.findall(r"alertname: (\w+)", UNIT_TESTS.read_text()))
    # The core alerts of the issue are all exercised.
    assert {
        "HippoHighErrorRate",
        "HippoApiLatencyHigh",
        "HippoIndexLag",
        "HippoMergeLagHigh",
        "HippoMergeBacklogHigh",
        "HippoAuditCheckpointStale",
    } <= tested


def _exported_names() -> set[str]:
    """Metric names defined in the services' code (prometheus_client adds _total, _bucket,
    _sum, _count itself)."""
    names: set[str] = set()
    for src in [*ROOT.glob("libs/*/src"), *ROOT.glob("services/*/src")]:
        for py in src.rglob("*.py"):
            names |= set(re.findall(r"[\"']((?:hippo|grpc)_[a-z0-9_]+)[\"']", py.read_text()))
    return names


def test_every_metric_in_the_rules_is_exported() -> None:
    exported = _exported_names()
    used: set[str] = set()
    for rule in alerts():
        used |= set(re.findall(r"\b((?:hippo|grpc)_[a-z0-9_]+)\b", str(rule["expr"])))
    assert used
    label_names = {"grpc_service", "grpc_method", "grpc_code", "grpc_type"}
    missing = []
    for name in sorted(used - label_names):
        base = re.sub(r"_(total|bucket|sum|count)$", "", name)
        if name not in exported and base not in exported:
            missing.append(name)
    assert missing == []


def test_every_alert_has_a_runbook_section() -> None:
    text = OPERATIONS.read_text()
    headings = {
        re.sub(r"[^a-z0-9 -]", "", h.strip().lower()).replace(" ", "-")
        for h in re.findall(r"^#+ (.+)$", text, flags=re.M)
    }
    for rule in alerts():
        annotations = rule["annotations"]
        assert isinstance(annotations, dict)
        anchor = str(annotations["runbook"]).removeprefix("docs/operations.md#")
        assert anchor == str(rule["alert"]).lower()
        assert anchor in headings, f"docs/operations.md has no section for {rule['alert']}"
