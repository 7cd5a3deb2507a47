"""The TypeScript client (``clients/typescript``), tested from pytest so that CI's one command
runs it: ``npm ci`` (once, when ``node_modules`` is missing or older than the lock file), then
``npm test`` against a real ``tripwire serve`` started here (its URL and token passed as
``TRIPWIRE_URL`` / ``TRIPWIRE_TOKEN``). The TypeScript tests run the real ``ai`` package and its
mock model (``test/aisdk.test.ts``): a looping agent stops through ``stopWhen``, a healthy one
with 30 different calls is untouched, an operator's Kill stops a run, and each receipt reaches
the service.

Node.js (20+) and npm must be on the PATH: skipped loudly without them, failed under ``CI=true``.
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from serve.conftest import free_port
from serve.service_process import serve_process, stop, wait_ready

CLIENT = Path(__file__).resolve().parents[2] / "clients" / "typescript"
TOKEN = "ts-client-token-0123456789abcdef"


def _missing(message: str) -> None:
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"{message}; CI=true requires it", pytrace=False)
    pytest.skip(f"SKIPPED, NEEDS NODE.JS: {message}")


def _npm_ci() -> None:
    modules = CLIENT / "node_modules" / ".package-lock.json"
    lock = CLIENT / "package-lock.json"
    if modules.exists() and modules.stat().st_mtime >= lock.stat().st_mtime:
        return
    done = subprocess.run(["npm", "ci", "--no-audit", "--no-fund"], cwd=CLIENT,
                          capture_output=True, text=True, timeout=600)  # fmt: skip
    assert done.returncode == 0, f"npm ci failed:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"


def test_the_typescript_client(tmp_path: Path) -> None:
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        _missing("node and npm are not on the PATH (clients/typescript needs Node.js 20+)")
    version = subprocess.run([node, "--version"], capture_output=True, text=True).stdout.strip()  # type: ignore[list-item]
    if int(version.lstrip("v").split(".")[0]) < 20:
        _missing(f"Node.js {version} is older than 20")
    _npm_ci()
    port = free_port()
    args = ["--port", str(port), "--store", f"sqlite:///{tmp_path / 'runs.db'}", "--spool", "off",
            "--log-format", "text"]  # the default 200 ms reorder window  # fmt: skip
    proc = serve_process(args, env={"TRIPWIRE_TOKEN": TOKEN}, stderr=tmp_path / "serve.log")
    try:
        wait_ready(port, proc)
        env = {k: v for k, v in os.environ.items() if not k.startswith("TRIPWIRE_")}
        env.update(TRIPWIRE_URL=f"http://127.0.0.1:{port}", TRIPWIRE_TOKEN=TOKEN)
        done = subprocess.run(["npm", "test"], cwd=CLIENT, env=env, capture_output=True,
                              text=True, timeout=600)  # fmt: skip
    finally:
        stop(proc)
    out = done.stdout + done.stderr
    assert done.returncode == 0, f"npm test failed:\n{out[-6000:]}\n--- serve.log ---\n{(tmp_path / 'serve.log').read_text()[-2000:]}"
    assert "# fail 0" in out and "# pass 0" not in out, out[-3000:]
