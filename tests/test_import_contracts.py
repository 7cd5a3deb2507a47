"""The import contracts of ``pyproject.toml`` hold: the core and the span mapping are pure, the
engine knows no OpenTelemetry (``docs/architecture.md`` draws the map)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_the_import_contracts_hold() -> None:
    lint = shutil.which("lint-imports")
    if lint is None:
        if os.environ.get("CI", "").lower() == "true":
            raise RuntimeError("import-linter is not installed: pip install -e '.[test]'")
        pytest.skip("SKIPPED LOUDLY: import-linter is not installed (pip install -e '.[test]')")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), *sys.path])}
    result = subprocess.run(
        [lint, "--config", str(ROOT / "pyproject.toml")],
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "0 broken" in result.stdout
