"""Per-call overhead of the run guard: ``before_tool`` + ``after_tool`` in-process, beside a
naive dict-of-counters guard measured in the same run, and the Redis ledger round trip.

Run: ``python bench/bench_guard.py`` (Redis part needs 127.0.0.1:6379; skipped if absent).
Prints the median and the spread (p10–p90) of per-call microseconds over repeated rounds.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
import uuid
from collections.abc import Callable

from tripwire.core.budget import Limits
from tripwire.core.results import ToolResult
from tripwire.guard import Guard

ROUNDS = 25
CALLS = 2_000
TOOLS = ["search_docs", "read_file", "run_sql", "fetch_url"]
ARGS = [{"query": f"refund policy {i % 37}", "page": i % 5, "timestamp": i} for i in range(CALLS)]
JSON_ARGS = [json.dumps({"query": f"refund policy {i % 37}", "page": i % 5}) for i in range(CALLS)]
RESULT = ToolResult.success("a short result string")


class NaiveGuard:
    """The baseline: a dict of counters and a cap check, nothing else."""

    def __init__(self, max_tool_calls: int) -> None:
        self.max_tool_calls = max_tool_calls
        self.counts: dict[str, int] = {}
        self.total = 0

    def before_tool(self, tool: str, args: object) -> None:
        if self.total + 1 > self.max_tool_calls:
            raise RuntimeError("over budget")
        self.total += 1
        self.counts[tool] = self.counts.get(tool, 0) + 1

    def after_tool(self, tool: str, args: object, result: object) -> None:
        pass


def per_call_us(
    make: Callable[[], object], calls: int = CALLS, args_list: list[object] | None = None
) -> list[float]:
    arg_rows = args_list if args_list is not None else ARGS
    out = []
    for _ in range(ROUNDS):
        guard = make()
        before = guard.before_tool  # type: ignore[attr-defined]
        after = guard.after_tool  # type: ignore[attr-defined]
        t0 = time.perf_counter()
        for i in range(calls):
            tool = TOOLS[i & 3]
            args = arg_rows[i]
            before(tool, args)
            after(tool, args, RESULT)
        out.append((time.perf_counter() - t0) / calls * 1e6)
    return out


def show(name: str, samples: list[float]) -> None:
    q = statistics.quantiles(samples, n=10)
    print(
        f"{name:<44} median {statistics.median(samples):7.2f} µs   p10–p90 {q[0]:6.2f}–{q[-1]:6.2f}"
    )


def main() -> int:
    import argparse

    argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0]).parse_args()
    limits = Limits(max_tool_calls=10**9, tool_caps={"run_sql": 10**9}, max_duplicate_calls=10**9)
    print(f"{ROUNDS} rounds × {CALLS} tool calls (before_tool + after_tool per call)")
    show("naive dict-of-counters guard", per_call_us(lambda: NaiveGuard(10**9)))
    show("Guard, no limits, loop watcher off", per_call_us(lambda: Guard(loop_policy=None)))
    show(
        "Guard, caps + duplicates, loop watcher off",
        per_call_us(lambda: Guard(limits, loop_policy=None)),
    )
    show("Guard, caps + duplicates + loop watcher", per_call_us(lambda: Guard(limits)))
    show(
        "  same, arguments as JSON text (LLM tool calls)",
        per_call_us(lambda: Guard(limits), args_list=list(JSON_ARGS)),
    )

    try:
        from tripwire.store.redis import RedisLedger, connect

        client = connect(timeout_s=0.5)
        client.ping()
    except Exception as exc:  # a benchmark, not library code: report and go on
        print(f"Redis part skipped: {type(exc).__name__}: {exc}")
        return 0
    prefix = f"tripwire-bench:{uuid.uuid4().hex}"
    ledger = RedisLedger(client, prefix=prefix, ttl_s=60)
    try:
        show(
            "Guard + RedisLedger (one round trip per call)",
            per_call_us(lambda: Guard(limits, ledger=ledger), calls=300),
        )
        rtts = []
        for _ in range(ROUNDS):
            t0 = time.perf_counter()
            for _ in range(200):
                client.ping()
            rtts.append((time.perf_counter() - t0) / 200 * 1e6)
        show("Redis PING round trip (reference)", rtts)
    finally:
        keys = list(client.scan_iter(match=f"{prefix}:*"))
        if keys:
            client.delete(*keys)
    return 0


if __name__ == "__main__":
    sys.exit(main())
