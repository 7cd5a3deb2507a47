"""What obeying the fleet costs an agent's step: ``RunControl.before_model()`` and
``before_tool()`` with the fleet check (``obey_fleet``) against the same calls without it.

Three settings, each inside a run span (the OpenTelemetry SDK's): no kill channel; the URL
channel named (to a port nothing listens on: the check never touches the network); and a flag
up for another run. CPU time per step (one ``before_model`` + one ``before_tool``), median of 5
rounds of 20,000 steps, the two variants alternated in one process.

    python bench/bench_obey_fleet.py
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from opentelemetry.sdk.trace import TracerProvider

import tripwire.remote as remote
from tripwire.core.budget import Limits
from tripwire.integrations import _common, new_run
from tripwire.otel import killswitch

STEPS = 20_000
ROUNDS = 5


def _steps(obey: bool) -> float:
    run = new_run(Limits(), loop_policy=None, prices=None)
    if not obey:
        run.obey_fleet = lambda: None  # type: ignore[method-assign]
    args: dict[str, Any] = {"query": "x"}
    started = time.process_time()
    for _ in range(STEPS):
        run.before_model()
        run.before_tool("search_docs", args)
    return (time.process_time() - started) / STEPS * 1e6


def _measure(label: str) -> None:
    with_check: list[float] = []
    without: list[float] = []
    for _ in range(ROUNDS):
        without.append(_steps(False))
        with_check.append(_steps(True))
    a, b = statistics.median(without), statistics.median(with_check)
    print(f"{label:<34} without {a:6.2f} µs/step   with {b:6.2f} µs/step   (+{b - a:.2f} µs)")


def main() -> None:
    assert _common._current_span is not None, "needs the otel extra"
    tracer = TracerProvider().get_tracer("bench")
    with tracer.start_as_current_span("invoke_agent bench"):
        remote.disconnect()
        _measure("no kill channel")
        remote.connect(url="http://127.0.0.1:9", token="t", poll_s=60)  # nothing listens
        _measure("URL channel named")
        killswitch.KILL_FLAGS.raise_flag("ab" * 16, killswitch.Stop(
            reason=killswitch.StopReason.USER_CANCELLED, limit_name="operator", limit=0,
            observed=0, counter="operator", used=0, message="another run",
        ))  # fmt: skip
        _measure("URL channel + another run flagged")
        killswitch.KILL_FLAGS.clear_all()
        remote.disconnect()


if __name__ == "__main__":
    main()
