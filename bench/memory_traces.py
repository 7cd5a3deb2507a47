"""RSS while 1,000,000 distinct trace ids flow through a TripwireSpanProcessor (default caps).

Run: ``python bench/memory_traces.py [--traces 1000000] [--calls 3] [--every 100000]``

Each trace gets ``--calls`` tool spans (GenAI conventions, with call ids and ~100 B of
arguments) and **never ends** (no root span, no run boundary): the worst case, where only the
LRU cap (10,000 traces) and the idle TTL (15 min) bound the table. Every fifth trace loops (4
identical calls), so kill flags are raised too and their registry's cap is exercised.

Prints RSS every ``--every`` traces, then the spread of the readings taken after the table
reached its cap (target: within 10% of their first value).
"""

from __future__ import annotations

import argparse
import gc
import json
import resource
import sys
import time
from typing import Any

from opentelemetry import trace as trace_api
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan

from tripwire.otel import KillFlags, TripwireSpanProcessor

SAMPLED = trace_api.TraceFlags(trace_api.TraceFlags.SAMPLED)


def rss_bytes() -> int:
    """Current resident set size (Linux /proc; falls back to the peak from getrusage)."""
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * resource.getpagesize()
    except OSError:
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def tool_span(trace_id: int, i: int, args: str, res: Resource) -> ReadableSpan:
    attrs: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": "search_docs",
        "gen_ai.tool.call.id": f"call_{trace_id:x}_{i}",
        "gen_ai.tool.call.arguments": args,
    }
    return ReadableSpan(
        name="execute_tool search_docs",
        context=trace_api.SpanContext(trace_id, i + 2, False, SAMPLED),
        parent=trace_api.SpanContext(trace_id, 1, False, SAMPLED),
        attributes=attrs,
        resource=res,
        start_time=1,
        end_time=2,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--traces", type=int, default=1_000_000)
    parser.add_argument("--calls", type=int, default=3)
    parser.add_argument("--every", type=int, default=100_000)
    opts = parser.parse_args()

    flags = KillFlags()
    processor = TripwireSpanProcessor(flags=flags)  # default caps: 10,000 traces, 15 min TTL
    res = Resource.get_empty()
    filler = "refund policy for enterprise customers, " * 2
    readings: list[tuple[int, int, int]] = []
    started = time.monotonic()
    print(f"{'traces':>9} {'RSS MiB':>8} {'table':>6} {'flags':>6} {'elapsed s':>9}")
    for n in range(1, opts.traces + 1):
        tid = (n * 0x9E3779B97F4A7C15) & ((1 << 128) - 1) or 1
        looping = n % 5 == 0
        calls = 4 if looping else opts.calls
        for i in range(calls):
            query = filler if looping else f"{filler}{n}-{i}"
            processor.on_end(tool_span(tid, i, json.dumps({"query": query, "lang": "en"}), res))
        if n % opts.every == 0:
            gc.collect()
            rss = rss_bytes()
            readings.append((n, rss, len(processor)))
            print(
                f"{n:>9} {rss / 2**20:>8.1f} {len(processor):>6} {len(flags):>6}"
                f" {time.monotonic() - started:>9.1f}",
                flush=True,
            )
    steady = [rss for n, rss, size in readings if size >= processor.max_traces]
    if len(steady) >= 2:
        first, lo, hi = steady[0], min(steady), max(steady)
        drift = (hi - lo) / first
        verdict = "flat" if drift <= 0.10 else "GROWING"
        print(
            f"after the cap: RSS {lo / 2**20:.1f}..{hi / 2**20:.1f} MiB, spread {drift:.1%} "
            f"of the first reading (target <= 10%): {verdict}"
        )
    print(f"stats: {processor.stats.as_dict()}")
    if processor.stats.internal_errors:
        sys.exit(1)


if __name__ == "__main__":
    main()
