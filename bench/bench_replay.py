"""Benchmark: ``tripwire replay --json`` over one OTLP/JSON file of 100,000 GenAI tool spans in
10,000 traces (target: at least 100,000 spans/s end to end, the CLI's start-up included).

Generates mixed traces (varied work, a stuck repetition, an A B C cycle, polling with changing
results) as OTLP/JSON files in a temporary directory, then times, in the same run:

- the library: ``tripwire.replay.engine.replay_traces`` (read + map + replay);
- the CLI end to end: ``tripwire replay DIR --json > /dev/null`` in a subprocess, in one
  process (``--workers 1``) and with the default (one per CPU, at most 4);
- a naive baseline: stdlib ``json`` and a detector that rebuilds a ``Counter`` over the last
  10 calls at every call (same tool + arguments 4 times in 10).

The CLI runs and the baseline are interleaved over ``--rounds`` rounds and reported as medians.
tripwire's bytecode is compiled first, as ``pip install`` does.

Run: ``python bench/bench_replay.py [--spans 100000] [--files 1] [--per-trace 10] [--rounds 3]
[--profile]``.
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import random
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter, defaultdict
from pathlib import Path

TARGET_RATE = 100_000


def _attr(key: str, value: str) -> dict[str, object]:
    return {"key": key, "value": {"stringValue": value}}


def _tool_span(
    rng: random.Random,
    trace_id: str,
    parent: str,
    t0: int,
    tool: str,
    args: dict[str, object],
    result: str,
) -> dict[str, object]:
    return {
        "traceId": trace_id,
        "spanId": f"{rng.getrandbits(64):016x}",
        "parentSpanId": parent,
        "name": f"execute_tool {tool}",
        "kind": 1,
        "startTimeUnixNano": str(t0),
        "endTimeUnixNano": str(t0 + 200_000_000),
        "attributes": [
            _attr("gen_ai.operation.name", "execute_tool"),
            _attr("gen_ai.tool.name", tool),
            _attr("gen_ai.tool.call.id", f"call_{rng.getrandbits(48):012x}"),
            _attr("gen_ai.tool.call.arguments", json.dumps(args)),
            _attr("gen_ai.tool.call.result", result),
        ],
        "status": {},
    }


def _trace(rng: random.Random, kind: str, calls: int) -> list[dict[str, object]]:
    trace_id = f"{rng.getrandbits(128):032x}"
    root = f"{rng.getrandbits(64):016x}"
    t = 1_700_000_000_000_000_000 + rng.randrange(10**12)
    spans: list[dict[str, object]] = [
        {
            "traceId": trace_id,
            "spanId": root,
            "name": "invoke_agent bench",
            "startTimeUnixNano": str(t),
            "endTimeUnixNano": str(t + calls * 10**9),
            "attributes": [
                _attr("gen_ai.operation.name", "invoke_agent"),
                _attr("gen_ai.agent.name", "bench"),
            ],
            "status": {},
        }
    ]
    for i in range(calls):
        t += 1_000_000_000
        if kind == "stuck" and i >= calls // 2:
            tool, args, result = "search_docs", {"query": "refund policy"}, "no results"
        elif kind == "cycle" and i >= calls // 2:
            step = i % 3
            tool, args, result = (
                ("open", "read", "close")[step],
                {"path": "/tmp/a", "step": step},
                "ok",
            )
        elif kind == "polling":
            tool, args, result = "job_status", {"job": "42"}, f"running {i}"
        else:
            tool = rng.choice(("search_docs", "fetch_page", "read_file", "run_tests"))
            args, result = {"q": f"item {i} {rng.random():.6f}", "page": i}, f"result {i}"
        spans.append(_tool_span(rng, trace_id, root, t, tool, args, result))
    return spans


def generate(directory: Path, total_spans: int, files: int, seed: int = 7, per_trace: int = 10) -> int:
    """Write OTLP/JSON files holding ``total_spans`` tool spans; return the tool span count."""
    rng = random.Random(seed)
    kinds = ("varied", "varied", "stuck", "cycle", "polling")
    traces = [
        _trace(rng, kinds[i % len(kinds)], per_trace) for i in range(total_spans // per_trace)
    ]
    per_file = max(1, len(traces) // files)
    written = 0
    for n in range(0, len(traces), per_file):
        spans = [s for tr in traces[n : n + per_file] for s in tr]
        written += sum(1 for s in spans if str(s["name"]).startswith("execute_tool"))
        body = {
            "resourceSpans": [
                {
                    "resource": {"attributes": [_attr("service.name", "bench")]},
                    "scopeSpans": [{"scope": {"name": "bench"}, "spans": spans}],
                }
            ]
        }
        (directory / f"traces-{n // per_file:04d}.json").write_text(json.dumps(body))
    return written


def naive(directory: Path) -> int:
    """stdlib json + a Counter rebuilt over the last 10 calls at every call; returns stuck traces."""
    by_trace: dict[str, list[tuple[int, str, str]]] = defaultdict(list)
    for path in sorted(directory.glob("*.json")):
        data = json.loads(path.read_text())
        for rs in data["resourceSpans"]:
            for ss in rs["scopeSpans"]:
                for sp in ss["spans"]:
                    attrs = {kv["key"]: kv["value"].get("stringValue") for kv in sp["attributes"]}
                    if attrs.get("gen_ai.operation.name") == "execute_tool":
                        by_trace[sp["traceId"]].append(
                            (
                                int(sp["startTimeUnixNano"]),
                                attrs["gen_ai.tool.name"] or "",
                                attrs.get("gen_ai.tool.call.arguments") or "",
                            )
                        )
    stuck = 0
    for calls in by_trace.values():
        calls.sort()
        keys = [(tool, json.dumps(json.loads(args), sort_keys=True)) for _, tool, args in calls]
        for i in range(len(keys)):
            if Counter(keys[max(0, i - 9) : i + 1]).most_common(1)[0][1] >= 4:
                stuck += 1
                break
    return stuck


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spans", type=int, default=100_000)
    parser.add_argument("--files", type=int, default=1)
    parser.add_argument("--per-trace", type=int, default=10, help="tool calls per trace")
    parser.add_argument("--profile", action="store_true", help="profile the library run")
    parser.add_argument("--rounds", type=int, default=3, help="CLI and baseline runs (medians)")
    args = parser.parse_args()
    note = _bytecode()

    from tripwire.replay.engine import replay_traces

    with tempfile.TemporaryDirectory(prefix="tripwire-bench-") as tmp:
        d = Path(tmp)
        n = generate(d, args.spans, args.files, per_trace=args.per_trace)
        size = sum(p.stat().st_size for p in d.iterdir())
        print(f"{n:,} tool spans in {args.files} OTLP/JSON files ({size / 2**20:.1f} MiB); {note}")

        t0 = time.perf_counter()
        if args.profile:
            prof = cProfile.Profile()
            prof.enable()
        results = list(replay_traces(d))
        if args.profile:
            prof.disable()
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        lib_s = time.perf_counter() - t0
        stuck = sum(1 for r in results if r.first_trip is not None)

        cli: dict[str, list[tuple[float, float]]] = {"1": [], "0": []}
        naive_times: list[float] = []
        codes: set[int] = set()
        for _ in range(args.rounds):  # interleaved, so that a slow spell of the machine hits both
            for workers in cli:
                seconds, cpu, code = _cli(d, workers)
                cli[workers].append((seconds, cpu))
                codes.add(code)
            t0 = time.perf_counter()
            naive_stuck = naive(d)
            naive_times.append(time.perf_counter() - t0)

    def rate(s: float) -> str:
        return f"{n / s:,.0f} spans/s"

    print(
        f"library replay_traces : {lib_s:6.2f} s  ({rate(lib_s)}; {len(results)} traces, {stuck} tripped)"
    )
    workers = _auto_workers()
    medians = {}
    for key, label in (("1", "--workers 1"), ("0", f"default ({workers} proc.)")):
        seconds = statistics.median(t for t, _ in cli[key])
        cpu = statistics.median(c for _, c in cli[key])
        medians[key] = seconds
        print(
            f"CLI {label:18}: {seconds:6.2f} s  ({rate(seconds)}; {cpu:.2f} s of CPU, "
            f"{rate(cpu)} of CPU; median of {args.rounds})"
        )
    naive_s = statistics.median(naive_times)
    print(
        f"naive baseline        : {naive_s:6.2f} s  ({rate(naive_s)}; {naive_stuck} tripped, repetition only)"
    )
    print(f"ratios: naive / CLI one process {naive_s / medians['1']:.2f}x, "
          f"naive / CLI default {naive_s / medians['0']:.2f}x, one / default {medians['1'] / medians['0']:.2f}x"
          + ("" if codes == {0} else f"; CLI exit codes {sorted(codes)}"))
    verdict = "OK" if n / medians["0"] >= TARGET_RATE else "UNDER TARGET: profile with --profile"
    print(f"target >= {TARGET_RATE:,} spans/s end to end (CLI, default options): {verdict}")


def _cli(directory: Path, workers: str) -> tuple[float, float, int]:
    """One ``tripwire replay DIR --json`` run: wall seconds, CPU seconds (its workers too), exit."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-c", "from tripwire.cli import main; main()", "replay", str(directory), "--json"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=dict(os.environ, NO_COLOR="1", TRIPWIRE_WORKERS=workers),
    )
    seconds = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        print(proc.stderr, file=sys.stderr)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return seconds, cpu, proc.returncode


def _auto_workers() -> int:
    return min(4, len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") else 1


def _bytecode() -> str:
    """Compile tripwire's bytecode, as ``pip install`` does, so that start-up is what an installed
    CLI pays even where ``PYTHONDONTWRITEBYTECODE`` is set (it stops caching, not reading)."""
    import compileall

    import tripwire

    compileall.compile_dir(Path(tripwire.__file__).parent, quiet=1)
    return "bytecode compiled beforehand"


if __name__ == "__main__":
    main()
