"""``tripwire report``: p50/p95/p99, stop-reason rates, health, looping tools, learned budgets."""

from __future__ import annotations

import html
import json
import shlex
import time
from pathlib import Path
from typing import TYPE_CHECKING, Annotated

import typer
from rich.markup import escape

from tripwire.cli import app
from tripwire.cli._common import EXIT_USAGE, abort, err_console, out_console

if TYPE_CHECKING:
    from tripwire.report import AgentReport, Report

__all__ = ["report"]

_HELP = "\n\n".join(
    (
        "Report on the runs in the run store (what tripwire serve recorded).",
        "Per agent and overall: runs; p50/p95/p99 of steps, tool calls, duration and cost; the "
        "rate of each stop reason; health states; the tools and signatures that loop most; the "
        "calls and money spent after the first stuck verdict; and the learned budgets: each "
        "agent's step and tool-call line from its own healthy runs at false-stop rate --alpha "
        "(split-conformal), next to the cap it runs with today.",
        "Tables on stdout; --json for machines; --html FILE for a self-contained page with its "
        "charts inline. --write-limits FILE --agent NAME writes that agent's learned lines into "
        "the [limits] table of a tripwire.toml.",
    )
)


def _since(text: str | None, now: float) -> float | None:
    if text is None or text == "all":
        return None
    units = {"d": 86400.0, "h": 3600.0, "m": 60.0, "s": 1.0}
    number, unit = text[:-1], text[-1:]
    if unit in units and number.replace(".", "", 1).isdigit() and number.isascii():  # not "²"
        return now - float(number) * units[unit]
    abort(f"--since must be like 7d, 12h, 30m or 'all', got {text!r}")


@app.command("report", help=_HELP, short_help="Fleet report: percentiles, stop reasons, learned budgets.")
def report(
    store: Annotated[str | None, typer.Option("--store", envvar="TRIPWIRE_STORE", help="Run store URL (default: the SQLite file tripwire serve uses).")] = None,
    since: Annotated[str, typer.Option(help="Runs created in the last 7d, 12h, 30m… or 'all'.")] = "7d",
    agent: Annotated[str | None, typer.Option(help="Only this agent.")] = None,
    alpha: Annotated[float, typer.Option(help="False-stop rate of the learned budget lines.")] = 0.05,
    as_json: Annotated[bool, typer.Option("--json", help="Print the report as JSON on stdout.")] = False,
    html_out: Annotated[Path | None, typer.Option("--html", help="Write a self-contained HTML page (charts inline).")] = None,
    write_limits: Annotated[Path | None, typer.Option(help="Write --agent's learned lines into this tripwire.toml's [limits].")] = None,
) -> None:
    if html_out is not None and html_out.suffix.lower() not in (".html", ".htm"):
        abort(f"--html must name a .html file, got {html_out}")
    if write_limits is not None and agent is None:
        abort("--write-limits needs --agent NAME: a learned line belongs to one agent")
    from sqlalchemy.exc import SQLAlchemyError

    from tripwire.errors import ConfigError
    from tripwire.report import build_report
    from tripwire.store.runs import RunStore

    now = time.time()
    try:
        run_store = RunStore.open(store)
        result = build_report(run_store, since=_since(since, now), agent=agent, alpha=alpha)
    except ConfigError as exc:
        abort(str(exc))
    except SQLAlchemyError as exc:
        abort(f"cannot read the run store: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    if result.overall.runs == 0:
        err_console.print(f"no runs in the store since {since}", highlight=False, soft_wrap=True)
    if write_limits is not None:
        _write_limits(write_limits, result)
    if html_out is not None:
        try:
            html_out.write_text(render_html(result), encoding="utf-8")
        except OSError as exc:
            abort(f"--html {html_out}: cannot write it ({exc.strerror or exc})", EXIT_USAGE)
        err_console.print(f"wrote {html_out}", highlight=False, soft_wrap=True)
    if as_json:
        out_console.print_json(json.dumps(result.as_json()))
        return
    if html_out is None:  # with --html, only where it wrote (stderr): the page is the report
        _print_tables(result)


def _fmt(value: float | None, unit: str = "") -> str:
    if value is None:
        return "-"
    if unit == "$":
        return f"${value:.4f}"
    if unit == "s":
        return f"{value:.1f}s"
    return f"{value:.1f}".rstrip("0").rstrip(".") if value != int(value) else f"{int(value)}"


def _print_tables(result: Report) -> None:
    from rich.table import Table

    from tripwire.report import NO_AGENT

    everyone = [result.overall, *result.agents]

    def name(a: AgentReport) -> str:
        return escape("(all)" if a is result.overall else a.agent or NO_AGENT)

    t = Table(title="runs and percentiles (p50 / p95 / p99)", title_justify="left")
    for col in ("agent", "runs", "steps", "tool calls", "duration", "cost", "stuck", "calls after stuck"):
        t.add_column(col, overflow="fold")
    for a in everyone:
        p = a.percentiles
        t.add_row(
            name(a),
            str(a.runs),
            " / ".join(_fmt(p["steps"][k]) for k in ("p50", "p95", "p99")),
            " / ".join(_fmt(p["tool_calls"][k]) for k in ("p50", "p95", "p99")),
            " / ".join(_fmt(p["duration_s"][k], "s") for k in ("p50", "p95", "p99")),
            " / ".join(_fmt(p["cost_usd"][k], "$") for k in ("p50", "p95", "p99")),
            str(a.stuck_runs),
            f"{a.calls_after_stuck} (${a.cost_after_stuck:.4f})",
        )
    out_console.print(t)
    s = Table(title="stop reasons and health", title_justify="left")
    s.add_column("agent")
    s.add_column("stop reasons (share of runs)", overflow="fold")
    s.add_column("health", overflow="fold")
    for a in everyone:
        s.add_row(
            name(a),
            ", ".join(f"{k} {v / a.runs:.0%}" for k, v in sorted(a.stop_reasons.items(), key=lambda kv: -kv[1])),
            ", ".join(f"{k} {v}" for k, v in sorted(a.health.items(), key=lambda kv: -kv[1])),
        )
    out_console.print(s)
    if result.overall.looping_tools:
        lt = Table(title="tools that loop most (runs judged stuck on them)", title_justify="left")
        lt.add_column("tool")
        lt.add_column("signature")
        lt.add_column("runs")
        for tool, digest, n in result.overall.looping_signatures:
            lt.add_row(escape(tool), digest + "…", str(n))
        out_console.print(lt)
    lb = Table(title=f"learned budgets (false-stop rate {result.alpha:g}, from each agent's healthy runs)", title_justify="left")
    for col in ("agent", "counter", "learned line", "today", "healthy runs", "note", "write it"):
        lb.add_column(col, overflow="fold")
    for a in result.agents:
        for line in a.learned:
            lb.add_row(
                name(a),
                line.counter,
                str(line.line) if line.line is not None else "-",
                _fmt(line.current),
                str(line.healthy_runs),
                line.note,
                # Quoted for the shell: an agent name is whatever the agents reported.
                escape(f"tripwire report --agent {shlex.quote(a.agent)} --write-limits tripwire.toml")
                if line.line is not None and a.agent
                else "",
            )
    out_console.print(lb)


def _write_limits(path: Path, result: Report) -> None:
    from tripwire.report import write_limits_file

    if not result.agents:
        abort("no runs of that agent: nothing learned to write")
    lines = {line.counter: line.line for line in result.agents[0].learned if line.line is not None}
    if not lines:
        notes = "; ".join(line.note for line in result.agents[0].learned)
        abort(f"nothing learned to write for {result.agents[0].agent}: {notes}")
    values = {{"tool_calls": "max_tool_calls", "steps": "max_steps"}[k]: v for k, v in lines.items()}
    try:
        write_limits_file(path, values)
    except (OSError, ValueError) as exc:
        abort(f"--write-limits {path}: {exc}", EXIT_USAGE)
    err_console.print(
        escape(f"wrote {', '.join(f'{k} = {v}' for k, v in values.items())} into [limits] of {path}"),
        highlight=False, soft_wrap=True,
    )


# -- HTML ------------------------------------------------------------------------------------


def _bars(title: str, items: list[tuple[str, float]], unit: str = "") -> str:
    """A horizontal bar chart as inline SVG (no script, no network)."""
    if not items:
        return ""
    top = max(v for _, v in items) or 1.0
    height = 24 * len(items) + 30
    rows = [f'<text x="0" y="16" class="t">{html.escape(title)}</text>']
    for i, (label, value) in enumerate(items):
        y = 28 + 24 * i
        w = int(300 * value / top)
        rows.append(f'<text x="0" y="{y + 14}">{html.escape(label[:40])}</text>')
        rows.append(f'<rect x="260" y="{y + 2}" width="{max(w, 1)}" height="16" fill="#1f5fa8"><title>{html.escape(label)}: {value:g}{unit}</title></rect>')
        rows.append(f'<text x="{266 + w}" y="{y + 14}">{value:g}{unit}</text>')
    return f'<svg role="img" aria-label="{html.escape(title)}" width="640" height="{height}">{"".join(rows)}</svg>'


def _agent_html(a: AgentReport, *, overall: bool = False) -> str:
    from tripwire.report import NO_AGENT

    p = a.percentiles
    cells = "".join(
        f"<tr><th scope='row'>{m}</th>" + "".join(f"<td>{_fmt(p[m][k], u)}</td>" for k in ("p50", "p95", "p99")) + "</tr>"
        for m, u in (("steps", ""), ("tool_calls", ""), ("duration_s", "s"), ("cost_usd", "$"))
    )
    learned = "".join(
        f"<tr><td>{html.escape(line.counter)}</td><td>{line.line if line.line is not None else '-'}</td><td>{_fmt(line.current)}</td><td>{line.healthy_runs}</td><td>{html.escape(line.note)}</td></tr>"
        for line in a.learned
    )
    name = html.escape("all agents" if overall else a.agent or NO_AGENT)
    return (
        f"<section><h2>{name} <small>({a.runs} runs)</small></h2>"
        f"<table><caption>percentiles</caption><tr><th></th><th>p50</th><th>p95</th><th>p99</th></tr>{cells}</table>"
        + _bars("stop reasons (runs)", sorted(((k, float(v)) for k, v in a.stop_reasons.items()), key=lambda kv: -kv[1]))
        + _bars("health states (runs)", sorted(((k, float(v)) for k, v in a.health.items()), key=lambda kv: -kv[1]))
        + _bars("tools that loop most (runs)", [(t, float(n)) for t, n in a.looping_tools])
        + f"<p>{a.stuck_runs} runs judged stuck; {a.calls_after_stuck} tool calls and ${a.cost_after_stuck:.4f} after their first stuck verdict.</p>"
        + (f"<table><caption>learned budgets</caption><tr><th>counter</th><th>line</th><th>today</th><th>healthy runs</th><th>note</th></tr>{learned}</table>" if learned else "")
        + "</section>"
    )


def render_html(result: Report) -> str:
    """The report as one self-contained HTML page (inline CSS and SVG; nothing fetched)."""
    period = "all runs" if result.since is None else f"runs since {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime(result.since))}"
    body = _agent_html(result.overall, overall=True) + "".join(_agent_html(a) for a in result.agents)
    return (
        "<!doctype html><html lang='en'><head><meta charset='utf-8'><title>tripwire report</title>"
        "<style>body{font:15px/1.45 system-ui,sans-serif;color:#111;background:#fff;max-width:960px;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;margin:1em 0}th,td{border:1px solid #888;padding:.25em .6em;text-align:right}"
        "caption{text-align:left;font-weight:600}svg text{font-size:13px;fill:#111}svg .t{font-weight:600}"
        "section{border-top:2px solid #1f5fa8;margin-top:2em}</style></head><body>"
        f"<h1>tripwire report</h1><p>{html.escape(period)}; learned lines at false-stop rate {result.alpha:g}.</p>"
        f"{body}</body></html>"
    )
