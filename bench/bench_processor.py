"""What tripwire adds to ending one span, and how much memory one active trace holds.

Run: ``python bench/bench_processor.py [--rounds 41] [--spans 500]``

Two SDK ``TracerProvider`` objects in one process, each exporting through a
``BatchSpanProcessor`` to an exporter that drops everything:

- *bare*: ``BatchSpanProcessor(noop)``;
- *tripwire*: ``TripwireSpanProcessor(BatchSpanProcessor(noop))``.

One measured operation is what an instrumented agent does per tool call: start a span, set 4
attributes, end it. Cases: a GenAI ``execute_tool`` span with 100 B, 1 KB and 10 KB of JSON
arguments (each call's arguments differ, so the run stays ``working``, the steady state), and
a non-tool span (4 HTTP-ish attributes); and, without a target, the shape most frameworks emit
with content capture on: the 100 B tool span plus a ~100 B ``gen_ai.tool.call.result`` (5
attributes, results distinct). Rounds alternate bare/tripwire so both see the same
machine state; each round times ``--spans`` operations and reports the per-span mean, and the
summary gives the median and the interquartile range over rounds, and the ratio of the time
tripwire *adds* to the bare span's own cost.

Targets (issue 3): added ≤ 0.25x at 100 B, ≤ 0.75x at 1 KB, ≤ 0.05x for a non-tool span; the
10 KB case is bounded by the canonicalization cap (16 KiB by default).

Memory: the deep size of one trace's state after 10 tool calls at window 10 (target ≤ 2 KB,
aim 512 B), and the same figure measured with ``tracemalloc`` over 10,000 traces (which
includes the table entry).
"""

from __future__ import annotations

import argparse
import gc
import json
import random
import statistics
import sys
import time
import tracemalloc
from collections.abc import Sequence
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from tripwire.core.watch import _FIRST_WORKING, COMPILED
from tripwire.otel import KillFlags, TripwireSpanProcessor
from tripwire.testing import deep_sizeof as shared_aware_sizeof


class NoopExporter(SpanExporter):
    """Drops every span."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        pass


def _arguments(size: int, n: int) -> list[str]:
    """``n`` distinct JSON argument strings of about ``size`` bytes each."""
    out = []
    for i in range(n):
        head = json.dumps({"query": "", "page": i, "lang": "en"})
        filler = "refund policy for enterprise customers " * (size // 38 + 1)
        text = json.dumps({"query": filler[: max(0, size - len(head))], "page": i, "lang": "en"})
        out.append(text)
    return out


def _parent(rng: random.Random) -> Any:
    ctx = trace_api.SpanContext(
        trace_id=rng.getrandbits(128) or 1,
        span_id=rng.getrandbits(64) or 1,
        is_remote=False,
        trace_flags=trace_api.TraceFlags(trace_api.TraceFlags.SAMPLED),
    )
    return trace_api.set_span_in_context(trace_api.NonRecordingSpan(ctx))


def _time_tool(tracer: trace_api.Tracer, args: list[str], parent: Any) -> float:
    start_span = tracer.start_span
    t0 = time.perf_counter_ns()
    for i, a in enumerate(args):
        span = start_span("execute_tool search_docs", context=parent)
        span.set_attribute("gen_ai.operation.name", "execute_tool")
        span.set_attribute("gen_ai.tool.name", "search_docs")
        span.set_attribute("gen_ai.tool.call.id", f"call_{i}")
        span.set_attribute("gen_ai.tool.call.arguments", a)
        span.end()
    return (time.perf_counter_ns() - t0) / len(args)


def _time_tool_with_result(
    tracer: trace_api.Tracer, args: list[tuple[str, str]], parent: Any
) -> float:
    start_span = tracer.start_span
    t0 = time.perf_counter_ns()
    for i, (a, result) in enumerate(args):
        span = start_span("execute_tool search_docs", context=parent)
        span.set_attribute("gen_ai.operation.name", "execute_tool")
        span.set_attribute("gen_ai.tool.name", "search_docs")
        span.set_attribute("gen_ai.tool.call.id", f"call_{i}")
        span.set_attribute("gen_ai.tool.call.arguments", a)
        span.set_attribute("gen_ai.tool.call.result", result)
        span.end()
    return (time.perf_counter_ns() - t0) / len(args)


def _results(n: int) -> list[str]:
    """``n`` distinct results of about 100 B (distinct without their digits, as digests see)."""
    letters = "abcdefghijklmnopqrstuvwxyz"
    return [
        f"Found 2 documents about refunds: policy-{letters[i % 26]}{letters[i // 26 % 26]}"
        f"{letters[i // 676 % 26]}.md, faq.md (updated 2026-11-30)"
        for i in range(n)
    ]


def _time_other(tracer: trace_api.Tracer, n: int, parent: Any) -> float:
    start_span = tracer.start_span
    t0 = time.perf_counter_ns()
    for i in range(n):
        span = start_span("GET /v1/docs", context=parent)
        span.set_attribute("http.request.method", "GET")
        span.set_attribute("url.path", "/v1/docs")
        span.set_attribute("http.response.status_code", 200)
        span.set_attribute("server.port", 8000 + (i & 7))
        span.end()
    return (time.perf_counter_ns() - t0) / n


def _provider(wrap: bool) -> tuple[TracerProvider, TripwireSpanProcessor | None]:
    provider = TracerProvider()
    batch = BatchSpanProcessor(NoopExporter())
    if wrap:
        tw = TripwireSpanProcessor(batch, flags=KillFlags())
        provider.add_span_processor(tw)
        return provider, tw
    provider.add_span_processor(batch)
    return provider, None


def _iqr(values: list[float]) -> float:
    q = statistics.quantiles(values, n=4)
    return q[2] - q[0]


def bench_spans(rounds: int, spans: int) -> dict[str, dict[str, float]]:
    bare_p, _ = _provider(False)
    tw_p, tw = _provider(True)
    bare_t = bare_p.get_tracer("bench")
    tw_t = tw_p.get_tracer("bench")
    rng = random.Random(7)
    cases: dict[str, Any] = {
        "tool 100 B": _arguments(100, spans),
        "tool 1 KB": _arguments(1024, spans),
        "tool 10 KB": _arguments(10 * 1024, spans),
        "non-tool": None,
        "tool+result": list(zip(_arguments(100, spans), _results(spans), strict=True)),
    }
    results: dict[str, dict[str, float]] = {}
    for name, args in cases.items():
        bare: list[float] = []
        wrapped: list[float] = []
        for r in range(rounds + 2):
            order = [(bare_t, bare), (tw_t, wrapped)]
            if r % 2:
                order.reverse()
            for tracer, sink in order:
                parent = _parent(rng)
                gc.disable()
                try:
                    if args is None:
                        cost = _time_other(tracer, spans, parent)
                    elif name == "tool+result":
                        cost = _time_tool_with_result(tracer, args, parent)
                    else:
                        cost = _time_tool(tracer, args, parent)
                finally:
                    gc.enable()
                if r >= 2:  # two warm-up rounds
                    sink.append(cost)
        b, w = statistics.median(bare), statistics.median(wrapped)
        results[name] = {
            "bare_ns": b,
            "bare_iqr": _iqr(bare),
            "tripwire_ns": w,
            "tripwire_iqr": _iqr(wrapped),
            "added_ratio": (w - b) / b,
        }
    assert tw is not None
    if tw.stats.internal_errors or tw.stats.flags_raised:
        raise SystemExit(f"unexpected: {tw.stats}")
    bare_p.shutdown()
    tw_p.shutdown()
    return results


def bench_memory() -> dict[str, float]:
    provider = TracerProvider()
    tw = TripwireSpanProcessor(flags=KillFlags())
    provider.add_span_processor(tw)
    tracer = provider.get_tracer("bench")
    rng = random.Random(11)

    def one_trace() -> int:
        parent = _parent(rng)
        for i in range(10):
            span = tracer.start_span("execute_tool search_docs", context=parent)
            span.set_attribute("gen_ai.operation.name", "execute_tool")
            span.set_attribute("gen_ai.tool.name", "search_docs")
            span.set_attribute("gen_ai.tool.call.id", f"call_{rng.getrandbits(48):012x}")
            span.set_attribute("gen_ai.tool.call.arguments", json.dumps({"query": f"q{i}"}))
            span.end()
        return int(trace_api.get_current_span(parent).get_span_context().trace_id)

    tid = one_trace()
    run = tw.engine._runs[tid]  # the engine keeps the per-trace state
    # What one more active trace costs: leave out what every trace shares with the process
    # (the policy and normalizer, their version strings, the constant working reason, the
    # first "working" verdict every run shares, the tool name interned by the span).
    shared = (
        tw.policy,
        tw.normalizer,
        tw.policy.version,
        tw.normalizer.version,
        "no loop rule tripped",
        *_FIRST_WORKING.values(),
        "search_docs",
    )
    per_trace_deep = shared_aware_sizeof(run, exclude=shared)
    tw.end_run(tid)

    n = 10_000
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(n):
        one_trace()
    gc.collect()
    after = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert len(tw) == n, len(tw)
    provider.shutdown()
    return {"deep_sizeof_bytes": per_trace_deep, "tracemalloc_bytes": (after - before) / n}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=41)
    parser.add_argument("--spans", type=int, default=500)
    opts = parser.parse_args()

    targets = {
        "tool 100 B": 0.25,
        "tool 1 KB": 0.75,
        "tool 10 KB": None,
        "non-tool": 0.05,
        "tool+result": None,
    }
    accelerator = "compiled accelerator" if COMPILED else "pure Python (no accelerator)"
    print(
        f"python {sys.version.split()[0]}, {accelerator}; "
        f"{opts.rounds} rounds x {opts.spans} spans per case"
    )
    print(
        f"{'case':<12} {'bare ns':>9} {'± IQR':>7} {'tripwire ns':>12} {'± IQR':>7}"
        f" {'added':>7} {'target':>7}"
    )
    for name, r in bench_spans(opts.rounds, opts.spans).items():
        target = targets[name]
        verdict = "" if target is None else ("ok" if r["added_ratio"] <= target else "MISS")
        tgt = ("cap" if name == "tool 10 KB" else "-") if target is None else f"≤{target:.2f}x"
        print(
            f"{name:<12} {r['bare_ns']:>9.0f} {r['bare_iqr']:>7.0f} {r['tripwire_ns']:>12.0f}"
            f" {r['tripwire_iqr']:>7.0f} {r['added_ratio']:>6.2f}x {tgt:>7} {verdict}"
        )
    mem = bench_memory()
    print(
        f"per active trace at window 10 (10 calls with call ids): deep sizeof, shared values "
        f"excluded, "
        f"{mem['deep_sizeof_bytes']:.0f} B; tracemalloc over 10,000 traces "
        f"{mem['tracemalloc_bytes']:.0f} B (target ≤ 2048 B, aim 512 B)"
    )


if __name__ == "__main__":
    main()
