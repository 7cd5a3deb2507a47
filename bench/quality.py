"""Detection quality on real agent runs (issue 7): tripwire's defaults vs the seed rule vs a flat cap.

Replays the labelled corpus in ``../shared/corpus`` (OTLP/JSON traces of real SWE-agent,
mini-swe-agent and tau-bench sessions; it is never shipped) with ``tripwire replay``'s engine and
prints, per label and per source, for each detector side by side:

- flagged: the share of sessions flagged ``stuck`` (with a 95% Wilson interval);
- first flag: the median position of the first flag, as a share of the session's length;
- after flag: the share of the label's tool calls that came after the first flag (what stopping
  there saves on runaways, or cuts off on healthy runs).

Detectors: ``default`` (``LoopPolicy()``, what ``tripwire replay`` uses with no options), ``seed``
(the plain repetition rule: same tool + arguments 4 times in 10 calls) and ``cap30`` (a flat cap
of 30 tool calls: a session is flagged at call 31).

Usage: ``python bench/quality.py [CORPUS_DIR]`` (default ``../shared/corpus`` next to the repo).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

from tripwire.core.policy import LoopPolicy
from tripwire.replay.engine import TraceCalls, load_traces, replay_trace

CAP = 30
LABELS = ("runaway", "healthy", "other")


@dataclass(frozen=True)
class Session:
    source: str
    label: str
    calls: int
    first_flag: int | None
    """1-based call index of the first flag, ``None`` if never flagged."""


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for k successes out of n."""
    if n == 0:
        return (0.0, 0.0)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def summarize(sessions: Iterable[Session]) -> str:
    rows = list(sessions)
    n = len(rows)
    flagged = [s for s in rows if s.first_flag is not None]
    k = len(flagged)
    lo, hi = wilson(k, n)
    positions = [s.first_flag / s.calls for s in flagged if s.first_flag is not None]
    median = f"{statistics.median(positions):.2f}" if positions else "  - "
    total = sum(s.calls for s in rows)
    after = sum(s.calls - s.first_flag for s in flagged if s.first_flag is not None)
    share_after = after / total if total else 0.0
    return f"{k:3d}/{n:<3d} {k / n if n else 0:6.1%} [{lo:5.1%}–{hi:5.1%}]  {median:>5}  {share_after:6.1%}"


def main(corpus: Path) -> int:
    labels = [
        json.loads(line) for line in (corpus / "labels.jsonl").read_text().splitlines() if line
    ]
    by_file = {str((corpus / lab["file"]).resolve()): lab for lab in labels}
    started = time.perf_counter()
    loaded = load_traces([corpus / lab["file"] for lab in labels])
    read_s = time.perf_counter() - started
    if loaded.problems:
        for problem in loaded.problems:
            print(f"input problem: {problem}", file=sys.stderr)

    traces: list[tuple[dict[str, str], TraceCalls]] = []
    for trace in loaded.traces:
        source = str(Path(trace.sources[0]).resolve()) if trace.sources else ""
        lab = by_file.get(source)
        if lab is None:
            print(f"no label for trace {trace.trace_id} ({source})", file=sys.stderr)
            continue
        traces.append((lab, trace))

    def loop_detector(policy: LoopPolicy) -> Callable[[TraceCalls], int | None]:
        def flag(trace: TraceCalls) -> int | None:
            first = replay_trace(trace, policy).first_trip
            return first.call_index if first is not None else None

        return flag

    def cap(trace: TraceCalls) -> int | None:
        return CAP + 1 if len(trace.calls) > CAP else None

    detectors: dict[str, Callable[[TraceCalls], int | None]] = {
        "default": loop_detector(LoopPolicy()),
        "seed": loop_detector(LoopPolicy.preset("seed")),
        f"cap{CAP}": cap,
    }
    results: dict[str, list[Session]] = {}
    timings: dict[str, float] = {}
    for name, detector in detectors.items():
        t0 = time.perf_counter()
        results[name] = [
            Session(lab["source"], lab["label"], len(trace.calls), detector(trace))
            for lab, trace in traces
        ]
        timings[name] = time.perf_counter() - t0

    calls = sum(len(t.calls) for _, t in traces)
    print(f"corpus: {len(traces)} sessions, {calls} tool calls, read in {read_s:.2f} s")
    print(f"default policy: {LoopPolicy().version}")
    print()
    header = f"{'':34s}" + "".join(f"{name:>44s}" for name in detectors)
    sub = f"{'label / source':34s}" + "".join(
        f"{'flagged [95% CI]':>29s}{'first':>7s}{'after':>8s}" for _ in detectors
    )
    print(header)
    print(sub)
    groups: dict[tuple[str, str], None] = {}
    for lab, _ in traces:
        groups[(lab["label"], lab["source"])] = None
    for label in LABELS:
        line = f"{label:34s}"
        for name in detectors:
            line += f"  {summarize(s for s in results[name] if s.label == label):>42s}"
        print(line)
        for glabel, source in sorted(groups):
            if glabel != label:
                continue
            line = f"  {source[:32]:32s}"
            for name in detectors:
                line += f"  {summarize(s for s in results[name] if s.label == label and s.source == source):>42s}"
            print(line)
    print()
    default = results["default"]
    run = [s for s in default if s.label == "runaway"]
    healthy = [s for s in default if s.label == "healthy"]
    run_rate = sum(s.first_flag is not None for s in run) / len(run)
    healthy_rate = sum(s.first_flag is not None for s in healthy) / len(healthy)
    med = statistics.median(s.first_flag / s.calls for s in run if s.first_flag is not None)
    print("goal (issue 7): runaway flagged >= 45%, healthy flagged <= 1%, median first flag < 0.50")
    print(
        f"default:        runaway flagged {run_rate:.1%}, healthy flagged {healthy_rate:.1%}, "
        f"median first flag {med:.2f}"
    )
    for name, seconds in timings.items():
        print(f"replay time {name}: {seconds:.2f} s")
    return 0


if __name__ == "__main__":
    import argparse

    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument(
        "corpus",
        nargs="?",
        type=Path,
        default=Path(__file__).resolve().parents[2] / "shared" / "corpus",
        help="the labelled corpus directory (default: ../shared/corpus next to the repo)",
    )
    root = parser.parse_args().corpus
    if not (root / "labels.jsonl").is_file():
        print(f"no corpus at {root} (expected labels.jsonl there)", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main(root))
