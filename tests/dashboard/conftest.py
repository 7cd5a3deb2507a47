"""The dashboard runs in a real headless Chromium (Debian's ``chromium``), driven by Playwright.

``playwright install`` cannot download browsers here, so the tests launch
``/usr/bin/chromium``. When it is missing and the tests run as root (CI), this setup installs
Debian's ``chromium`` package itself; otherwise the tests skip loudly (and fail under CI=true).
Screenshots of every page go to ``$TRIPWIRE_ARTIFACTS`` (default ``test-artifacts/`` in the
repository).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(os.environ.get("TRIPWIRE_ARTIFACTS", Path(__file__).resolve().parents[2] / "test-artifacts"))


def _missing(what: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{what}; CI=true requires it", pytrace=False)
    pytest.skip(f"SKIPPED, NEEDS A BROWSER: {what}")


def _ensure_chromium() -> None:
    if shutil.which("chromium") or Path(CHROMIUM).exists():
        return
    if os.geteuid() != 0:
        _missing("Debian's chromium is not installed (apt-get install chromium)")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    for cmd in (["apt-get", "update", "-qq"], ["apt-get", "install", "-y", "-qq", "--no-install-recommends", "chromium"]):
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=900, check=False)
        if done.returncode != 0:
            _missing(f"installing chromium failed: {' '.join(cmd)}: {done.stderr[-500:]}")


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    # Module scope: Playwright's sync API keeps an asyncio loop running on the main thread
    # while it is open, so a session-long browser breaks asyncio.run() in every later test.
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _missing("the playwright package is not installed (pip install -e '.[test]')")
        raise
    _ensure_chromium()
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    with sync_playwright() as p:
        browser = p.chromium.launch(
            executable_path=CHROMIUM,
            headless=True,
            args=[
                "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                "--disable-background-networking", "--disable-component-update", "--disable-sync",
            ],
        )
        yield browser
        browser.close()
