"""Alerts on transitions only: a generic JSON webhook, a Slack incoming webhook, PagerDuty.

An alert is written into the run store's outbox in the same transaction as the transition that
causes it (:meth:`Alerts.for_transition` builds the rows), and sent afterwards by
:class:`Sender` with a timeout, retries and exponential backoff, so that a crash between the two
loses nothing: the next start sends what is still due. Each alert has a dedupe key
(``<trace>:<target>:trigger`` / ``:resolve``), so a run pages once, and is resolved once, when
it recovers (its verdict leaves ``stuck``) or ends.

PagerDuty: Events API v2 (``POST /v2/enqueue`` with ``routing_key``, ``event_action``
``trigger``/``resolve`` and ``dedup_key`` ``tripwire-<trace id>``). Slack: ``{"text": …}``.
Webhook: the transition as JSON. Payloads carry tool names and digest prefixes, never arguments.
"""

from __future__ import annotations

import asyncio
import logging
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from tripwire.errors import ConfigError
from tripwire.serve.fleet import Transition
from tripwire.store.runs import RunStore

__all__ = ["AlertTarget", "Alerts", "Sender"]

logger = logging.getLogger("tripwire.serve.alerts")

PAGERDUTY_URL: Final = "https://events.pagerduty.com/v2/enqueue"
MAX_ATTEMPTS: Final = 8
"""Attempts per alert before it is given up (logged; kept in the outbox with its last error)."""
MAX_TRIGGERED: Final = 100_000
"""Runs remembered as paged (to send their resolve), least recent dropped first."""


@dataclass(frozen=True, slots=True, kw_only=True)
class AlertTarget:
    """Where alerts go."""

    kind: str
    """``webhook``, ``slack`` or ``pagerduty``."""
    url: str
    """The endpoint (for PagerDuty, the Events API URL; default the public one)."""
    routing_key: str | None = None
    """PagerDuty's integration key (required for ``pagerduty``)."""

    def __post_init__(self) -> None:
        if self.kind not in ("webhook", "slack", "pagerduty"):
            raise ConfigError("alert kind", self.kind, "webhook, slack or pagerduty")
        if not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"{self.kind} URL", self.url, "an http:// or https:// URL")
        if self.kind == "pagerduty" and not self.routing_key:
            raise ConfigError("pagerduty routing key", self.routing_key, "a non-empty key")

    @property
    def name(self) -> str:
        return self.kind


class Alerts:
    """Turns transitions into outbox rows (pure; remembers which runs it paged)."""

    def __init__(self, targets: Sequence[AlertTarget], *, dashboard_url: str | None = None) -> None:
        self.targets = tuple(targets)
        self.dashboard_url = dashboard_url
        self._triggered: OrderedDict[str, None] = OrderedDict()

    def for_transition(
        self, t: Transition, at: float
    ) -> list[tuple[str, str, str, str, dict[str, Any]]]:
        """Outbox rows ``(dedupe_key, trace_id, target, action, payload)`` for one transition."""
        if not self.targets:
            return []
        if t.verdict == "stuck" or t.stop_reason is not None:
            action = "trigger"
            self._triggered[t.trace_id] = None
            while len(self._triggered) > MAX_TRIGGERED:
                self._triggered.popitem(last=False)
        elif t.previous == "stuck" and t.trace_id in self._triggered:
            action = "resolve"
            self._triggered.pop(t.trace_id, None)
        else:
            return []
        return self._rows(t.trace_id, action, self._event(t, at, action))

    def for_end(self, trace_id: str, agent: str | None, at: float) -> list[tuple[str, str, str, str, dict[str, Any]]]:
        """Resolve rows for a paged run that ended."""
        if not self.targets or trace_id not in self._triggered:
            return []
        self._triggered.pop(trace_id, None)
        event = {
            "event": "tripwire.run_ended",
            "trace_id": trace_id,
            "agent": agent,
            "at": at,
            "summary": f"run {trace_id[:12]} of {agent or 'an agent'} ended",
        }
        return self._rows(trace_id, "resolve", event)

    def _event(self, t: Transition, at: float, action: str) -> dict[str, Any]:
        what = (
            f"budget stop {t.stop_reason}" if t.stop_reason is not None else f"verdict {t.verdict}"
        )
        event: dict[str, Any] = {
            "event": "tripwire.transition",
            "action": action,
            "trace_id": t.trace_id,
            "agent": t.agent,
            "verdict": t.verdict,
            "previous": t.previous,
            "rule": t.rule,
            "stop_reason": t.stop_reason,
            "reason": t.reason,
            "at": at,
            "summary": f"{t.agent or 'agent'} run {t.trace_id[:12]}: {what}: {t.reason}"[:1000],
        }
        if self.dashboard_url:
            event["url"] = f"{self.dashboard_url.rstrip('/')}/runs/{t.trace_id}"
        return event

    def _rows(
        self, trace_id: str, action: str, event: dict[str, Any]
    ) -> list[tuple[str, str, str, str, dict[str, Any]]]:
        rows = []
        for i, target in enumerate(self.targets):
            key = f"{trace_id}:{i}:{target.kind}:{action}"
            rows.append((key, trace_id, f"{i}:{target.kind}", action, event))
        return rows


def request_for(target: AlertTarget, action: str, event: dict[str, Any]) -> dict[str, Any]:
    """The JSON body posted to ``target`` for one outbox row."""
    if target.kind == "slack":
        icon = ":rotating_light:" if action == "trigger" else ":white_check_mark:"
        text = event.get("summary", "")
        if event.get("url"):
            text += f" <{event['url']}|open>"
        return {"text": f"{icon} tripwire: {text}"}
    if target.kind == "pagerduty":
        body: dict[str, Any] = {
            "routing_key": target.routing_key,
            "event_action": action,
            "dedup_key": f"tripwire-{event['trace_id']}",
        }
        if action == "trigger":
            body["payload"] = {
                "summary": str(event.get("summary", ""))[:1024],
                "source": f"tripwire/{event.get('agent') or 'agent'}",
                "severity": "error",
                "custom_details": {
                    k: event.get(k)
                    for k in ("trace_id", "agent", "verdict", "rule", "stop_reason", "reason")
                },
            }
            if event.get("url"):
                body["links"] = [{"href": event["url"], "text": "tripwire run"}]
        return body
    return event


class Sender:
    """Delivers due outbox rows: one POST each, a timeout, backoff on failure."""

    def __init__(
        self,
        store: RunStore,
        targets: Sequence[AlertTarget],
        *,
        timeout_s: float = 5.0,
        base_delay_s: float = 1.0,
        max_delay_s: float = 300.0,
    ) -> None:
        self.store = store
        self.targets = tuple(targets)
        self.timeout_s = timeout_s
        self.base_delay_s = base_delay_s
        self.max_delay_s = max_delay_s
        self.sent = 0
        self.failed = 0

    async def deliver_due(self, now: float, client: Any) -> int:
        """Send every due row once; return how many were delivered."""
        items = await asyncio.to_thread(self.store.due_alerts, now)
        delivered = 0
        for item in items:
            index_text, _, _kind = item.target.partition(":")
            try:
                target = self.targets[int(index_text)]
            except (ValueError, IndexError):
                await asyncio.to_thread(
                    self.store.alert_failed, item.id, item.attempts + 1, None,
                    "no such alert target in this configuration", now,
                )
                continue
            body = request_for(target, item.action, item.payload)
            error: str | None = None
            try:
                response = await client.post(target.url, json=body, timeout=self.timeout_s)
                if response.status_code >= 300:
                    error = f"HTTP {response.status_code}"
            except Exception as exc:  # every transport failure is a retry, never a crash
                error = type(exc).__name__
            if error is None:
                await asyncio.to_thread(self.store.alert_done, item.id, now)
                delivered += 1
                self.sent += 1
                continue
            attempts = item.attempts + 1
            self.failed += 1
            if attempts >= MAX_ATTEMPTS:
                logger.warning(
                    "alert %s to %s given up after %d attempts: %s", item.dedupe_key, target.kind,
                    attempts, error,
                )
                await asyncio.to_thread(self.store.alert_failed, item.id, attempts, None, error, now)
            else:
                delay = min(self.base_delay_s * 2 ** (attempts - 1), self.max_delay_s)
                await asyncio.to_thread(
                    self.store.alert_failed, item.id, attempts, now + delay, error, now
                )
        return delivered
