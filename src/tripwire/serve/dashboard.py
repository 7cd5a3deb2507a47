"""The dashboard of ``tripwire serve``: Fleet, Runs and Run pages an on-call engineer acts from.

Server-rendered (Jinja2 templates in ``serve/templates``, one stylesheet and one small script in
``serve/static``, all served by the service itself: it works offline, no CDN). Pages refresh
their live parts every two seconds from server-rendered fragments (``/fragments/...``). Behind
the service's auth: a browser signs in once with the bearer token (``/login``), kept in an
HttpOnly, SameSite=Strict cookie; actions (kill, resolve, acknowledge) are POST forms that also
carry a CSRF token derived from that token.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import math
import time
from html import escape
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import urlencode

import sqlalchemy as sa
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles

from tripwire.report import NO_AGENT
from tripwire.serve.killchannel import ACTIONS
from tripwire.serve.websecurity import SESSION_COOKIE, SESSION_TTL_S
from tripwire.store.runs import RunStore, runs, verdicts

if TYPE_CHECKING:
    from tripwire.serve.app import Service

__all__ = ["dashboard_routes"]

HERE: Final = Path(__file__).parent
PAGE_SIZE: Final = 50
VERDICTS: Final = ("working", "stuck", "uncertain", "retrying", "waiting")
_DONE: Final = {
    "kill": "Kill flag raised: the agent stops at its next step.",
    "resolve": "Resolved: the flag is down.",
    "acknowledge": "Acknowledged.",
}


def _env() -> Any:
    from jinja2 import Environment, FileSystemLoader, select_autoescape

    env = Environment(
        loader=FileSystemLoader(str(HERE / "templates")),
        autoescape=select_autoescape(["html"]),
        trim_blocks=True,
        lstrip_blocks=True,
    )
    env.globals["no_agent"] = NO_AGENT
    env.filters["when"] = lambda t: (
        time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(t)) if t else "—"
    )
    return env


def _since(text: str | None, now: float) -> float | None:
    units = {"h": 3600.0, "d": 86400.0}
    if not text or text == "all":
        return None
    if text[-1] in units and text[:-1].isdigit():
        return now - float(text[:-1]) * units[text[-1]]
    return now - 86400.0


def _stacked_chart(buckets: list[dict[str, int]], start: float, hours: int) -> str:
    """Runs ended per hour, stacked by stop reason, as inline SVG with a text alternative."""
    reasons = sorted({r for b in buckets for r in b})
    colours = ["#0b4f9c", "#a4161a", "#1b6e2a", "#7a4b00", "#5a189a", "#333333", "#00695c"]
    top: float = max((sum(b.values()) for b in buckets), default=0) or 1
    width, height, left, bottom = 760, 196, 40, 150
    bar = (width - left) / hours
    parts = []
    for i, b in enumerate(buckets):
        y: float = bottom
        for j, reason in enumerate(reasons):
            n = b.get(reason, 0)
            if not n:
                continue
            h = 130 * n / top
            y -= h
            when = time.strftime("%H:00", time.gmtime(start + i * 3600))
            parts.append(
                f'<rect x="{left + i * bar:.1f}" y="{y:.1f}" width="{bar - 2:.1f}" height="{h:.1f}" '
                f'fill="{colours[j % len(colours)]}"><title>{when}: {n} {reason}</title></rect>'
            )
    parts.append(f'<text x="0" y="{bottom}">0</text><text x="0" y="24">{top:g}</text>')
    parts.append(f'<line x1="{left}" y1="{bottom}" x2="{width}" y2="{bottom}" class="axis"></line>')
    for i in range(0, hours, 3):  # the time axis: every third hour, UTC
        when = time.strftime("%H:00", time.gmtime(start + i * 3600))
        parts.append(f'<text x="{left + i * bar:.1f}" y="{bottom + 12}" class="hour">{when}</text>')
    legend = "".join(
        f'<rect x="{left + k * 130}" y="178" width="10" height="10" fill="{colours[k % len(colours)]}"></rect>'
        f'<text x="{left + k * 130 + 14}" y="187">{reason}</text>'
        for k, reason in enumerate(reasons)
    )
    total = sum(sum(b.values()) for b in buckets)
    label = f"Runs ended per hour over the last {hours} hours, by stop reason: {total} in all"
    return (
        f'<svg class="chart" role="img" aria-label="{label}" width="{width}" height="{height}" viewBox="0 0 {width} {height}">'
        f"{''.join(parts)}{legend}</svg>"
    )


PALETTE_SIZE: Final = 12
"""The loop strip's colours: classes ``sig-0`` … ``sig-11`` in tripwire.css (the CSP forbids
inline styles)."""


def _letters(n: int) -> str:
    """0 → A, 25 → Z, 26 → AA: a signature's name on the strip, in order of first appearance."""
    out = ""
    n += 1
    while n:
        n, r = divmod(n - 1, 26)
        out = chr(65 + r) + out
    return out


def _strip(calls: list[Any], history: list[Any]) -> list[dict[str, Any]]:
    """The loop drawn: one cell per call, a letter and a colour class per signature in order of
    first appearance (A A A A, A B A B: readable as text too; twelve signatures get twelve
    different colours, where a colour taken from the digest gave A and B the same one in about
    one run of twelve), the calls where the verdict changed marked, the tool (and the raw
    arguments, when the service keeps them) on hover."""
    changes: dict[int, str] = {}
    for v in history:
        if v.call_index is not None:
            what = v.stop_reason or v.verdict
            changes[v.call_index] = what + (f" ({v.rule})" if v.rule else "")
    names: dict[str, str] = {}
    order: dict[str, int] = {}
    cells = []
    for c in calls:
        digest = c.digest or ""
        if digest and digest not in order:
            order[digest] = len(order)
        if digest not in names:
            names[digest] = _letters(len(names))
        colour = order[digest] % PALETTE_SIZE if digest else None  # no digest recorded: none
        title = f"#{c.call_index} {c.tool}" + (f" · signature {digest[:12]}" if digest else "")
        if c.raw:
            title += f" · {c.raw[:200]}"
        change = changes.get(c.call_index)
        if change:
            title += f" · verdict: {change}"
        cells.append({
            "index": c.call_index,
            "letter": names[digest],
            "css": f"sig-{colour}" if colour is not None else "sig-none",
            "title": title,
            "change": change,
        })
    return cells


def _duration(seconds: float) -> str:
    """``42 s``, ``3 min``, ``2 h 5 min``: how long a run has been stuck."""
    if seconds < 60:
        return f"{seconds:.0f} s"
    if seconds < 3600:
        return f"{seconds // 60:.0f} min"
    return f"{seconds // 3600:.0f} h {seconds % 3600 // 60:.0f} min"


def _actions(status: str, verdict: str, acknowledged: bool, flag_up: bool) -> list[str]:
    """The actions that apply to a run: Kill while it runs (and its flag is down), Resolve while
    its flag is up, Acknowledge while it is judged stuck and nobody has; an ended healthy run
    has none."""
    out = []
    if status == "running" and not flag_up:
        out.append("kill")
    if flag_up:
        out.append("resolve")
    if verdict == "stuck" and not acknowledged:
        out.append("acknowledge")
    return out


def _receipt_summary(receipt: dict[str, Any], health: str | None, health_reason: str | None) -> list[tuple[str, str]]:
    """The stop receipt as (label, text) lines a person reads: stop cause (and who acted, for an
    operator's kill), health, counters, versions. Read from the stored JSON: an older or partial
    receipt shows what it has."""
    def text(value: Any) -> str:
        return "—" if value is None or value == "" else str(value)

    reason, end = receipt.get("reason"), receipt.get("end")
    cause = text(reason) + (f" (end: {end})" if end else "")
    condition = receipt.get("condition")
    if isinstance(condition, dict) and condition.get("source") == "operator":
        at = condition.get("at")
        when = time.strftime(" at %H:%M:%S UTC", time.gmtime(at)) if isinstance(at, (int, float)) else ""
        cause += f"; killed by {text(condition.get('by'))} via {text(condition.get('via'))}{when}"
    elif isinstance(condition, dict) and condition:
        cause += "; " + ", ".join(f"{k} {v}" for k, v in sorted(condition.items()))
    counters = receipt.get("counters") if isinstance(receipt.get("counters"), dict) else {}
    assert isinstance(counters, dict)
    parts = [
        f"{counters.get('tool_calls', 0)} tool calls",
        f"{counters.get('steps', 0)} steps",
        f"{counters.get('input_tokens', 0)} + {counters.get('output_tokens', 0)} tokens",
    ]
    if isinstance(counters.get("cost_usd"), (int, float)):
        parts.append(f"${counters['cost_usd']:.4f}")
    if isinstance(counters.get("duration_s"), (int, float)):
        parts.append(f"{counters['duration_s']:.1f} s")
    verdict = receipt.get("verdict")
    return [
        ("stop cause", cause),
        ("health", text(health) + (f": {health_reason}" if health_reason else "")),
        ("verdict at the end", text(verdict.get("verdict") if isinstance(verdict, dict) else verdict)),
        ("counters", ", ".join(parts)),
        ("versions", f"policy {text(receipt.get('policy_version'))} · normalizer {text(receipt.get('normalizer_version'))}"),
    ]


class _Pages:
    def __init__(self, svc: Service) -> None:
        self.svc = svc
        self.store: RunStore = svc.store
        self.env = _env()

    # -- auth --------------------------------------------------------------------------------

    def csrf(self, request: Request) -> str:
        """The CSRF token the page's forms carry: derived from the request's bearer token, else
        from its session (every form post must carry it, however it authenticated)."""
        token = self.svc.bearer(request)
        return self.svc.sessions.csrf("bearer " + token if token else request.cookies.get(SESSION_COOKIE, ""))

    def page(self, name: str, **context: Any) -> HTMLResponse:
        return HTMLResponse(self.env.get_template(name).render(**context))

    def guard(self, request: Request) -> Response | None:
        if self.svc.authorized(request):
            return None
        if request.url.path.startswith("/fragments/"):
            return Response("sign in again", status_code=401)
        return RedirectResponse("/login?" + urlencode({"next": request.url.path}), status_code=303)

    # -- data ----------------------------------------------------------------------------------

    def fleet(self, now: float) -> dict[str, Any]:
        day = now - 86400
        midnight = now - (now % 86400)
        with self.store.engine.connect() as conn:
            counts: dict[Any, Any] = dict(
                conn.execute(
                    sa.select(runs.c.verdict, sa.func.count())
                    .where(runs.c.updated_at >= day)
                    .group_by(runs.c.verdict)
                ).all()
            )
            stopped = conn.execute(
                sa.select(
                    sa.func.count(),
                    sa.func.coalesce(sa.func.sum(runs.c.calls_after_stuck), 0),
                    sa.func.coalesce(sa.func.sum(runs.c.cost_after_stuck), 0.0),
                ).where(runs.c.updated_at >= midnight, runs.c.killed.is_(True))
            ).one()
            ended = conn.execute(
                sa.select(runs.c.ended_at, runs.c.stop_reason).where(
                    runs.c.status == "ended", runs.c.ended_at >= day
                )
            ).all()
            tools = conn.execute(
                sa.select(verdicts.c.tool, sa.func.count(sa.distinct(verdicts.c.trace_id)).label("n"))
                .where(verdicts.c.verdict == "stuck", verdicts.c.stop_reason.is_(None), verdicts.c.at >= day)
                .group_by(verdicts.c.tool)
                .order_by(sa.desc("n"))
                .limit(10)
            ).all()
            agents = conn.execute(
                sa.select(runs.c.agent, sa.func.count().label("n"))
                .where(runs.c.first_stuck_call.is_not(None), runs.c.updated_at >= day)
                .group_by(runs.c.agent)
                .order_by(sa.desc("n"))
                .limit(10)
            ).all()
        hours = 24
        stuck_now = self.stuck_now(now)
        start = now - now % 3600 - (hours - 1) * 3600
        buckets: list[dict[str, int]] = [{} for _ in range(hours)]
        reasons: dict[str, int] = {}
        for ended_at, reason in ended:
            key = reason or "unknown"
            reasons[key] = reasons.get(key, 0) + 1
            i = int((ended_at - start) // 3600)
            if 0 <= i < hours:
                buckets[i][key] = buckets[i].get(key, 0) + 1
        return {
            "stuck_now": stuck_now,
            "counts": {str(k): int(v) for k, v in counts.items()},
            "stopped": {"runs": int(stopped[0]), "calls_after": int(stopped[1]), "cost_after": float(stopped[2])},
            "reasons": sorted(reasons.items(), key=lambda kv: -kv[1]),
            "total": sum(reasons.values()),
            "chart": _stacked_chart(buckets, start, hours),
            "tools": [(t or "?", int(n)) for t, n in tools],
            "agents": [(a or NO_AGENT, int(n)) for a, n in agents],
        }

    def stuck_now(self, now: float, limit: int = 20) -> list[dict[str, Any]]:
        """The runs judged stuck and still going, longest stuck first: agent, the tool and rule
        of their stuck verdict, calls and money since, how long, whether their flag is up."""
        with self.store.engine.connect() as conn:
            rows = conn.execute(
                sa.select(runs.c.trace_id, runs.c.agent, runs.c.rule, runs.c.calls_after_stuck,
                          runs.c.cost_after_stuck, runs.c.acknowledged, runs.c.updated_at)
                .where(runs.c.status == "running", runs.c.verdict == "stuck")
                .order_by(runs.c.created_at)
                .limit(limit)
            ).all()
            first: dict[str, tuple[float, str | None]] = {}
            if rows:
                for tid, at, tool in conn.execute(
                    sa.select(verdicts.c.trace_id, verdicts.c.at, verdicts.c.tool)
                    .where(verdicts.c.trace_id.in_([r.trace_id for r in rows]), verdicts.c.verdict == "stuck")
                    .order_by(verdicts.c.id)
                ).all():
                    first.setdefault(tid, (at, tool))
        out = []
        for r in rows:
            at, tool = first.get(r.trace_id, (r.updated_at, None))
            out.append({
                "trace_id": r.trace_id,
                "agent": r.agent or NO_AGENT,
                "tool": tool or "?",
                "rule": r.rule or "—",
                "calls_after": int(r.calls_after_stuck or 0),
                "cost_after": r.cost_after_stuck,
                "for": _duration(max(now - (at or now), 0.0)),
                "acknowledged": bool(r.acknowledged),
                "flag_up": self.svc.kill.get(r.trace_id, now) is not None,
            })
        return out

    def runs_page(self, request: Request, now: float) -> dict[str, Any]:
        q = request.query_params
        filters = {k: (q.get(k) or None) for k in ("agent", "verdict", "health", "stop_reason")}
        since_text = q.get("since") or "24h"
        try:
            offset = max(0, int(q.get("offset", "0")))
        except ValueError:
            offset = 0
        rows, total = self.store.runs(
            verdict=filters["verdict"],
            agent=filters["agent"],
            stop_reason=filters["stop_reason"],
            health=filters["health"],
            since=_since(since_text, now),
            limit=PAGE_SIZE,
            offset=offset,
        )
        with self.store.engine.connect() as conn:
            agents = [a for (a,) in conn.execute(sa.select(runs.c.agent).distinct().where(runs.c.agent.is_not(None)).order_by(runs.c.agent).limit(200)).all()]
            health = [h for (h,) in conn.execute(sa.select(runs.c.health).distinct().where(runs.c.health.is_not(None))).all()]
            reasons = [r for (r,) in conn.execute(sa.select(runs.c.stop_reason).distinct().where(runs.c.stop_reason.is_not(None))).all()]
        base = {k: v for k, v in filters.items() if v}
        base["since"] = since_text
        return {
            "rows": rows,
            "total": total,
            "offset": offset,
            "filters": {**filters, "since": since_text},
            "choices": {"agents": agents, "health": sorted(health), "reasons": sorted(reasons)},
            "query": urlencode({**base, "offset": offset}),
            "prev_query": urlencode({**base, "offset": max(0, offset - PAGE_SIZE)}),
            "next_query": urlencode({**base, "offset": offset + PAGE_SIZE}),
        }

    def run_page(self, trace_id: str, now: float) -> dict[str, Any] | None:
        row = self.store.run(trace_id)
        if row is None:
            return None
        receipt = json.dumps(row.receipt, indent=2, sort_keys=True) if row.receipt else None
        health_reason = None
        if row.receipt:
            try:
                from tripwire.core.receipt import StopReceipt, classify

                health_reason = classify(StopReceipt.from_dict(row.receipt)).reason
            except Exception:  # an older or partial receipt: show the state alone
                health_reason = None
        flag = self.svc.kill.get(trace_id, now)
        calls = self.store.calls(trace_id)
        history = self.store.verdicts(trace_id)
        return {
            "run": row,
            "verdicts": history,
            "calls": calls,
            "strip": _strip(calls, history),
            "flag": flag,
            "receipt": receipt,
            "summary": _receipt_summary(row.receipt, row.health, health_reason) if row.receipt else [],
            "health_reason": health_reason,
            "actions": _actions(row.status, row.verdict, bool(row.acknowledged), flag is not None),
        }


def dashboard_routes(svc: Service) -> list[Any]:
    """The dashboard's routes, to mount on the service's app."""
    pages = _Pages(svc)

    async def login_form(request: Request) -> Response:
        return pages.page("login.html", title="Sign in", page="login", error=None, next=request.query_params.get("next", "/"))

    async def login(request: Request) -> Response:
        client = request.client.host if request.client is not None else ""
        now = svc.clock()
        wait = svc.login_throttle.wait_s(client, now)
        if wait > 0:
            return HTMLResponse(
                pages.env.get_template("login.html").render(
                    title="Sign in", page="login", next="/",
                    error=f"Too many failed sign-ins from this address: try again in {math.ceil(wait)} s.",
                ),
                status_code=429,
                headers={"Retry-After": str(math.ceil(wait))},
            )
        form = await request.form()
        token = str(form.get("token", "")).strip()
        target = str(form.get("next", "/"))
        if not target.startswith("/") or target.startswith("//"):
            target = "/"
        actor = svc.token_name(token) if svc.config.auth else "anonymous"
        if actor is None:
            svc.login_throttle.failed(client, now)
            return HTMLResponse(
                pages.env.get_template("login.html").render(title="Sign in", page="login", error="That token is not accepted.", next=target),
                status_code=401,
            )
        response = RedirectResponse(target, status_code=303)
        # The cookie holds a session id, never the token; Secure when the browser came by TLS
        # (directly, or through a proxy that says so).
        secure = request.url.scheme == "https" or request.headers.get("x-forwarded-proto", "").lower() == "https"
        response.set_cookie(
            SESSION_COOKIE, svc.sessions.open(actor, now), httponly=True, samesite="strict",
            max_age=int(SESSION_TTL_S), secure=secure,
        )
        return response

    async def fleet(request: Request) -> Response:
        denied = pages.guard(request)
        if denied is not None:
            return denied
        data = await asyncio.to_thread(pages.fleet, svc.clock())
        return pages.page("fleet.html", title="Fleet", page="fleet", csrf=pages.csrf(request), flash=request.query_params.get("done"), **data)

    async def fleet_fragment(request: Request) -> Response:
        denied = pages.guard(request)
        if denied is not None:
            return denied
        data = await asyncio.to_thread(pages.fleet, svc.clock())
        return pages.page("fleet_fragment.html", csrf=pages.csrf(request), **data)

    async def runs_list(request: Request) -> Response:
        denied = pages.guard(request)
        if denied is not None:
            return denied
        data = await asyncio.to_thread(pages.runs_page, request, svc.clock())
        return pages.page("runs.html", title="Runs", page="runs", **data)

    async def runs_fragment(request: Request) -> Response:
        denied = pages.guard(request)
        if denied is not None:
            return denied
        data = await asyncio.to_thread(pages.runs_page, request, svc.clock())
        return pages.page("runs_fragment.html", **data)

    async def run_detail(request: Request) -> Response:
        denied = pages.guard(request)
        if denied is not None:
            return denied
        trace_id = request.path_params["trace_id"].lower()
        data = await asyncio.to_thread(pages.run_page, trace_id, svc.clock())
        if data is None:
            return HTMLResponse(f"<p>No run {escape(trace_id[:32])} in the store.</p>", status_code=404)
        return pages.page("run.html", title=f"Run {trace_id[:12]}", page="runs", csrf=pages.csrf(request), flash=request.query_params.get("done"), **data)

    async def run_fragment(request: Request) -> Response:
        denied = pages.guard(request)
        if denied is not None:
            return denied
        data = await asyncio.to_thread(pages.run_page, request.path_params["trace_id"].lower(), svc.clock())
        if data is None:
            return Response("gone", status_code=404)
        return pages.page("run_fragment.html", **data)

    async def act(request: Request) -> Response:
        denied = pages.guard(request)
        if denied is not None:
            return denied
        form = await request.form()
        if not hmac.compare_digest(str(form.get("csrf", "")), pages.csrf(request)):
            return Response("stale form: reload the page", status_code=403)
        trace_id = request.path_params["trace_id"].lower()
        action = request.path_params["action"]
        if action not in ACTIONS:
            return Response("unknown action", status_code=404)
        actor = svc.actor(request) or "unknown"
        done_row = await svc.operate(
            trace_id, action, message=f"killed by {actor} from the dashboard", actor=actor, via="dashboard"
        )
        if done_row is None:
            return HTMLResponse(f"<p>No run {escape(trace_id[:32])} in the store.</p>", status_code=404)
        done = _DONE[action]
        if form.get("back") == "fleet":  # acted from the Fleet's "stuck now" list: back there
            return RedirectResponse("/?" + urlencode({"done": f"Run {trace_id[:12]}: {done}"}), status_code=303)
        return RedirectResponse(f"/runs/{trace_id}?" + urlencode({"done": done}), status_code=303)

    return [
        Route("/", fleet, methods=["GET"]),
        Route("/login", login_form, methods=["GET"]),
        Route("/login", login, methods=["POST"]),
        Route("/fragments/fleet", fleet_fragment, methods=["GET"]),
        Route("/runs", runs_list, methods=["GET"]),
        Route("/fragments/runs", runs_fragment, methods=["GET"]),
        Route("/runs/{trace_id}", run_detail, methods=["GET"]),
        Route("/fragments/runs/{trace_id}", run_fragment, methods=["GET"]),
        Route("/runs/{trace_id}/{action}", act, methods=["POST"]),
        Mount("/static", app=StaticFiles(directory=str(HERE / "static")), name="static"),
    ]
