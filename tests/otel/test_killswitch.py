"""The in-process kill flag registry and tripwire.otel.check()."""

from __future__ import annotations

import pickle
import threading
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import TracerProvider

import tripwire.otel as tw
from tripwire.core.reasons import Rule, Verdict
from tripwire.core.watch import Assessment
from tripwire.errors import ConfigError, LoopDetected, RunStopped
from tripwire.otel import killswitch

STUCK = Assessment(
    verdict=Verdict.STUCK, rule=Rule.PERIOD, tool="fetch_page", digest="ab" * 16, hits=3,
    period=2, window=10, call_index=6, reason="a cycle of 2 calls",
)  # fmt: skip


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def global_flags() -> Iterator[tw.KillFlags]:
    tw.KILL_FLAGS.clear_all()
    yield tw.KILL_FLAGS
    tw.KILL_FLAGS.clear_all()


def test_check_raises_loop_detected_with_the_assessments_fields() -> None:
    flags = tw.KillFlags()
    flags.raise_flag(0xABC, STUCK)
    with pytest.raises(LoopDetected) as info:
        flags.check(0xABC)
    exc = info.value
    assert isinstance(exc, RunStopped)
    assert (exc.rule, exc.tool, exc.hits, exc.window, exc.period, exc.call_index, exc.digest) == (
        Rule.PERIOD, "fetch_page", 3, 10, 2, 6, "ab" * 16,
    )  # fmt: skip
    assert pickle.loads(pickle.dumps(exc)).call_index == 6


def test_trace_ids_as_int_or_hex_are_the_same_run() -> None:
    flags = tw.KillFlags()
    flags.raise_flag(f"{0xABC:032x}", STUCK)
    with pytest.raises(LoopDetected):
        flags.check(0xABC)
    assert 0xABC in flags and f"{0xABC:032x}" in flags
    assert flags.clear(0xABC)
    assert not flags.clear(0xABC)
    flags.check(0xABC)


def test_check_reads_the_current_span(global_flags: tw.KillFlags) -> None:
    tracer = TracerProvider().get_tracer("t")
    tw.check()  # outside any span: nothing to check
    with tracer.start_as_current_span("run") as span:
        tw.check()
        global_flags.raise_flag(span.get_span_context().trace_id, STUCK)
        with pytest.raises(LoopDetected), tracer.start_as_current_span("step"):
            tw.check()
    with tracer.start_as_current_span("another run"):
        tw.check()  # a different trace is not affected


def test_flags_are_bounded_oldest_first() -> None:
    flags = tw.KillFlags(max_flags=3)
    for tid in range(1, 6):
        flags.raise_flag(tid, STUCK)
    assert len(flags) == 3
    assert [tid for tid in range(1, 6) if tid in flags] == [3, 4, 5]


def test_flags_expire_after_the_ttl() -> None:
    clock = FakeClock()
    flags = tw.KillFlags(ttl_s=60, clock=clock)
    flags.raise_flag(7, STUCK)
    clock.now += 59
    with pytest.raises(LoopDetected):
        flags.check(7)
    clock.now += 2
    flags.check(7)
    assert len(flags) == 0


def test_concurrent_writers_keep_the_bound() -> None:
    flags = tw.KillFlags(max_flags=100)

    def writer(base: int) -> None:
        for i in range(2000):
            flags.raise_flag(base + i, STUCK)
            flags.get(base + i - 1)

    threads = [threading.Thread(target=writer, args=(k * 10_000,)) for k in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(flags) == 100


@pytest.mark.parametrize("bad", ["not-hex", 1.5, None, b"00"])
def test_bad_trace_ids_are_config_errors(bad: object) -> None:
    with pytest.raises(ConfigError) as info:
        tw.KillFlags().clear(bad)  # type: ignore[arg-type]
    assert info.value.field == "trace_id"


@pytest.mark.parametrize(("kw", "field"), [({"max_flags": 0}, "max_flags"), ({"ttl_s": 0}, "ttl_s")])
def test_bad_settings(kw: dict[str, float], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        tw.KillFlags(**kw)  # type: ignore[arg-type]
    assert info.value.field == field


# -- check() where no span is current; nudge, then kill ------------------------------------------


def _tool_span_ended(provider: TracerProvider, query: str, parent: Any = None) -> None:
    tracer = provider.get_tracer("t")
    span = tracer.start_span(
        "execute_tool search_docs",
        context=trace_api.set_span_in_context(parent) if parent is not None else None,
        attributes={
            "gen_ai.operation.name": "execute_tool",
            "gen_ai.tool.name": "search_docs",
            "gen_ai.tool.call.arguments": f'{{"query": "{query}"}}',
        },
    )
    span.end()  # ended without ever being made current (as OpenInference's LangChain tracer)


def test_check_without_a_current_span_finds_the_run_that_last_started_here(
    global_flags: tw.KillFlags, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(killswitch, "_warned_no_run", False)  # warned once per process
    provider = TracerProvider()
    provider.add_span_processor(tw.TripwireSpanProcessor())
    root = provider.get_tracer("t").start_span("agent")  # never made current
    trace_id = root.get_span_context().trace_id
    for _ in range(4):
        _tool_span_ended(provider, "refund policy", root)
    assert global_flags.get(trace_id) is not None
    assert not trace_api.get_current_span().get_span_context().is_valid
    with pytest.raises(LoopDetected):
        tw.check()
    results: list[BaseException | None] = []

    def other_thread() -> None:  # a thread where no run started: nothing to find
        try:
            with pytest.warns(RuntimeWarning, match="found no current span"):
                tw.check()
            results.append(None)
        except BaseException as exc:
            results.append(exc)

    t = threading.Thread(target=other_thread)
    t.start()
    t.join()
    assert results == [None]
    root.end()
    provider.shutdown()


def test_a_lowered_flag_goes_up_again_at_the_next_repeated_call(
    global_flags: tw.KillFlags,
) -> None:
    """Nudge, then kill: clear() after nudging; a run that keeps repeating is flagged again at
    its next repeated call, one that changed approach is not."""
    provider = TracerProvider()
    provider.add_span_processor(tw.TripwireSpanProcessor())
    tracer = provider.get_tracer("t")
    for obeys in (False, True):
        with tracer.start_as_current_span("agent") as root:
            trace_id = root.get_span_context().trace_id
            for _ in range(4):
                _tool_span_ended(provider, "refund policy")
            assert tw.clear(trace_id)  # the runtime nudged the model and lowered the flag
            tw.check()
            _tool_span_ended(provider, "refund window" if obeys else "refund policy")
            if obeys:
                tw.check()  # a different call: the run goes on
            else:
                with pytest.raises(LoopDetected):
                    tw.check()
    provider.shutdown()
