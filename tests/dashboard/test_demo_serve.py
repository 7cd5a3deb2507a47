"""``tripwire demo --serve``: the service and a simulated fleet in one command."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import time

import httpx

from serve.conftest import free_port


def test_demo_serve_runs_a_fleet_that_the_service_judges() -> None:
    port = free_port()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(sys.path))
    proc = subprocess.Popen(
        [sys.executable, "-c", "from tripwire.cli import main; main()", "demo", "--serve", "--port", str(port), "--duration", "40"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        match = re.search(r"token (\S+?)\)", first)
        assert match, first
        assert f"http://127.0.0.1:{port}/" in first
        # The demo names the report command for the store it writes (it never did).
        second = proc.stdout.readline()
        assert "tripwire report --store sqlite:///" in second, second
        report_args = shlex.split(second[second.index("tripwire report"):])[1:]
        headers = {"Authorization": f"Bearer {match.group(1)}"}
        deadline = time.monotonic() + 35
        runs: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            try:
                got = httpx.get(f"http://127.0.0.1:{port}/api/runs?limit=100&status=ended", headers=headers, timeout=5)
            except httpx.TransportError:
                time.sleep(0.5)
                continue
            runs = got.json()["runs"]
            agents = {r["agent"] for r in runs}
            if {"support-bot", "docs-crawler", "batch-exporter", "research-agent"} <= agents:
                break
            time.sleep(0.5)
        by_agent = {r["agent"]: r for r in runs}
        assert by_agent["support-bot"]["verdict"] == "stuck" and by_agent["support-bot"]["killed"] is True
        assert by_agent["docs-crawler"]["stop_reason"] == "loop_detected"
        assert by_agent["batch-exporter"]["stop_reason"] == "max_tool_calls"
        assert by_agent["research-agent"]["verdict"] == "working"
        assert by_agent["research-agent"]["stop_reason"] == "completed"
        # The looping agents really stopped: far fewer calls than they would have made (40).
        assert by_agent["support-bot"]["tool_calls"] < 15
        page = httpx.get(f"http://127.0.0.1:{port}/", headers=headers)
        assert page.status_code == 200 and "Fleet" in page.text
        # That command, as printed, reports on the demo's runs.
        done = subprocess.run(
            [sys.executable, "-c", "from tripwire.cli import main; main()", *report_args, "--json"],
            capture_output=True, text=True, env=env, timeout=120, check=False,
        )
        assert done.returncode == 0, done.stderr
        assert {"support-bot", "research-agent"} <= {a["agent"] for a in json.loads(done.stdout)["agents"]}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
