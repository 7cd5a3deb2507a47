"""``tripwire serve``: the fleet service (OTLP/HTTP receiver, kill channel, run store, alerts)."""

from __future__ import annotations

import json
import logging
import os
import secrets
import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from tripwire.cli import app
from tripwire.cli._common import abort, err_console

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
        "TRIPWIRE_TOKEN or --token-file (one token per line); --no-auth turns auth off (only "
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


def _tokens(token_file: Path | None) -> tuple[str, ...]:
    tokens: list[str] = []
    env = os.environ.get("TRIPWIRE_TOKEN", "").strip()
    if env:
        tokens.append(env)
    if token_file is not None:
        try:
            text = token_file.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as exc:
            abort(f"--token-file {token_file}: cannot read it ({type(exc).__name__}: {exc})")
        tokens += [line.strip() for line in text.splitlines() if line.strip() and not line.startswith("#")]
    for token in tokens:
        if len(token) < 16:
            abort("a bearer token must be at least 16 characters (use: python -c 'import secrets; print(secrets.token_urlsafe(32))')")
    return tuple(tokens)


@app.command("serve", help=_HELP, short_help="Run the fleet service: OTLP receiver, kill channel, run store.")
def serve(
    host: Annotated[str, typer.Option(envvar="TRIPWIRE_HOST", help="Address to bind. [env var: TRIPWIRE_HOST]")] = "127.0.0.1",
    port: Annotated[int, typer.Option(min=1, max=65535, envvar="TRIPWIRE_PORT", help="Port (4318 is OTLP/HTTP's). [env var: TRIPWIRE_PORT]")] = 4318,
    store: Annotated[str | None, typer.Option("--store", envvar="TRIPWIRE_STORE", help="Run store URL: sqlite:///path or postgresql://user@host/db (default: a SQLite file in the user data dir). [env var: TRIPWIRE_STORE]")] = None,
    redis_url: Annotated[str | None, typer.Option("--redis", envvar="TRIPWIRE_REDIS_URL", help="Redis URL for the kill channel (pub/sub + keys). [env var: TRIPWIRE_REDIS_URL]")] = None,
    state: Annotated[str, typer.Option(envvar="TRIPWIRE_STATE", help="Per-trace state: 'memory' (route spans by trace id, e.g. the Collector's loadbalancing exporter) or 'redis' (stateless receivers; needs --redis). [env var: TRIPWIRE_STATE]")] = "memory",
    token_file: Annotated[Path | None, typer.Option(envvar="TRIPWIRE_TOKEN_FILE", help="File of accepted bearer tokens, one per line (also: TRIPWIRE_TOKEN). [env var: TRIPWIRE_TOKEN_FILE]")] = None,
    no_auth: Annotated[bool, typer.Option("--no-auth", help="Accept requests without a token (trusted loopback only).")] = False,
    preset: Annotated[str | None, typer.Option(envvar="TRIPWIRE_PRESET", help="Loop-policy preset (default, seed…). [env var: TRIPWIRE_PRESET]")] = None,
    max_tool_calls: Annotated[int | None, typer.Option(min=1, envvar="TRIPWIRE_MAX_TOOL_CALLS", help="Stop a run after this many tool calls. [env var: TRIPWIRE_MAX_TOOL_CALLS]")] = None,
    max_steps: Annotated[int | None, typer.Option(min=1, envvar="TRIPWIRE_MAX_STEPS", help="Stop a run after this many model calls. [env var: TRIPWIRE_MAX_STEPS]")] = None,
    store_raw: Annotated[bool, typer.Option("--store-raw", help="Keep raw tool arguments in the run store (off: digests only).")] = False,
    reorder_ms: Annotated[int, typer.Option(min=0, max=10_000, envvar="TRIPWIRE_REORDER_MS", help="How long a span waits for the earlier spans of its trace. [env var: TRIPWIRE_REORDER_MS]")] = 200,
    max_body_mb: Annotated[int, typer.Option(min=1, max=1024, envvar="TRIPWIRE_MAX_BODY_MB", help="Largest request body, before and after gzip (413 above). [env var: TRIPWIRE_MAX_BODY_MB]")] = 16,
    webhook: Annotated[list[str] | None, typer.Option(envvar="TRIPWIRE_WEBHOOK_URL", help="POST each transition as JSON here (repeatable). [env var: TRIPWIRE_WEBHOOK_URL]")] = None,
    slack_webhook: Annotated[str | None, typer.Option(envvar="TRIPWIRE_SLACK_WEBHOOK_URL", help="A Slack incoming-webhook URL. [env var: TRIPWIRE_SLACK_WEBHOOK_URL]")] = None,
    pagerduty_key: Annotated[str | None, typer.Option(envvar="TRIPWIRE_PAGERDUTY_ROUTING_KEY", help="PagerDuty Events v2 routing key. [env var: TRIPWIRE_PAGERDUTY_ROUTING_KEY]")] = None,
    pagerduty_url: Annotated[str, typer.Option(envvar="TRIPWIRE_PAGERDUTY_URL", help="PagerDuty Events API URL. [env var: TRIPWIRE_PAGERDUTY_URL]")] = "https://events.pagerduty.com/v2/enqueue",
    dashboard_url: Annotated[str | None, typer.Option(envvar="TRIPWIRE_DASHBOARD_URL", help="Public URL of this service, for links in alerts. [env var: TRIPWIRE_DASHBOARD_URL]")] = None,
    log_format: Annotated[str, typer.Option(envvar="TRIPWIRE_LOG_FORMAT", help="Log lines as 'json' or 'text'. [env var: TRIPWIRE_LOG_FORMAT]")] = "json",
) -> None:
    try:
        import uvicorn

        from tripwire.core.budget import Limits
        from tripwire.core.policy import LoopPolicy
        from tripwire.serve import ServeConfig, create_app
        from tripwire.serve.alerts import AlertTarget
        from tripwire.serve.otlp import protobuf_backend
        from tripwire.store.runs import RunStore
    except ImportError as exc:
        abort(f"tripwire serve needs its extra: pip install 'tripwire[serve]' ({exc.name} is missing)")
    from tripwire.errors import ConfigError

    if log_format not in ("json", "text"):
        abort(f"--log-format must be 'json' or 'text', got {log_format!r}")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(_JsonFormatter() if log_format == "json" else logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger("tripwire")
    root.handlers[:] = [handler]
    root.setLevel(logging.INFO)
    log = logging.getLogger("tripwire.serve")

    tokens = _tokens(token_file)
    if not tokens and not no_auth:
        suggestion = secrets.token_urlsafe(32)
        abort(
            "no bearer token: set TRIPWIRE_TOKEN (or --token-file), e.g. "
            f"export TRIPWIRE_TOKEN={suggestion} ; or pass --no-auth on a trusted loopback"
        )
    backend = protobuf_backend()
    if backend != "upb":
        log.warning(
            "protobuf runs on its %r backend: OTLP/protobuf decoding will be several times "
            "slower; install a protobuf wheel with the upb backend (pip install -U protobuf)",
            backend,
        )
    try:
        policy = LoopPolicy.preset(preset) if preset else LoopPolicy()
        limits = Limits(max_tool_calls=max_tool_calls, max_steps=max_steps)
        alerts: list[AlertTarget] = [AlertTarget(kind="webhook", url=u) for u in webhook or ()]
        if slack_webhook:
            alerts.append(AlertTarget(kind="slack", url=slack_webhook))
        if pagerduty_key:
            alerts.append(AlertTarget(kind="pagerduty", url=pagerduty_url, routing_key=pagerduty_key))
        config = ServeConfig(
            store_url=store,
            redis_url=redis_url,
            state=state,
            tokens=tokens,
            auth=not no_auth,
            policy=policy,
            limits=limits,
            store_raw=store_raw,
            reorder_s=reorder_ms / 1000,
            max_body_bytes=max_body_mb * 1024 * 1024,
            alerts=tuple(alerts),
            dashboard_url=dashboard_url,
        )
        run_store = RunStore.open(store)
    except ConfigError as exc:
        abort(str(exc))
    except Exception as exc:  # a store that cannot be reached: say which, never a traceback
        abort(f"cannot open the run store: {type(exc).__name__}: {exc}".split("\n")[0])
    from tripwire.serve.app import Service

    try:
        service = Service(config, store=run_store)
    except ConfigError as exc:
        abort(str(exc))
    if redis_url and not service.kill.ping():
        abort(f"--redis {redis_url}: Redis does not answer")
    err_console.print(
        f"tripwire serve on http://{host}:{port} (OTLP: POST /v1/traces; store: "
        f"{run_store.dialect}; kill channel: {'redis' if redis_url else 'store'})",
        highlight=False,
        soft_wrap=True,
    )
    uvicorn.run(
        create_app(config, service=service),
        host=host,
        port=port,
        log_level="warning",
        access_log=False,
        timeout_graceful_shutdown=10,
    )
