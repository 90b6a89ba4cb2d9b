"""Where the tests find Prometheus's promtool: on PATH, or unpacked from Debian's package
into the venv by `make prometheus` (which `make test` runs)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
_UNPACKED = ROOT / ".venv" / "prometheus" / "usr" / "bin" / "promtool"
PROMTOOL = shutil.which("promtool") or (str(_UNPACKED) if _UNPACKED.exists() else None)
needs_promtool = pytest.mark.skipif(
    PROMTOOL is None, reason="promtool (Debian package prometheus) is not installed"
)
