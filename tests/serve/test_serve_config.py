"""``tripwire serve --config tripwire.toml``: the [serve] section through the one loader, with
options over variables over the file over defaults, and precise errors (exit 2), through the
real CLI."""

from __future__ import annotations

import contextlib
import os
import re
import time
from pathlib import Path

import httpx
import pytest
import typer.main
from typer.testing import CliRunner

from tripwire.cli import app
from tripwire.store.runs import RunStore

from .conftest import free_port
from .otlp_helpers import loop_spans, protobuf_body
from .service_process import serve_process, stop, wait_ready

TOKEN = "config-token-0123456789abcdef"


def _config(tmp_path: Path, port: int, extra: str = "") -> Path:
    (tmp_path / "tokens.txt").write_text(f"# fleet tokens\n{TOKEN}\n")
    path = tmp_path / "tripwire.toml"
    path.write_text(
        "version = 1\n\n[limits]\nmax_tool_calls = 2\n\n"
        f'[serve]\nport = {port}\nstore = "sqlite:///{tmp_path / "runs.db"}"\n'
        f'token_file = "tokens.txt"\nreorder_ms = 0\nlog_format = "text"\nspool = "spool"\n{extra}'
    )
    return path


def _listening_ports(pid: int) -> set[int]:
    """The TCP ports process ``pid`` listens on (Linux ``/proc``): its own sockets, so that
    another program that happens to take one of the test's free ports later cannot fail it."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        with contextlib.suppress(OSError):  # a descriptor closed while it is read
            link = os.readlink(fd)
            if link.startswith("socket:["):
                inodes.add(link[8:-1])
    ports = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    ports.add(int(fields[1].rsplit(":", 1)[1], 16))
    return ports


def test_the_serve_section_configures_the_service(tmp_path: Path) -> None:
    port = free_port()
    path = _config(tmp_path, port)
    # Started from another directory: the token file is found beside the configuration file.
    proc = serve_process(["--config", str(path)], cwd="/")
    try:
        wait_ready(port, proc)
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(f"{url}/api/runs", timeout=5).status_code == 401
        headers = {"Authorization": f"Bearer {TOKEN}", "Content-Type": "application/x-protobuf"}
        got = httpx.post(f"{url}/v1/traces", content=protobuf_body(loop_spans(3)), headers=headers, timeout=10)
        assert got.status_code == 200, got.text
        deadline = time.monotonic() + 10
        runs: list[dict[str, object]] = []
        while time.monotonic() < deadline:
            runs = httpx.get(f"{url}/api/runs", headers=headers, timeout=5).json()["runs"]
            if runs and runs[0]["status"] == "ended":
                break
            time.sleep(0.1)
    finally:
        stop(proc)
    # [limits] max_tool_calls = 2 from the same file stopped the run (not the loop rule,
    # which needs 4 identical calls); the store is the file the [serve] section named.
    assert runs and runs[0]["stop_reason"] == "max_tool_calls", runs
    store = RunStore.open(f"sqlite:///{tmp_path / 'runs.db'}")
    try:
        assert store.runs()[1] == 1
    finally:
        store.dispose()


def test_option_over_variable_over_file(tmp_path: Path) -> None:
    file_port, env_port, cli_port = free_port(), free_port(), free_port()
    path = _config(tmp_path, file_port)
    proc = serve_process(["--config", str(path)], env={"TRIPWIRE_PORT": str(env_port)})
    try:
        wait_ready(env_port, proc)
        assert _listening_ports(proc.pid) == {env_port}
    finally:
        stop(proc)
    proc = serve_process(["--config", str(path), "--port", str(cli_port)], env={"TRIPWIRE_PORT": str(env_port)})
    try:
        wait_ready(cli_port, proc)
        assert _listening_ports(proc.pid) == {cli_port}
    finally:
        stop(proc)
    # TRIPWIRE_CONFIG names the file as --config does.
    proc = serve_process([], env={"TRIPWIRE_CONFIG": str(path)})
    try:
        wait_ready(file_port, proc)
    finally:
        stop(proc)


runner = CliRunner()


@pytest.mark.parametrize(
    ("serve", "env", "args", "field"),
    [
        ("port = 0", {}, [], "serve.port"),
        ('port = "http"', {}, [], "serve.port"),
        ("prot = 4318", {}, [], "serve.prot"),
        ('state = "disk"', {}, [], "serve.state"),
        ("max_inflight = 0", {}, [], "serve.max_inflight"),
        ('webhook_url = "http://x"', {}, [], None),  # one URL is accepted as a list of one
        ("webhook_url = [1]", {}, [], "serve.webhook_url"),
        ("no_auth = 1", {}, [], "serve.no_auth"),
        ("", {"TRIPWIRE_PORT": "99999"}, [], "TRIPWIRE_PORT"),
        ("", {"TRIPWIRE_REORDER_MS": "soon"}, [], "TRIPWIRE_REORDER_MS"),
        ("port = 5000", {"TRIPWIRE_PORT": "1"}, ["--port", "abc"], "--port"),
        # a bad value is refused where it is written, even when a higher source overrides it
        ("port = 0", {}, ["--port", "5000"], "serve.port"),
        ("", {}, ["--log-format", "xml"], "--log-format"),
        ("", {}, ["--max-tool-calls", "-1"], "--max-tool-calls"),
    ],
)
def test_bad_settings_name_their_field_and_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, serve: str, env: dict[str, str], args: list[str], field: str | None
) -> None:
    path = tmp_path / "tripwire.toml"
    path.write_text(f"version = 1\n[serve]\n{serve}\n")
    for key in ("TRIPWIRE_TOKEN", "TRIPWIRE_PORT", "TRIPWIRE_CONFIG"):
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    # A store that cannot be opened stops the start after the settings are read.
    result = runner.invoke(app, ["serve", "--config", str(path), "--store", "mysql://nowhere/x", *args])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    if field is None:
        assert "run store" in result.output or "token" in result.output
    else:
        assert field in result.output, result.output
        assert "run store" not in result.output


def test_help_shows_each_variable_once() -> None:
    group = typer.main.get_command(app)
    for name, command in group.commands.items():  # type: ignore[attr-defined]
        result = runner.invoke(app, [name, "--help"], env={"COLUMNS": "400"})
        assert result.exit_code == 0, (name, result.output)
        text = " ".join(result.output.split())
        for param in command.params:
            envvar = param.envvar
            if isinstance(envvar, str):
                shown = len(re.findall(rf"env var: {envvar}\b", text))
                assert shown == 1, (name, envvar, shown)


def test_serve_help_says_what_each_option_takes() -> None:
    text = " ".join(runner.invoke(app, ["serve", "--help"], env={"COLUMNS": "400"}).output.split())
    for shown in ("--host ADDRESS", "--port PORT", "--reorder-ms MS", "--max-body-mb MB", "--max-inflight N", "--store URL"):
        assert shown in text, shown
    assert "INTEGER" not in text and " TEXT " not in text


def test_a_port_in_use_is_refused_by_name_before_anything_is_opened(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    monkeypatch.setenv("TRIPWIRE_TOKEN", "a-token-of-enough-length-0123")
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        db = tmp_path / "runs.db"
        result = runner.invoke(app, ["serve", "--port", str(port), "--store", f"sqlite:///{db}", "--spool", "off"])
    assert result.exit_code == 2, result.output
    assert f"port {port} on 127.0.0.1 is in use" in result.output and "--port" in result.output
    assert not db.exists()  # refused before the store was created


def test_a_token_file_line_may_name_its_token(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from tripwire.cli.serve import _tokens

    monkeypatch.setenv("TRIPWIRE_TOKEN", "env-token-0123456789abcdef")
    path = tmp_path / "tokens.txt"
    path.write_text(f"# fleet tokens\nalice {TOKEN}\n\n  bare-token-0123456789abcdef  \n")
    tokens, names = _tokens(str(path))
    assert tokens == ("env-token-0123456789abcdef", TOKEN, "bare-token-0123456789abcdef")
    assert names == ("TRIPWIRE_TOKEN", "alice", "tokens.txt line 4")
    path.write_text(f"alice smith {TOKEN}\n")
    with pytest.raises(typer.Exit) as caught:
        _tokens(str(path))
    assert caught.value.exit_code == 2
