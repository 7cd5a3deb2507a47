"""Every ```python block of README.md and docs/*.md runs as written.

A block runs in a fresh namespace, in an empty temporary working directory, with no
``TRIPWIRE_*`` variable set. One that needs a service or an optional extra that is not at hand
may be preceded by ``<!-- docs-test: skip REASON -->``; the reason is shown in the test report.
Blocks of one file run in order, each on its own. ``bash`` blocks that are one ``tripwire demo``
or ``tripwire --help``-style call run too (cheap and offline).
"""

from __future__ import annotations

import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_BLOCK = re.compile(
    r"(?:<!--\s*docs-test:\s*skip\s+(?P<skip>.*?)\s*-->\s*\n)?^```(?P<lang>[a-z]*)[^\n]*\n(?P<code>.*?)^```",
    re.MULTILINE | re.DOTALL,
)


def _blocks(lang: str) -> list[tuple[str, str, str | None]]:
    out = []
    for path in FILES:
        text = path.read_text(encoding="utf-8")
        for match in _BLOCK.finditer(text):
            if match["lang"] != lang:
                continue
            line = text[: match.start("code")].count("\n") + 1
            out.append((f"{path.relative_to(ROOT)}:{line}", match["code"], match["skip"]))
    return out


PYTHON = _blocks("python")

KNOWN_BROKEN: dict[str, str] = {}
"""Blocks in other engineers' files that do not run yet (xfail, not skipped: they show up)."""


def test_the_docs_have_python_blocks() -> None:
    assert len(PYTHON) >= 10
    assert any(where.startswith("README.md") for where, _, _ in PYTHON)


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIPWIRE_")}
    if os.environ.get("TRIPWIRE_NO_EXTENSIONS"):
        env["TRIPWIRE_NO_EXTENSIONS"] = os.environ["TRIPWIRE_NO_EXTENSIONS"]
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    return env


@pytest.mark.parametrize(("where", "code", "skip"), PYTHON, ids=[w for w, _, _ in PYTHON])
def test_python_block_runs(where: str, code: str, skip: str | None, tmp_path: Path) -> None:
    if skip:
        pytest.skip(f"{where}: {skip}")
    if where in KNOWN_BROKEN:
        pytest.xfail(KNOWN_BROKEN[where])
    # A subprocess: a block may install a global TracerProvider or change process state.
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True,
        timeout=120,
    )
    assert result.returncode == 0, f"{where} failed:\n{result.stderr[-3000:]}"


_CHEAP = ("tripwire demo", "tripwire --help", "tripwire --version")
BASH = [
    (where, part.strip(), skip)
    for where, code, skip in _blocks("bash")
    for line in code.splitlines()
    for part in line.split("&&")
    if part.strip().startswith(_CHEAP) and "|" not in part
]


@pytest.mark.parametrize(("where", "command", "skip"), BASH, ids=[f"{w} {c}" for w, c, _ in BASH])
def test_cheap_bash_lines_run(where: str, command: str, skip: str | None, tmp_path: Path) -> None:
    if skip or "--serve" in command:
        pytest.skip(f"{where}: {skip or 'starts a server'}")
    args = shlex.split(command.split("#", 1)[0])
    result = subprocess.run(
        [sys.executable, "-c", "from tripwire.cli import main; main()", *args[1:]],
        cwd=tmp_path, env=_env(), capture_output=True, text=True, timeout=120,
    )
    assert result.returncode == 0, f"{where}: {command}\n{result.stderr[-2000:]}"
