"""``tripwire serve``: one service that watches a whole fleet of agents through their traces.

It receives OTLP/HTTP from any OpenTelemetry exporter or Collector, runs the same loop and
budget detection per trace as the in-process span processor, raises the run's kill flag (Redis
pub/sub and a key, or the run store) so the agent stops at its next step, pages on transitions,
records every run with its stop receipt, and exposes Prometheus metrics. See docs/serve.md.

Needs the ``serve`` extra: ``pip install 'tripwire[serve]'``.
"""

from __future__ import annotations

from tripwire.serve.app import GC_YOUNG, ServeConfig, Service, create_app, tune_gc

__all__ = ["GC_YOUNG", "ServeConfig", "Service", "create_app", "tune_gc"]
