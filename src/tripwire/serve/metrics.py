"""The service's Prometheus metrics (``GET /metrics``), on a registry of its own."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

__all__ = ["Metrics"]


class Metrics:
    """Every metric of one service instance (a fresh registry, so tests can build several)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.spans_received = Counter(
            "tripwire_spans_received", "Spans received on /v1/traces (accepted).", registry=r
        )
        self.spans_rejected = Counter(
            "tripwire_spans_rejected", "Spans rejected (unreadable, or in a refused request).",
            ["why"], registry=r,
        )
        self.spans_duplicate = Counter(
            "tripwire_spans_duplicate",
            "Spans of retried export requests that were applied already (acknowledged, counted once).",
            registry=r,
        )
        self.spans_late = Counter(
            "tripwire_spans_late",
            "Spans that came after their run's root span was judged (left out: the receipt stands).",
            registry=r,
        )
        self.requests = Counter(
            "tripwire_requests", "OTLP requests by HTTP status code.", ["code"], registry=r
        )
        self.tool_calls = Counter(
            "tripwire_tool_calls_judged", "Tool calls judged by the loop watcher.", registry=r
        )
        self.transitions = Counter(
            "tripwire_verdict_transitions", "Verdict transitions by verdict and rule.",
            ["verdict", "rule"], registry=r,
        )
        self.runs = Counter(
            "tripwire_runs", "Runs ended, by stop reason.", ["stop_reason"], registry=r
        )
        self.kills = Counter(
            "tripwire_kill_flags_raised", "Kill flags raised, by stop reason.", ["reason"],
            registry=r,
        )
        self.alerts = Counter(
            "tripwire_alerts", "Alert deliveries, by outcome.", ["outcome"], registry=r
        )
        self.queue_depth = Gauge(
            "tripwire_receiver_queue_depth",
            "Requests being processed plus spans waiting in the reorder buffer.", registry=r,
        )
        self.active_traces = Gauge(
            "tripwire_active_traces", "Traces whose state the receiver holds.", registry=r
        )
        self.latency = Histogram(
            "tripwire_processing_seconds", "Time to decode and judge one OTLP request.",
            buckets=(0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5),
            registry=r,
        )
