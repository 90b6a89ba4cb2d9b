"""Repository contracts: the example env file and the Makefile's interface."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from hippo_cli.registry import settings_classes
from hippo_core import envfile

ROOT = Path(__file__).resolve().parent.parent


def test_env_example_lists_every_setting_with_its_default() -> None:
    committed = (ROOT / "deploy" / "hippo.env.example").read_text()
    assert committed == envfile.render(settings_classes()), "run `make env-example` and commit"


def test_env_example_variables_configure_the_services(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every variable in the file is read by its service (no dead names), nested ones too."""
    example = (ROOT / "deploy" / "hippo.env.example").read_text().splitlines()
    names = [line.split("=", 1)[0] for line in example if line and not line.startswith("#")]
    assert "HIPPO_EMBEDDING_CLIENT__TIMEOUT_SECONDS" in names
    for title, cls in settings_classes():
        ours = [n for n in names if n.startswith(str(cls.model_config["env_prefix"]))]
        assert ours, title
    from hippo_embedding.settings import EmbeddingSettings

    monkeypatch.setenv("HIPPO_EMBEDDING_CLIENT__TIMEOUT_SECONDS", "2.5")
    monkeypatch.setenv("HIPPO_EMBEDDING_MAX_BATCH", "32")
    changed = EmbeddingSettings()
    assert changed.client.timeout_seconds == 2.5 and changed.max_batch == 32
    monkeypatch.setenv("HIPPO_EMBEDDING_MAX_BATCH", "0")
    with pytest.raises(ValueError, match="max_batch"):
        EmbeddingSettings()


def test_make_help_lists_the_interface() -> None:
    out = subprocess.run(
        ["make", "-s", "help"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    for target in ("run", "test", "lint", "proto", "proto-check", "bench", "env-example"):
        assert f"make {target} " in out, target


def test_generated_code_is_current() -> None:
    result = subprocess.run(
        [sys.executable, "scripts/gen_protos.py", "--check"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert result.returncode == 0, result.stdout + result.stderr
