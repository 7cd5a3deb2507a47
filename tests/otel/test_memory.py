"""Bounded memory: per-trace state ends with the run, after an idle TTL, and under an LRU cap."""

from __future__ import annotations

import json
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan

import tripwire.otel as tw
from tripwire.otel.processor import DEFAULT_IDLE_TTL_S, DEFAULT_MAX_TRACES, TripwireSpanProcessor

SAMPLED = trace_api.TraceFlags(trace_api.TraceFlags.SAMPLED)
RESOURCE = Resource.get_empty()
TOOL_ATTRS = {
    "gen_ai.operation.name": "execute_tool",
    "gen_ai.tool.name": "search_docs",
    "gen_ai.tool.call.arguments": json.dumps({"query": "refund policy"}),
}
RUN_ATTRS = {"gen_ai.operation.name": "invoke_agent"}


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def span(trace_id: int, attrs: dict[str, Any], *, root: bool = False, name: str = "s") -> ReadableSpan:
    parent = None if root else trace_api.SpanContext(trace_id, 0xFFFF, False, SAMPLED)
    return ReadableSpan(
        name=name,
        context=trace_api.SpanContext(trace_id, 0x1, False, SAMPLED),
        parent=parent,
        attributes=attrs,
        resource=RESOURCE,
        start_time=1,
        end_time=2,
    )


def processor(**kw: Any) -> TripwireSpanProcessor:
    kw.setdefault("flags", tw.KillFlags())
    return TripwireSpanProcessor(**kw)


def test_documented_defaults() -> None:
    p = processor()
    assert (DEFAULT_MAX_TRACES, DEFAULT_IDLE_TTL_S) == (10_000, 900.0)
    assert (p.max_traces, p.idle_ttl_s) == (DEFAULT_MAX_TRACES, DEFAULT_IDLE_TTL_S)


def test_root_span_end_drops_the_trace() -> None:
    p = processor()
    p.on_end(span(1, TOOL_ATTRS))
    p.on_end(span(2, TOOL_ATTRS))
    assert len(p) == 2
    p.on_end(span(1, {"http.route": "/chat"}, root=True))  # any local root
    assert len(p) == 1 and p.run_state(1) is None
    assert p.stats.runs_ended == 1


def test_remote_parent_is_a_local_root() -> None:
    p = processor()
    p.on_end(span(1, TOOL_ATTRS))
    remote = ReadableSpan(
        name="server",
        context=trace_api.SpanContext(1, 0x5, False, SAMPLED),
        parent=trace_api.SpanContext(1, 0x9, True, SAMPLED),
        attributes={},
        resource=RESOURCE,
    )
    p.on_end(remote)
    assert len(p) == 0


def test_a_sub_agent_end_restarts_the_window_and_keeps_the_flag() -> None:
    p = processor()
    for _ in range(4):
        p.on_end(span(1, TOOL_ATTRS))
    assert p.flags.get(1) is not None
    p.on_end(span(1, RUN_ATTRS, name="invoke_agent looper"))  # not a root: a sub-agent ended
    assert p.run_state(1) is None  # the loop window restarts; the root's end drops the trace
    assert p.flags.get(1) is not None


def test_idle_traces_expire_after_the_ttl() -> None:
    clock = FakeClock()
    p = processor(idle_ttl_s=60, clock=clock)
    p.on_end(span(1, TOOL_ATTRS))
    clock.now = 30
    p.on_end(span(2, TOOL_ATTRS))
    clock.now = 61  # trace 1 idle 61 s, trace 2 idle 31 s
    p.on_end(span(3, TOOL_ATTRS))  # a new trace sweeps the expired ones
    assert p.run_state(1) is None and p.run_state(2) is not None and len(p) == 2
    clock.now = 200
    assert p.evict_idle() == 2
    assert len(p) == 0
    assert p.stats.evicted_idle == 3


def test_an_expired_trace_that_comes_back_starts_afresh() -> None:
    clock = FakeClock()
    p = processor(idle_ttl_s=60, clock=clock)
    for _ in range(3):
        p.on_end(span(1, TOOL_ATTRS))
    clock.now = 100
    p.on_end(span(1, TOOL_ATTRS))  # would be the 4th identical call, but the run idled out
    assert p.flags.get(1) is None
    state = p.run_state(1)
    assert state is not None and state.calls == 1


def test_lru_cap_drops_the_least_recently_active() -> None:
    p = processor(max_traces=3)
    for tid in (1, 2, 3):
        p.on_end(span(tid, TOOL_ATTRS))
    p.on_end(span(1, TOOL_ATTRS))  # 1 is active again: 2 is now the oldest
    p.on_end(span(4, TOOL_ATTRS))
    assert [tid for tid in (1, 2, 3, 4) if p.run_state(tid) is not None] == [1, 3, 4]
    assert p.stats.evicted_lru == 1


def test_a_million_trace_ids_do_not_grow_the_table() -> None:
    """One tool span for each of 1,000,000 distinct traces that never end: the cap holds."""
    cap = 1000
    p = processor(max_traces=cap)
    base = span(1, TOOL_ATTRS)
    ctx_new = trace_api.SpanContext
    on_end = p.on_end
    largest = 0
    for tid in range(1, 1_000_001):
        base._context = ctx_new(tid, 0x1, False, SAMPLED)  # a cheap synthetic span per trace
        on_end(base)
        if not tid % 50_000:
            largest = max(largest, len(p))
    assert largest == cap and len(p) == cap
    assert p.stats.tool_calls == 1_000_000
    assert p.stats.evicted_lru == 1_000_000 - cap
    assert p.stats.internal_errors == 0


def test_huge_distinct_tool_names_are_kept_in_bounded_bytes() -> None:
    """Issue 16: 3,000 finished traces with distinct 1 MB tool names once kept 3 GB (the names
    were kept whole in flags, verdicts, budget counters and caches). Names are clipped by the
    mapping, so what a stuck trace leaves behind is bounded whatever its tool names."""
    import gc
    import tracemalloc

    from tripwire.core.budget import Limits

    flags = tw.KillFlags()
    p = TripwireSpanProcessor(flags=flags, limits=Limits(default_tool_cap=2, max_tool_calls=3))
    traces = 60
    name_bytes = 200_000

    def run(first: int) -> None:
        for t in range(first, first + traces):
            name = f"{t:08d}" + "x" * name_bytes
            attrs = {**TOOL_ATTRS, "gen_ai.tool.name": name}
            for _ in range(4):
                p.on_end(span(t + 1, attrs))
            p.on_end(span(t + 1, {}, root=True))

    run(0)  # warm: interned strings, caches at their working size
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.take_snapshot()
    run(traces)
    gc.collect()
    after = tracemalloc.take_snapshot()
    tracemalloc.stop()
    kept = sum(s.size_diff for s in after.compare_to(before, "filename"))
    assert len(flags) == 2 * traces  # every trace was flagged (the flags outlive the runs)
    flag = flags.get(traces + 1)
    assert flag is not None and flag.assessment is not None
    assert flag.assessment.tool is not None and len(flag.assessment.tool) < 300
    assert len(p) == 0
    # 60 traces x 200 KB names would be 12 MB; clipped they keep well under 1 MB
    assert kept < 1_000_000, kept
