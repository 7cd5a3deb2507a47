"""``tripwire serve``: the fleet service (OTLP/HTTP receiver, kill channel, run store, alerts)."""

from __future__ import annotations

import errno
import json
import logging
import os
import secrets
import socket
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from tripwire.cli import app
from tripwire.cli._common import abort, err_console
from tripwire.config import SERVE_SETTINGS, load_serve_config

__all__ = ["serve"]

_HELP = "\n\n".join(
    (
        "Watch a whole fleet of agents through their OpenTelemetry traces.",
        "Point any OTLP/HTTP exporter or Collector at http://HOST:PORT/v1/traces (protobuf or "
        "JSON, gzip or not). Every trace is judged with the same loop rules and budgets as the "
        "in-process span processor; a stuck run's kill flag goes up (Redis pub/sub and a key "
        "with --redis, else the run store) so the agent stops at its next step "
        "(tripwire.remote); transitions page once (webhook, Slack, PagerDuty); every run is "
        "recorded with its stop receipt (SQLite by default, PostgreSQL with --store).",
        "Every endpoint but /healthz needs 'Authorization: Bearer TOKEN'. The token comes from "
        "TRIPWIRE_TOKEN or --token-file (one token per line, or a name and a token: an operator's "
        "Kill is recorded under the name); --no-auth turns auth off (only "
        "on a trusted loopback). The service binds 127.0.0.1 unless told otherwise.",
    )
)


class _JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, Any] = {
            "ts": round(record.created, 3),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        return json.dumps(entry)


def _check_listen(host: str, port: int) -> None:
    """Abort (exit 2) unless the service can listen on ``host:port``, before anything is opened
    (uvicorn's own failure is a log line and exit 3, after the start banner)."""
    # The family uvicorn binds with: IPv6 for an address with a colon, else IPv4 ("localhost"
    # is 127.0.0.1 to it, whatever the resolver lists first).
    wanted = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        family, _, _, _, address = socket.getaddrinfo(host, port, wanted, socket.SOCK_STREAM, 0, socket.AI_PASSIVE)[0]
    except (socket.gaierror, UnicodeError) as exc:
        abort(f"host {host}: not an address this machine can listen on ({exc})")
    try:
        with socket.create_server(address, family=family):
            pass
    except OSError as exc:
        if exc.errno == errno.EADDRINUSE:
            abort(f"port {port} on {host} is in use (another tripwire serve, or a Collector?): choose another with --port")
        abort(f"cannot listen on {host}:{port}: {exc.strerror or exc}")


def _tokens(token_file: str | None) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The accepted tokens and their names: ``TRIPWIRE_TOKEN``'s is ``TRIPWIRE_TOKEN``; a line
    of the token file is a token alone (named ``<file> line N``) or a name and a token."""
    tokens: list[str] = []
    names: list[str] = []
    env = os.environ.get("TRIPWIRE_TOKEN", "").strip()
    if env:
        tokens.append(env)
        names.append("TRIPWIRE_TOKEN")
    if token_file is not None:
        try:
            text = Path(token_file).read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            abort(f"token_file {token_file}: cannot read it ({type(exc).__name__}: {exc})")
        for n, line in enumerate(text.splitlines(), 1):
            fields = line.split()
            if not fields or fields[0].startswith("#"):
                continue
            if len(fields) > 2:
                abort(f"token_file {token_file} line {n}: a token, or a name and a token, not {len(fields)} words")
            tokens.append(fields[-1])
            names.append(fields[0] if len(fields) == 2 else f"{Path(token_file).name} line {n}")
    for token in tokens:
        if len(token) < 16:
            abort("a bearer token must be at least 16 characters (use: python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return tuple(tokens), tuple(names)


def _opt(name: str, *, metavar: str | None = None, **extra: Any) -> Any:
    """The typer option of serve setting ``name``: its option, variable, help and default.

    The variable is declared so that ``--help`` shows it (once); the value of an option that
    was not given on the command line is read by :func:`tripwire.config.load_serve_config`
    (variable, then ``[serve]``, then default), so every source is checked the same way.
    """
    setting = SERVE_SETTINGS[name]
    default = setting.default
    shown = None if default in (None, (), False) else default
    help_text = setting.help[0].upper() + setting.help[1:]
    if setting.kind == "bool":
        return typer.Option(setting.option, envvar=setting.env, help=help_text + ".", **extra)
    if setting.kind == "list":
        return typer.Option(setting.option, envvar=setting.env, metavar=metavar or "URL",
                            help=help_text + " (repeatable).", show_default=False, **extra)
    return typer.Option(
        setting.option, envvar=setting.env,
        metavar=metavar or ("|".join(setting.choices) if setting.choices else None)
        or {"int": "N", "float": "NUMBER", "path": "FILE"}.get(setting.kind, "TEXT"),
        help=help_text + ".",
        show_default=str(shown) if shown is not None else False, **extra,
    )


@app.command("serve", help=_HELP, short_help="Run the fleet service: OTLP receiver, kill channel, run store.")
def serve(
    ctx: typer.Context,
    config_file: Annotated[str | None, typer.Option("--config", envvar="TRIPWIRE_CONFIG", metavar="FILE", help="A tripwire.toml: its [serve] section (host, port, store…), [limits], [policy], [digest], [engine]. Options and variables override it.", show_default=False)] = None,
    host: Annotated[str | None, _opt("host", metavar="ADDRESS")] = None,
    port: Annotated[str | None, _opt("port", metavar="PORT")] = None,
    store: Annotated[str | None, _opt("store", metavar="URL")] = None,
    redis_url: Annotated[str | None, _opt("redis_url", metavar="URL")] = None,
    state: Annotated[str | None, _opt("state")] = None,
    token_file: Annotated[str | None, _opt("token_file")] = None,
    no_auth: Annotated[bool, _opt("no_auth")] = False,
    preset: Annotated[str | None, typer.Option(envvar="TRIPWIRE_PRESET", metavar="NAME", help="Loop-policy preset (default, seed…).", show_default=False)] = None,
    max_tool_calls: Annotated[str | None, typer.Option(envvar="TRIPWIRE_MAX_TOOL_CALLS", metavar="N|off", help="Stop a run after this many tool calls (also [limits] max_tool_calls; every [limits] key applies).", show_default=False)] = None,
    max_steps: Annotated[str | None, typer.Option(envvar="TRIPWIRE_MAX_STEPS", metavar="N|off", help="Stop a run after this many model calls.", show_default=False)] = None,
    store_raw: Annotated[bool, _opt("store_raw")] = False,
    reorder_ms: Annotated[str | None, _opt("reorder_ms", metavar="MS")] = None,
    max_body_mb: Annotated[str | None, _opt("max_body_mb", metavar="MB")] = None,
    max_inflight: Annotated[str | None, _opt("max_inflight")] = None,
    max_buffered_spans: Annotated[str | None, _opt("max_buffered_spans")] = None,
    spool: Annotated[str | None, _opt("spool", metavar="DIR|off")] = None,
    webhook: Annotated[list[str] | None, _opt("webhook_url")] = None,
    slack_webhook: Annotated[str | None, _opt("slack_webhook_url", metavar="URL")] = None,
    pagerduty_key: Annotated[str | None, _opt("pagerduty_routing_key", metavar="KEY")] = None,
    pagerduty_url: Annotated[str | None, _opt("pagerduty_url", metavar="URL")] = None,
    dashboard_url: Annotated[str | None, _opt("dashboard_url", metavar="URL")] = None,
    log_format: Annotated[str | None, _opt("log_format")] = None,
) -> None:
    from tripwire.errors import ConfigError

    given = {
        "config": config_file, "host": host, "port": port, "store": store, "redis_url": redis_url,
        "state": state, "token_file": token_file, "no_auth": no_auth, "preset": preset,
        "max_tool_calls": max_tool_calls, "max_steps": max_steps, "store_raw": store_raw,
        "reorder_ms": reorder_ms, "max_body_mb": max_body_mb, "max_inflight": max_inflight,
        "max_buffered_spans": max_buffered_spans, "spool": spool, "webhook_url": webhook,
        "slack_webhook_url": slack_webhook, "pagerduty_routing_key": pagerduty_key,
        "pagerduty_url": pagerduty_url, "dashboard_url": dashboard_url, "log_format": log_format,
    }
    params = {"config": "config_file", "webhook_url": "webhook", "slack_webhook_url": "slack_webhook",
              "pagerduty_routing_key": "pagerduty_key"}
    # Only what was typed on the command line is an option; a variable or the default is read
    # by the loader (so a variable is named as itself in errors, and sits above the file).
    options = {
        key: value for key, value in given.items()
        if getattr(ctx.get_parameter_source(params.get(key, key)), "name", None) == "COMMANDLINE"
    }
    try:
        loaded, settings = load_serve_config(options)
    except ConfigError as exc:
        abort(str(exc))
    try:
        import uvicorn

        from tripwire.core.budget import Limits
        from tripwire.serve import ServeConfig, create_app, tune_gc
        from tripwire.serve.alerts import AlertTarget
        from tripwire.serve.otlp import protobuf_backend
        from tripwire.store.runs import RunStore
    except ImportError as exc:
        abort(f"tripwire serve needs its extra: pip install 'tripwire[serve]' ({exc.name} is missing)")

    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if settings["log_format"] == "json" else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("tripwire")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    log = logging.getLogger("tripwire.serve")

    tokens, token_names = _tokens(settings["token_file"])
    if not tokens and not settings["no_auth"]:
        suggestion = secrets.token_urlsafe(32)
        abort(
            "no bearer token: set TRIPWIRE_TOKEN (or --token-file), e.g. "
            f"export TRIPWIRE_TOKEN={suggestion} ; or pass --no-auth on a trusted loopback"
        )
    _check_listen(settings["host"], settings["port"])
    backend = protobuf_backend()
    if backend != "upb":
        log.warning(
            "protobuf runs on its %r backend: OTLP/protobuf decoding will be several times "
            "slower; install a protobuf wheel with the upb backend (pip install -U protobuf)",
            backend,
        )
    spool_dir = settings["spool"]
    if spool_dir is None:  # default: one spool per port in the user data folder
        from platformdirs import user_data_dir

        spool_dir = str(Path(user_data_dir("tripwire", appauthor=False)) / f"spool-{settings['port']}")
    elif spool_dir == "off":
        spool_dir = None
    store_url = settings["store"]
    redis = settings["redis_url"]
    try:
        alerts: list[AlertTarget] = [AlertTarget(kind="webhook", url=u) for u in settings["webhook_url"]]
        if settings["slack_webhook_url"]:
            alerts.append(AlertTarget(kind="slack", url=settings["slack_webhook_url"]))
        if settings["pagerduty_routing_key"]:
            alerts.append(AlertTarget(kind="pagerduty", url=settings["pagerduty_url"], routing_key=settings["pagerduty_routing_key"]))
        engine: dict[str, Any] = {}
        if loaded.max_traces is not None:
            engine["max_traces"] = loaded.max_traces
        if loaded.idle_ttl_s is not None:
            engine["idle_ttl_s"] = loaded.idle_ttl_s
        config = ServeConfig(
            store_url=store_url,
            redis_url=redis,
            state=settings["state"],
            tokens=tokens,
            token_names=token_names,
            auth=not settings["no_auth"],
            policy=loaded.policy,
            limits=loaded.limits if loaded.limits is not None else Limits(),
            normalizer=loaded.normalizer,
            store_raw=settings["store_raw"],
            reorder_s=settings["reorder_ms"] / 1000,
            max_body_bytes=settings["max_body_mb"] * 1024 * 1024,
            max_inflight=settings["max_inflight"],
            max_buffered_spans=settings["max_buffered_spans"],
            alerts=tuple(alerts),
            dashboard_url=settings["dashboard_url"],
            spool_dir=spool_dir,
            **engine,
        )
        run_store = RunStore.open(store_url)
    except ConfigError as exc:
        abort(str(exc))
    except Exception as exc:  # a store that cannot be reached: say which, never a traceback
        abort(f"cannot open the run store: {type(exc).__name__}: {exc}".split("\n")[0])
    from tripwire.serve.app import Service

    try:
        service = Service(config, store=run_store)
    except ConfigError as exc:
        abort(str(exc))
    if redis and not service.kill.ping():
        abort(f"redis_url {redis}: Redis does not answer")
    host_, port_ = settings["host"], settings["port"]
    err_console.print(
        f"tripwire serve on http://{f'[{host_}]' if ':' in host_ else host_}:{port_} (OTLP: POST /v1/traces; store: "
        f"{run_store.dialect}; kill channel: {'redis' if redis else 'store'})",
        highlight=False,
        soft_wrap=True,
    )
    app_ = create_app(config, service=service)
    tune_gc()
    from tripwire.serve.connections import http_protocol

    uvicorn.run(
        app_,
        host=host_,
        port=port_,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=10,
        http=http_protocol(config.header_timeout_s),
    )
