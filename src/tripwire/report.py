"""Fleet reports from the run store: what a team asks of its agent runs.

Per agent and overall, over a time range: how many runs; p50 / p95 / p99 of steps, tool calls,
duration and cost; the rate of each stop reason (a high ``max_steps`` rate means the cap is
wrong or the agent loops); the health states (``verified_complete`` against ``false_complete``,
``bounded_stop``, ``stuck`` …); the tools and signatures that loop most; the calls and money
spent after the first ``stuck`` verdict (what stopping there saved, or would have saved); and
the **learned budgets**: each agent's step and tool-call line from its own healthy runs, at a
stated false-stop rate (split-conformal, :func:`tripwire.replay.calibrate.learn_step_line`),
next to the cap it runs with today.

Percentiles are ``percentile_cont`` (linear interpolation between the two nearest ranks):
computed in SQL on PostgreSQL and in Python on SQLite, with the same numbers either way.
"""

from __future__ import annotations

import math
import os
from collections import Counter, defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Final

import sqlalchemy as sa

from tripwire.config import FILE_VERSIONS, config_from_file
from tripwire.errors import ConfigError
from tripwire.store.runs import RunStore, runs, verdicts

__all__ = [
    "HEALTHY_STATES",
    "METRICS",
    "NO_AGENT",
    "PERCENTILES",
    "AgentReport",
    "LearnedLine",
    "Report",
    "build_report",
    "percentile_cont",
    "write_limits_file",
]

NO_AGENT: Final = "(no agent)"
"""The one label every view (dashboard, ``tripwire report``) gives runs no span named an agent for."""
PERCENTILES: Final = (0.5, 0.95, 0.99)
METRICS: Final = ("steps", "tool_calls", "duration_s", "cost_usd")
HEALTHY_STATES: Final = frozenset({"verified_complete", "complete_unverified"})
"""Runs that finished normally and were not judged stuck: what a learned line is learned from."""
TOP: Final = 10


def percentile_cont(values: Sequence[float], p: float) -> float | None:
    """PostgreSQL's ``percentile_cont(p)``: linear interpolation between the nearest ranks.

    ``None`` for no values. For sorted ``x`` of length ``n``: position ``p * (n - 1)``, the value
    between ``x[floor]`` and ``x[ceil]`` in proportion.
    """
    if not values:
        return None
    xs = sorted(values)
    pos = p * (len(xs) - 1)
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


@dataclass(frozen=True, slots=True, kw_only=True)
class LearnedLine:
    """A learned budget line for one agent and one counter (or why there is none)."""

    counter: str
    """``tool_calls`` or ``steps``."""
    line: int | None
    """The learned cap: runs may use this many; ``None`` when it could not be learned."""
    alpha: float
    """The stated false-stop rate."""
    healthy_runs: int
    """How many healthy runs it was learned from."""
    current: float | None
    """The cap the agent runs with today (from its receipts, or the limits given), if known."""
    note: str = ""
    """Why there is no line (too few healthy runs), or how it compares with the current cap."""

    def as_json(self) -> dict[str, Any]:
        return {
            "counter": self.counter,
            "line": self.line,
            "alpha": self.alpha,
            "healthy_runs": self.healthy_runs,
            "current": self.current,
            "note": self.note,
        }


@dataclass(slots=True, kw_only=True)
class AgentReport:
    """The report of one agent (or ``agent=None``: the whole fleet)."""

    agent: str | None
    runs: int = 0
    percentiles: dict[str, dict[str, float | None]] = field(default_factory=dict)
    """``{metric: {"p50": …, "p95": …, "p99": …}}`` for :data:`METRICS`."""
    stop_reasons: dict[str, int] = field(default_factory=dict)
    health: dict[str, int] = field(default_factory=dict)
    looping_tools: list[tuple[str, int]] = field(default_factory=list)
    """Tools by how many runs they were the repeated call of a ``stuck`` verdict."""
    looping_signatures: list[tuple[str, str, int]] = field(default_factory=list)
    """``(tool, digest prefix, runs)`` of the repeated calls of ``stuck`` verdicts."""
    stuck_runs: int = 0
    calls_after_stuck: int = 0
    """Tool calls made after the first ``stuck`` verdict (what stopping there saves)."""
    cost_after_stuck: float = 0.0
    learned: list[LearnedLine] = field(default_factory=list)

    def rate(self, reason: str) -> float:
        """The share of runs that ended with stop reason ``reason``."""
        return self.stop_reasons.get(reason, 0) / self.runs if self.runs else 0.0

    def as_json(self) -> dict[str, Any]:
        return {
            "agent": self.agent,
            "runs": self.runs,
            "percentiles": self.percentiles,
            "stop_reasons": {
                k: {"runs": v, "rate": v / self.runs if self.runs else 0.0}
                for k, v in sorted(self.stop_reasons.items())
            },
            "health": dict(sorted(self.health.items())),
            "looping_tools": [{"tool": t, "runs": n} for t, n in self.looping_tools],
            "looping_signatures": [
                {"tool": t, "digest": d, "runs": n} for t, d, n in self.looping_signatures
            ],
            "stuck_runs": self.stuck_runs,
            "calls_after_stuck": self.calls_after_stuck,
            "cost_after_stuck": self.cost_after_stuck,
            "learned": [line.as_json() for line in self.learned],
        }


@dataclass(slots=True, kw_only=True)
class Report:
    """The fleet report: overall, then one per agent (most runs first)."""

    since: float | None
    until: float | None
    alpha: float
    overall: AgentReport
    agents: list[AgentReport]

    def as_json(self) -> dict[str, Any]:
        return {
            "since": self.since,
            "until": self.until,
            "alpha": self.alpha,
            "overall": self.overall.as_json(),
            "agents": [a.as_json() for a in self.agents],
        }


def build_report(
    store: RunStore,
    *,
    since: float | None = None,
    until: float | None = None,
    agent: str | None = None,
    alpha: float = 0.05,
    current_caps: dict[str, float] | None = None,
) -> Report:
    """The report over runs created in ``[since, until)`` (all runs when both are ``None``).

    Args:
        store: the run store.
        since: Unix seconds; runs created before are left out.
        until: Unix seconds; runs created at or after are left out.
        agent: only this agent.
        alpha: the false-stop rate of the learned lines.
        current_caps: ``{"tool_calls": 40, "steps": 20}`` the agents run with today (from a
            limits file); default, the caps their receipts recorded when a cap stopped them.
    """
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise ConfigError("--alpha", alpha, "a false-stop rate above 0 and below 1, e.g. 0.05")
    conditions = _conditions(since, until, agent)
    with store.engine.connect() as conn:
        rows = conn.execute(
            sa.select(
                runs.c.agent,
                runs.c.status,
                runs.c.stop_reason,
                runs.c.health,
                runs.c.verdict,
                runs.c.steps,
                runs.c.tool_calls,
                runs.c.duration_s,
                runs.c.cost_usd,
                runs.c.first_stuck_call,
                runs.c.calls_after_stuck,
                runs.c.cost_after_stuck,
                runs.c.receipt,
            ).where(*conditions)
        ).all()
        loops = conn.execute(
            sa.select(runs.c.agent, verdicts.c.trace_id, verdicts.c.tool, verdicts.c.digest)
            .join(runs, runs.c.trace_id == verdicts.c.trace_id)
            .where(verdicts.c.verdict == "stuck", verdicts.c.stop_reason.is_(None), *conditions)
        ).all()
        sql_percentiles = (
            _sql_percentiles(conn, conditions) if store.dialect == "postgresql" else None
        )
    by_agent: dict[str | None, list[Any]] = defaultdict(list)
    for row in rows:
        by_agent[row.agent].append(row)
    loops_by_agent: dict[str | None, list[Any]] = defaultdict(list)
    for loop in loops:
        loops_by_agent[loop.agent].append(loop)
    overall = _agent_report(None, rows, loops, alpha, current_caps, learn=False)
    if sql_percentiles is not None:
        overall.percentiles = sql_percentiles.pop(("__all__",))
    agents = []
    for name, agent_rows in sorted(by_agent.items(), key=lambda kv: (-len(kv[1]), kv[0] or "")):
        report = _agent_report(name, agent_rows, loops_by_agent.get(name, []), alpha, current_caps, learn=True)
        if sql_percentiles is not None:
            report.percentiles = sql_percentiles.get((name,), report.percentiles)
        agents.append(report)
    return Report(since=since, until=until, alpha=alpha, overall=overall, agents=agents)


def _conditions(since: float | None, until: float | None, agent: str | None) -> list[Any]:
    out: list[Any] = []
    if since is not None:
        out.append(runs.c.created_at >= since)
    if until is not None:
        out.append(runs.c.created_at < until)
    if agent is not None:
        out.append(runs.c.agent == agent)
    return out


def _sql_percentiles(conn: Any, conditions: list[Any]) -> dict[tuple[str | None], dict[str, dict[str, float | None]]]:
    """PostgreSQL ``percentile_cont`` per agent and overall, in one query each."""
    columns = []
    for metric in METRICS:
        col = getattr(runs.c, metric)
        for p in PERCENTILES:
            columns.append(
                sa.func.percentile_cont(p).within_group(col.asc()).label(f"{metric}:{p}")
            )
    out: dict[tuple[str | None], dict[str, dict[str, float | None]]] = {}
    overall = conn.execute(sa.select(*columns).where(*conditions)).one()
    out[("__all__",)] = _unpack(overall._mapping)
    for row in conn.execute(
        sa.select(runs.c.agent, *columns).where(*conditions).group_by(runs.c.agent)
    ).all():
        out[(row.agent,)] = _unpack(row._mapping)
    return out


def _unpack(mapping: Any) -> dict[str, dict[str, float | None]]:
    out: dict[str, dict[str, float | None]] = {}
    for metric in METRICS:
        out[metric] = {}
        for p in PERCENTILES:
            value = mapping[f"{metric}:{p}"]
            out[metric][_pname(p)] = float(value) if value is not None else None
    return out


def _pname(p: float) -> str:
    return f"p{round(p * 100):d}"


def _agent_report(
    agent: str | None,
    rows: Sequence[Any],
    loops: Iterable[Any],
    alpha: float,
    current_caps: dict[str, float] | None,
    *,
    learn: bool,
) -> AgentReport:
    report = AgentReport(agent=agent, runs=len(rows))
    for metric in METRICS:
        values = [float(getattr(r, metric)) for r in rows if getattr(r, metric) is not None]
        report.percentiles[metric] = {_pname(p): percentile_cont(values, p) for p in PERCENTILES}
    report.stop_reasons = dict(Counter(r.stop_reason or "running" for r in rows))
    report.health = dict(Counter(r.health or ("running" if r.status != "ended" else "unknown") for r in rows))
    tools: Counter[str] = Counter()
    signatures: Counter[tuple[str, str]] = Counter()
    seen: set[tuple[str, str | None]] = set()
    for row in loops:
        if (row.trace_id, row.tool) in seen:
            continue
        seen.add((row.trace_id, row.tool))
        tools[row.tool or "?"] += 1
        signatures[(row.tool or "?", (row.digest or "")[:12])] += 1
    report.looping_tools = tools.most_common(TOP)
    report.looping_signatures = [(t, d, n) for (t, d), n in signatures.most_common(TOP)]
    stuck = [r for r in rows if r.first_stuck_call is not None]
    report.stuck_runs = len(stuck)
    report.calls_after_stuck = sum(r.calls_after_stuck or 0 for r in stuck)
    report.cost_after_stuck = sum(r.cost_after_stuck or 0.0 for r in stuck)
    if learn:
        report.learned = _learned(rows, alpha, current_caps)
    return report


def _learned(rows: Sequence[Any], alpha: float, current_caps: dict[str, float] | None) -> list[LearnedLine]:
    from tripwire.replay.calibrate import learn_step_line, min_runs_for

    healthy = [r for r in rows if r.health in HEALTHY_STATES and r.first_stuck_call is None]
    out = []
    for counter, limit_name in (("tool_calls", "max_tool_calls"), ("steps", "max_steps")):
        current = (current_caps or {}).get(counter)
        if current is None:
            current = _cap_from_receipts(rows, limit_name)
        counts = [int(getattr(r, counter)) for r in healthy]
        if len(counts) < min_runs_for(alpha):
            out.append(
                LearnedLine(
                    counter=counter, line=None, alpha=alpha, healthy_runs=len(counts), current=current,
                    note=f"needs at least {min_runs_for(alpha)} healthy runs at alpha={alpha:g}",
                )
            )
            continue
        learned = learn_step_line(counts, alpha=alpha)
        note = ""
        if current is not None:
            if learned.max_tool_calls < current:
                note = f"tighter than today's {current:g}"
            elif learned.max_tool_calls > current:
                note = f"today's cap {current:g} stops more than {alpha:.0%} of healthy runs"
            else:
                note = "the same as today's cap"
        out.append(
            LearnedLine(
                counter=counter, line=learned.max_tool_calls, alpha=alpha, healthy_runs=len(counts),
                current=current, note=note,
            )
        )
    return out


def _cap_from_receipts(rows: Sequence[Any], limit_name: str) -> float | None:
    """The cap a receipt recorded when that cap stopped one of these runs."""
    import json

    caps = []
    for row in rows:
        if not row.receipt:
            continue
        try:
            condition = json.loads(row.receipt).get("condition") or {}
        except (ValueError, AttributeError):
            continue
        value = condition.get(limit_name)
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            caps.append(float(value))
    return max(caps) if caps else None


def write_limits_file(path: str | os.PathLike[str], values: dict[str, int]) -> None:
    """Set ``values`` (``max_tool_calls = 37``…) in the ``[limits]`` table of a TOML file.

    Keeps everything else in the file as it is: keys already in ``[limits]`` are replaced in
    place, new ones are added at the end of that table, and the table is appended when the file
    has none (the file is created when missing). A file without a ``version`` key gets
    ``version = 1`` at its top, so that :func:`tripwire.config.load_config` reads what this
    wrote; the new ``[limits]`` table is checked by that loader before anything is written.

    Raises:
        ValueError: the file is not valid TOML, or is a tripwire file of another version, or
            the values are not valid limits (the file is left untouched).
        OSError: it cannot be read or written.
    """
    import re
    import sys

    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

    target = os.fspath(path)
    try:
        with open(target, encoding="utf-8") as fh:
            text = fh.read()
    except FileNotFoundError:
        text = ""
    try:
        existing = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"not valid TOML ({exc}); left untouched") from None
    if "version" in existing and existing["version"] not in FILE_VERSIONS:
        raise ValueError(
            f"file version {existing['version']!r} is not one this tripwire writes "
            f"({list(FILE_VERSIONS)}); left untouched"
        )
    lines = text.splitlines()
    if "version" not in existing:
        # Top-level keys must come before the first table: after the leading comments.
        at = 0
        while at < len(lines) and (not lines[at].strip() or lines[at].lstrip().startswith("#")):
            at += 1
        lines[at:at] = ["version = 1", ""] if at < len(lines) else ["version = 1"]
    header = re.compile(r"^\s*\[\s*limits\s*\]\s*(#.*)?$")
    any_header = re.compile(r"^\s*\[")
    start = next((i for i, line in enumerate(lines) if header.match(line)), None)
    pending = dict(values)
    if start is None:
        if lines and lines[-1].strip():
            lines.append("")
        lines.append("[limits]")
        lines += [f"{k} = {v}" for k, v in pending.items()]
    else:
        end = next((j for j in range(start + 1, len(lines)) if any_header.match(lines[j])), len(lines))
        for j in range(start + 1, end):
            m = re.match(r"^\s*([A-Za-z_][A-Za-z0-9_]*)\s*=", lines[j])
            if m and m.group(1) in pending:
                lines[j] = f"{m.group(1)} = {pending.pop(m.group(1))}"
        insert_at = end
        while insert_at > start + 1 and not lines[insert_at - 1].strip():
            insert_at -= 1
        lines[insert_at:insert_at] = [f"{k} = {v}" for k, v in pending.items()]
    new_text = "\n".join(lines) + "\n"
    written = tomllib.loads(new_text)  # never write a file we could not read back
    try:  # the loader must accept the [limits] table as written (the rest is the user's)
        config_from_file({"version": written["version"], "limits": written["limits"]}, target)
    except ConfigError as exc:
        raise ValueError(f"{exc}; left untouched") from None
    tmp = target + ".tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(new_text)
    os.replace(tmp, target)
