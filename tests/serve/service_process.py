"""``tripwire serve`` as a real subprocess (the console entry point), for tests that need a
process of its own: configuration through the CLI, SIGKILL and restart."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

import httpx


def serve_process(
    args: Sequence[str],
    *,
    env: Mapping[str, str] | None = None,
    cwd: str | Path | None = None,
    stderr: Path | None = None,
) -> subprocess.Popen[bytes]:
    """Start ``tripwire serve ARGS`` with this interpreter and this ``sys.path``."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("TRIPWIRE_") or k == "TRIPWIRE_NO_EXTENSIONS"}
    full = dict(base, PYTHONPATH=os.pathsep.join(p for p in sys.path if p), **(env or {}))
    err = open(stderr, "ab") if stderr is not None else subprocess.DEVNULL  # noqa: SIM115
    try:
        return subprocess.Popen(
            [sys.executable, "-c", "from tripwire.cli import main; main()", "serve", *args],
            env=full, cwd=cwd, stdout=subprocess.DEVNULL, stderr=err,
        )
    finally:
        if stderr is not None:
            err.close()  # type: ignore[union-attr]


def wait_ready(port: int, proc: subprocess.Popen[bytes], *, timeout: float = 30.0) -> None:
    """Until ``/healthz`` answers on ``port`` and says the service started (it listens at once,
    then resumes the runs left running); fails when the process exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            said = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
            raise AssertionError(
                f"tripwire serve exited with {proc.returncode} before it listened on {port}: {said}"
            )
        try:
            got = httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=1)
            if got.status_code == 200 and got.json().get("started", True):  # runs resumed
                return
        except httpx.TransportError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"tripwire serve never listened on {port}")


def stop(proc: subprocess.Popen[bytes], *, kill: bool = False) -> None:
    """SIGTERM (a graceful shutdown) or SIGKILL, and wait for the process."""
    if proc.poll() is None:
        proc.send_signal(signal.SIGKILL if kill else signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=5)
