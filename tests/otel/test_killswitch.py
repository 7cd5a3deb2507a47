"""The in-process kill flag registry and tripwire.otel.check()."""

from __future__ import annotations

import pickle
import threading
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider

import tripwire.otel as tw
from tripwire.core.reasons import Rule, Verdict
from tripwire.core.watch import Assessment
from tripwire.errors import ConfigError, LoopDetected, RunStopped

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
