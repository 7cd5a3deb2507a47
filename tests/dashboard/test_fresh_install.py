"""The README's second quick-start command on a fresh virtual environment that holds only what
``pip install -e '.[serve]'`` brings: the dashboard's sign-in and Kill work in Chromium.

The test suite's own environment has every extra, and the frameworks pull in packages (such as
python-multipart, which the dashboard's forms need) that ``serve`` alone must declare itself:
only a venv of its own shows such a gap. The service runs from that venv; the browser is driven
from here.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx

from serve.conftest import free_port

ROOT = Path(__file__).resolve().parents[2]


def _fresh_serve_venv(where: Path) -> Path:
    subprocess.run([sys.executable, "-m", "venv", str(where)], check=True, timeout=120)
    python = where / "bin" / "python"
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env.update(PIP_DISABLE_PIP_VERSION_CHECK="1", TRIPWIRE_NO_EXTENSIONS="1")
    done = subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "-e", f"{ROOT}[serve]"],
        capture_output=True, text=True, timeout=900, env=env, check=False,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return python


def test_serve_extra_alone_gives_a_working_sign_in_and_kill(browser: Any, tmp_path: Path) -> None:
    python = _fresh_serve_venv(tmp_path / "venv")
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    # The venv holds the serve extra and nothing the frameworks bring.
    probe = subprocess.run(
        [str(python), "-c", "import importlib.util as u; print(u.find_spec('google.adk') is None, u.find_spec('agents') is None)"],
        capture_output=True, text=True, env=env, check=True,
    )
    assert probe.stdout.split() == ["True", "True"], probe.stdout
    port = free_port()
    proc = subprocess.Popen(
        [str(python.parent / "tripwire"), "demo", "--serve", "--port", str(port), "--duration", "90"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
    )
    try:
        assert proc.stdout is not None
        first = proc.stdout.readline()
        match = re.search(r"token (\S+?)\)", first)
        assert match, first + (proc.stderr.read() if proc.poll() is not None and proc.stderr else "")
        token, url = match.group(1), f"http://127.0.0.1:{port}"
        headers = {"Authorization": f"Bearer {token}"}
        # A healthy agent early in its run: 12 or more different calls, about 0.3 s apart,
        # alternating search_docs and fetch_page (which no looping demo agent calls).
        run: dict[str, Any] = {}
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and not run:
            try:
                got = httpx.get(f"{url}/api/runs?verdict=working&status=running&limit=50", headers=headers, timeout=5)
                for r in got.json()["runs"]:
                    if 2 <= r["tool_calls"] <= 5:
                        calls = httpx.get(f"{url}/api/runs/{r['trace_id']}", headers=headers, timeout=5).json()["calls"]
                        if any(c["tool"] == "fetch_page" for c in calls):
                            run = r
                            break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        assert run, "no healthy run in flight"
        tid = run["trace_id"]
        # Sign in with the printed token (this was a 500: python-multipart was not in serve).
        context = browser.new_context(viewport={"width": 1280, "height": 900})
        page = context.new_page()
        page.goto(f"{url}/runs/{tid}")
        assert page.url.startswith(f"{url}/login")
        page.get_by_label("Bearer token (TRIPWIRE_TOKEN)").fill(token)
        page.keyboard.press("Enter")
        page.wait_for_url(f"{url}/runs/{tid}")
        page.get_by_role("button", name="Kill (raise the flag)").click()
        page.get_by_role("status").wait_for()
        # The agent obeys the flag at its next step and ends its run; the receipt says why.
        ended: dict[str, Any] = {}
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            ended = httpx.get(f"{url}/api/runs/{tid}", headers=headers, timeout=5).json()
            if ended.get("status") == "ended":
                break
            time.sleep(0.2)
        assert ended.get("status") == "ended", ended
        assert ended["killed"] is True and ended["stop_reason"] == "user_cancelled"
        assert ended["tool_calls"] < 12  # stopped mid-run, not at its natural end
        condition = ended["receipt"]["condition"]
        assert (condition["source"], condition["by"], condition["via"]) == ("operator", "demo token", "dashboard")
        context.close()
    finally:
        proc.terminate()
        proc.wait(timeout=30)
