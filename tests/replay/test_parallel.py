"""Replay in several processes (``replay_all(workers=n)``): the same results as in one, in the
same order, whatever the input holds; and a worker that dies costs nothing but time.

Each process reads the whole input and replays every n-th trace, so what is tested here is
what could come apart: traces whose spans are spread over files, duplicates, empty traces,
problems counted once, and the merge back into order of first appearance.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from replay_otlp import agent_span, distinct, dumps, repeated, request, tool_span, trace_id

from tripwire.core.policy import LoopPolicy
from tripwire.core.reasons import Verdict
from tripwire.errors import ConfigError
from tripwire.replay import engine
from tripwire.replay.engine import PARALLEL_MIN_BYTES, replay_all, replay_traces
from tripwire.replay.reader import read_spans

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="fork-based workers are Linux-only")


def _mixed(d: Path, *, problem_first: bool = False) -> list[str]:
    """Four files of 24 traces, most of them spread over two files, and a file that is not
    OTLP (read first, or last); the trace ids in order of first appearance.

    The first file is read before the other processes start (they share it in memory), the
    others by every process."""
    d.mkdir()
    first: list[list[dict]] = [[], [], [], []]
    second: list[list[dict]] = [[], [], [], []]
    for t in range(1, 25):
        if t % 6 == 0:
            spans = [agent_span(t, 1, "idle")]  # no tool call at all
        elif t % 3 == 0:
            spans = repeated(t, 9)  # a loop
        elif t % 4 == 1:
            spans = [agent_span(t, 1, "poller")] + [
                tool_span(t, 100 + i, "job_status", {"id": 7}, at=i + 1, result=f"step {i // 2}")
                for i in range(10)
            ]
        else:
            spans = distinct(t, 7)
        half = len(spans) // 2
        f = t % 4
        first[f] += spans[:half]
        second[(f + 1) % 4] += spans[half:]
    # A span exported twice, and a call reported twice under one call id.
    first[0].append(tool_span(5, 100, "search_docs", {"query": "topic 0"}, at=1))
    first[2] += [
        tool_span(30, 10, "fetch", {"u": 1}, at=1, call_id="c1"),
        tool_span(30, 11, "fetch", {"u": 1}, at=2, call_id="c1"),
    ]
    for k in range(4):
        (d / f"part-{k}.json").write_text(dumps(request(first[k], second[k])))
    labels = "a-labels.json" if problem_first else "z-labels.json"
    (d / labels).write_text('{"not": "otlp"}')  # a problem, found by the walk
    seen: list[str] = []
    for view in read_spans([d]):
        if view.trace_id not in seen:
            seen.append(view.trace_id)
    assert len(seen) == 25 and seen != sorted(seen)  # the fixture interleaves the traces
    return seen


@pytest.mark.parametrize(("workers", "problem_first"), [(2, False), (3, False), (5, False), (2, True)])
def test_the_results_are_those_of_one_process_in_the_same_order(
    tmp_path: Path, workers: int, problem_first: bool
) -> None:
    d = tmp_path / "traces"
    ids = _mixed(d, problem_first=problem_first)
    one = replay_all([d], LoopPolicy(), workers=1)
    many = replay_all([d], LoopPolicy(), workers=workers)
    assert one.workers == 1 and many.workers == workers
    assert [r.trace_id for r in one.results] == ids
    assert many.results == one.results
    assert (many.traces, many.files, many.spans, many.duplicates) == (25, 5, one.spans, 2)
    assert one.duplicates == 2
    assert many.stats == one.stats
    assert many.problems == one.problems and len(many.problems) == 1  # counted once, not n times
    verdicts = {r.verdict for r in many.results}
    assert Verdict.STUCK in verdicts and Verdict.WORKING in verdicts


def test_skip_empty_and_more_processes_than_traces(tmp_path: Path) -> None:
    d = tmp_path / "few"
    d.mkdir()
    (d / "a.json").write_text(dumps(request(repeated(1, 8), [agent_span(2, 1, "idle")])))
    (d / "b.json").write_text(dumps(request(distinct(3, 5))))
    one = replay_all(d, LoopPolicy(), workers=1, skip_empty=True)
    many = replay_all(d, LoopPolicy(), workers=3, skip_empty=True)
    assert [r.trace_id for r in many.results] == [trace_id(1), trace_id(3)]
    assert many.results == one.results
    assert many.traces == one.traces == 3
    # Four processes for three traces: each share is a trace or nothing.
    capped = replay_all(d, LoopPolicy(), workers=4)
    assert capped.workers == 4
    assert [r.trace_id for r in capped.results] == [trace_id(1), trace_id(2), trace_id(3)]


def test_a_generator_of_paths_is_read_once_and_whole(tmp_path: Path) -> None:
    d = tmp_path / "traces"
    _mixed(d)
    paths = sorted(d.iterdir())
    for workers in (1, 2):
        got = replay_all((p for p in paths), LoopPolicy(), workers=workers)
        assert got.traces == 25 and got.workers == workers


def test_replay_traces_takes_workers(tmp_path: Path) -> None:
    d = tmp_path / "traces"
    _mixed(d)
    problems: list = []
    assert list(replay_traces(d, workers=2, problems=problems)) == list(replay_traces(d, problems=[]))
    assert len(problems) == 1


def test_spans_stay_in_this_process(tmp_path: Path) -> None:
    d = tmp_path / "traces"
    _mixed(d)
    views = list(read_spans([d]))
    from_views = replay_all(views, LoopPolicy(), workers=3)
    assert from_views.workers == 1
    expected = replay_all([d], LoopPolicy(), workers=1).results
    assert [r.to_json() for r in from_views.results] == [r.to_json() for r in expected]


def _fallback(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    in_worker: Any,
    workers: int = 2,
) -> str:
    """Replay with ``in_worker(files, real_read_files)`` standing in for the workers' reading
    (this process reads as usual); check the result is one process's and return the warning."""
    d = tmp_path / "traces"
    _mixed(d)
    expected = replay_all([d], LoopPolicy(), workers=1)
    parent, real = os.getpid(), engine.read_files

    def read_files(files: Any, **kwargs: Any) -> Any:
        if os.getpid() != parent:
            return in_worker(files, lambda f: real(f, **kwargs))
        return real(files, **kwargs)

    monkeypatch.setattr(engine, "read_files", read_files)
    with caplog.at_level(logging.WARNING, logger="tripwire.replay"):
        got = replay_all([d], LoopPolicy(), workers=workers)
    assert got.workers == 1
    assert got.results == expected.results
    assert (got.spans, got.duplicates, got.problems) == (expected.spans, expected.duplicates, expected.problems)
    (warning,) = caplog.records  # logged once
    return warning.message


def test_a_worker_that_dies_is_replaced_by_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def killed(files: Any, read: Any) -> Any:
        os._exit(9)  # no exception, no result: what the OOM killer leaves

    message = _fallback(tmp_path, monkeypatch, caplog, killed)
    assert message == (
        "replay: a worker process failed (it ended without a result); replaying in this process alone"
    )


def test_a_worker_that_raises_is_replaced_by_this_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def failing(files: Any, read: Any) -> Any:
        raise MemoryError("no room")

    assert "MemoryError: no room" in _fallback(tmp_path, monkeypatch, caplog, failing, workers=3)


def test_processes_that_see_the_traces_in_another_order_fall_back_to_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    def reordered(files: Any, read: Any) -> Any:
        batches = list(read(files))
        for batch in batches:  # the same spans, as many traces: only their order differs
            batch.spans.reverse()
        return iter(batches)

    assert "input changed" in _fallback(tmp_path, monkeypatch, caplog, reordered)


def test_processes_that_read_different_input_fall_back_to_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    other = tmp_path / "other.json"
    other.write_text(dumps(request(repeated(77, 6))))

    def changed(files: Any, read: Any) -> Any:
        return read([(str(other), False)])  # as if the files had changed between two reads

    assert "input changed" in _fallback(tmp_path, monkeypatch, caplog, changed)


def test_what_was_printed_before_is_printed_once(tmp_path: Path) -> None:
    # Forked with unflushed output in its buffer, a worker would print it a second time.
    d = tmp_path / "traces"
    _mixed(d)
    script = (
        "import sys; from tripwire.replay.engine import replay_all\n"
        "print('before', end=''); sys.stderr.write('err-before')\n"
        f"r = replay_all([{str(d)!r}], workers=3)\n"
        "print(' after', r.workers, len(r.results))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"}  # block-buffered output
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout == "before after 3 25\n"
    assert done.stderr.count("err-before") == 1


def test_workers_zero_picks_one_per_cpu_for_large_input_only(tmp_path: Path) -> None:
    d = tmp_path / "traces"
    _mixed(d)
    small = replay_all([d], LoopPolicy(), workers=0)
    assert small.workers == 1
    big = tmp_path / "big"
    big.mkdir()
    (big / "calls.json").write_text(dumps(request(repeated(1, 8))))
    padding = big / "zz-padding.bin"
    with padding.open("wb") as f:  # a sparse file: large on disk by size, cheap to make
        f.truncate(PARALLEL_MIN_BYTES)
    got = replay_all([big], LoopPolicy(), workers=0)
    assert got.workers == min(4, len(os.sched_getaffinity(0)))
    assert [r.trace_id for r in got.results] == [trace_id(1)]
    assert len(got.problems) == 1  # the padding is not OTLP, and is said once


def test_negative_workers_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as info:
        replay_all(tmp_path, workers=-1)
    assert info.value.field == "workers"


@pytest.mark.parametrize("workers", [1, 2])
def test_progress_of_the_replay_goes_up_to_every_trace(tmp_path: Path, workers: int) -> None:
    d = tmp_path / "many"
    d.mkdir()
    spans = [tool_span(t, 100 + i, "search_docs", {"q": t}, at=i + 1) for t in range(1, 2501) for i in range(2)]
    (d / "calls.json").write_text(dumps(request(spans)))
    seen: list[tuple[int, int]] = []
    got = replay_all(d, LoopPolicy(), workers=workers, on_replayed=lambda done, total: seen.append((done, total)))
    assert got.workers == workers and len(got.results) == 2500
    assert seen[-1] == (2500, 2500)
    assert {total for _, total in seen} == {2500}
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)  # it never goes back
    assert seen[0][0] < 2500  # and says so on the way, not only at the end
