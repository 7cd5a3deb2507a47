"""Detection quality on real agent runs: cross-validated first, in-sample beside it.

Replays a labelled corpus of recorded agent sessions (OTLP/JSON traces, one file per session,
plus a ``labels.jsonl``; the project's calibration corpus lives outside the repository and is
never shipped) with ``tripwire replay``'s engine and prints:

1. **Cross-validated figures (the headline).** The loop-rule settings are *chosen* on one part
   of the corpus and *reported* on the other, so the figure estimates what the procedure does on
   runs nobody tuned on:

   - two folds, split by a fixed hash of each session's file name (sha256, lowest bit), settings
     chosen on fold A and reported on fold B, and the other way round; pooled, every session is
     judged by settings chosen without it;
   - leave-one-source-out: settings chosen on four sources, reported on the fifth.

   "Chosen" is a fixed procedure: starting from the shipped defaults, one pass over each rule's
   knob in a fixed order keeps the value that catches the most runaway sessions with at most 1%
   of healthy sessions flagged on the training part (ties: fewer healthy flagged, then the
   earlier first flag, then the value listed first, which is the default's). Only values that
   keep issue 15's table of cases right are candidates (``tests/evidence_cases.py``): a setting
   tripwire cannot ship is not one the estimate may rest on.

   The 2-fold figures are also given per source (the labels are confounded with the sources).

   The learned step line (split-conformal, ``tripwire.replay.calibrate.learn_step_line``, α=5%)
   is learned per source from the healthy sessions of the training fold and applied to the other
   fold; ``default+line`` flags a session when either does.

2. **In-sample figures**, marked as such: the shipped defaults (tuned on this whole corpus), the
   seed rule, a flat cap of 30 tool calls, the learned line and the combination, per label and
   per source, each with a 95% Wilson interval, the median position of the first flag (a share
   of the session) and the share of the label's tool calls after the first flag.

Usage: ``python bench/quality.py [--corpus DIR] [--dump FILE] [--before FILE]``. ``--corpus``
defaults to ``../shared/corpus`` next to the repository. ``--dump`` writes the defaults'
per-session verdicts (JSON Lines: file, label, source, calls, first flag, rule); ``--before``
compares them with such a dump saved earlier.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

from tripwire.core.policy import LoopPolicy
from tripwire.errors import ConfigError
from tripwire.replay.calibrate import learn_step_line
from tripwire.replay.engine import TraceCalls, load_traces, replay_trace

CAP = 30
ALPHA = 0.05
MAX_HEALTHY = 0.01
LABELS = ("runaway", "healthy", "other")

AXES: dict[str, tuple[Any, ...]] = {
    # Each knob's candidates; the first is replaced by the default's own value.
    "threshold": (4, 3, 5, 6),
    "window": (10, 8, 12, 15),
    "max_period": (8, 3, 6, 10, None),
    "same_error": (5, 4, 6, 8, None),
    "same_result": (8, 6, 10, 12, None),
    "revisit": (6, 5, 8, 10, None),
    "revisit_share": (0.8, 0.7, 0.9, None),
    "failure_share": (0.8, 0.7, 0.9, None),
    "mute_failures": (4, 3, 5, 6, None),
}
"""The knobs the cross-validation may tune, in the order they are tuned (fields the policy does
not have are skipped)."""


@dataclass(frozen=True)
class Row:
    file: str
    source: str
    label: str
    calls: int
    fold: int
    trace: TraceCalls


@dataclass(frozen=True)
class Trip:
    first: int | None
    """1-based call index of the first flag, ``None`` if never flagged."""
    rule: str | None = None


Flags = tuple[Trip, ...]


def fold_of(file: str) -> int:
    """The fixed fold of a session: the lowest bit of the sha256 of its file name."""
    return hashlib.sha256(Path(file).name.encode()).digest()[0] & 1


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson score interval for k successes out of n."""
    if n == 0:
        return (0.0, 0.0)
    p = k / n
    denom = 1 + z * z / n
    centre = (p + z * z / (2 * n)) / denom
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / denom
    return (max(0.0, centre - half), min(1.0, centre + half))


def summarize(pairs: Iterable[tuple[Row, Trip]]) -> str:
    items = list(pairs)
    n = len(items)
    flagged = [(r, t) for r, t in items if t.first is not None]
    k = len(flagged)
    lo, hi = wilson(k, n)
    positions = [t.first / r.calls for r, t in flagged if t.first is not None]
    median = f"{statistics.median(positions):.2f}" if positions else "  - "
    total = sum(r.calls for r, _ in items)
    after = sum(r.calls - t.first for r, t in flagged if t.first is not None)
    share_after = after / total if total else 0.0
    return f"{k:3d}/{n:<3d} {k / n if n else 0:6.1%} [{lo:5.1%}–{hi:5.1%}]  {median:>5}  {share_after:6.1%}"


@dataclass(frozen=True)
class Figure:
    caught: int
    runaways: int
    alarms: int
    healthy: int
    median_first: float | None

    def line(self) -> str:
        r = self.caught / self.runaways if self.runaways else 0.0
        h = self.alarms / self.healthy if self.healthy else 0.0
        rlo, rhi = wilson(self.caught, self.runaways)
        hlo, hhi = wilson(self.alarms, self.healthy)
        med = f"{self.median_first:.2f}" if self.median_first is not None else "  - "
        return (
            f"{self.caught:3d}/{self.runaways:<3d} {r:6.1%} [{rlo:5.1%}–{rhi:5.1%}]   "
            f"{self.alarms:3d}/{self.healthy:<3d} {h:5.1%} [{hlo:4.1%}–{hhi:5.1%}]   {med:>5}"
        )


def figure(rows: Sequence[Row], flags: Flags, idx: Iterable[int]) -> Figure:
    caught = runaways = alarms = healthy = 0
    positions: list[float] = []
    for i in idx:
        row, trip = rows[i], flags[i]
        if row.label == "runaway":
            runaways += 1
            if trip.first is not None:
                caught += 1
                positions.append(trip.first / row.calls)
        elif row.label == "healthy":
            healthy += 1
            alarms += trip.first is not None
    return Figure(caught, runaways, alarms, healthy, statistics.median(positions) if positions else None)


class Replayer:
    """First flags of every session under a policy, computed once per policy."""

    def __init__(self, rows: Sequence[Row]) -> None:
        self.rows = rows
        self.memo: dict[str, Flags] = {}
        self.seconds = 0.0

    def __call__(self, policy: LoopPolicy) -> Flags:
        got = self.memo.get(policy.version)
        if got is None:
            t0 = time.perf_counter()
            out = []
            for row in self.rows:
                trip = replay_trace(row.trace, policy).first_trip
                out.append(Trip(trip.call_index, trip.rule.value) if trip is not None else Trip(None))
            got = self.memo[policy.version] = tuple(out)
            self.seconds += time.perf_counter() - t0
        return got


def _objective(f: Figure) -> tuple[float, ...]:
    ok = f.alarms <= math.floor(MAX_HEALTHY * f.healthy + 1e-9)
    return (ok, f.caught if ok else -f.alarms, -f.alarms, -(f.median_first if f.median_first is not None else 1.0))


START = dict(threshold=4, window=10, max_period=3, same_error=None, revisit=None, revisit_share=None, failure_share=None)
"""Where the tuning starts: the first design's rules, plus the shipped ``same_result`` (issue 15's
table needs a rule for "8 different searches, all with an empty result") and ``mute_failures``
(issue 39's table needs one for "four different commands not found within twenty calls"; its
shape and its 4 were chosen on fold A alone)."""


sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from evidence_cases import cases as _table_cases  # noqa: E402  (issue 15's table, as data)
from evidence_cases import replay_case, table_holds  # noqa: E402

TABLE = _table_cases()
_ADMISSIBLE: dict[str, bool] = {}


def keeps_the_table(policy: LoopPolicy) -> bool:
    """True when ``policy`` judges every case of issue 15's table as the table says (a setting
    that breaks it, such as a threshold that is not "stuck at the 4th call", is never chosen)."""
    got = _ADMISSIBLE.get(policy.version)
    if got is None:
        got = True
        for case in TABLE:
            verdicts = [v for v, _ in replay_case(case, policy)]
            if not table_holds(verdicts, case):
                got = False
                break
        _ADMISSIBLE[policy.version] = got
    return got


def choose(replay: Replayer, base: LoopPolicy, train: Sequence[int]) -> LoopPolicy:
    """The training part's settings: one pass over each knob (see the module docstring); only
    settings that keep issue 15's table right are candidates (:func:`keeps_the_table`)."""
    names = {f.name for f in fields(LoopPolicy) if f.init}
    current = base.evolve(**{k: v for k, v in START.items() if k in names})
    for axis, values in AXES.items():
        if axis not in names:
            continue
        own = getattr(current, axis)
        candidates = [own, *(v for v in values if v != own)]
        here = figure(replay.rows, replay(current), train)
        best: tuple[tuple[float, ...], LoopPolicy] | None = None
        for value in candidates[1:]:
            try:
                policy = current.evolve(**{axis: value})
            except ConfigError:
                continue  # e.g. a threshold above the window
            if not keeps_the_table(policy):
                continue
            got = figure(replay.rows, replay(policy), train)
            if not _objective(got)[0] or got.caught <= here.caught:
                continue  # move only for more catches
            score = _objective(got)
            if best is None or score > best[0]:
                best = (score, policy)
        if best is not None:
            current = best[1]
    return current


def settings(policy: LoopPolicy, base: LoopPolicy) -> str:
    changed = [
        f"{a}={getattr(policy, a)}" for a in AXES if hasattr(policy, a) and getattr(policy, a) != getattr(base, a)
    ]
    return ", ".join(changed) if changed else "the defaults"


def learned_line_flags(rows: Sequence[Row], train: Sequence[int], test: Sequence[int]) -> dict[int, Trip]:
    """Per source, the step line learned on ``train``'s healthy sessions, applied to ``test``."""
    by_source: dict[str, list[int]] = {}
    for i in train:
        if rows[i].label == "healthy":
            by_source.setdefault(rows[i].source, []).append(rows[i].calls)
    lines: dict[str, int | None] = {}
    for source, counts in by_source.items():
        try:
            lines[source] = learn_step_line(counts, alpha=ALPHA).max_tool_calls
        except ConfigError:
            lines[source] = None  # too few healthy runs for this alpha: no line
    out: dict[int, Trip] = {}
    for i in test:
        line = lines.get(rows[i].source)
        over = line is not None and rows[i].calls > line
        out[i] = Trip(line + 1, "max_tool_calls") if over and line is not None else Trip(None)
    return out


def union(a: Flags, b: Flags) -> Flags:
    out = []
    for x, y in zip(a, b, strict=True):
        firsts = [t for t in (x, y) if t.first is not None]
        out.append(min(firsts, key=lambda t: t.first or 0) if firsts else Trip(None))
    return tuple(out)


def main(corpus: Path, dump: Path | None, before: Path | None) -> int:
    labels = [json.loads(line) for line in (corpus / "labels.jsonl").read_text().splitlines() if line]
    by_file = {str((corpus / lab["file"]).resolve()): lab for lab in labels}
    started = time.perf_counter()
    loaded = load_traces([corpus / lab["file"] for lab in labels])
    read_s = time.perf_counter() - started
    for problem in loaded.problems:
        print(f"input problem: {problem}", file=sys.stderr)

    rows: list[Row] = []
    for trace in loaded.traces:
        source = str(Path(trace.sources[0]).resolve()) if trace.sources else ""
        lab = by_file.get(source)
        if lab is None:
            print(f"no label for trace {trace.trace_id} ({source})", file=sys.stderr)
            continue
        rows.append(Row(lab["file"], lab["source"], lab["label"], len(trace.calls), fold_of(lab["file"]), trace))
    everyone = range(len(rows))
    base = LoopPolicy()
    replay = Replayer(rows)
    calls = sum(r.calls for r in rows)
    print(f"corpus: {len(rows)} sessions, {calls} tool calls, read in {read_s:.2f} s")
    print(f"default policy: {base.version}")
    print()

    # --- 1. cross-validated ----------------------------------------------------------------
    t0 = time.perf_counter()
    folds = [[i for i in everyone if rows[i].fold == f] for f in (0, 1)]
    cv_flags: list[Trip] = [Trip(None)] * len(rows)
    line_flags: list[Trip] = [Trip(None)] * len(rows)
    header = f"{'':44s}{'runaway flagged [95% CI]':>29s}   {'healthy flagged [95% CI]':>27s}   first"
    print("cross-validated: settings chosen on one part, reported on the other (the estimate for unseen runs)")
    print(header)
    chosen_lines: list[str] = []
    for f, name in ((0, "A"), (1, "B")):
        train, test = folds[f], folds[1 - f]
        policy = choose(replay, base, train)
        flags = replay(policy)
        for i in test:
            cv_flags[i] = flags[i]
        for i, trip in learned_line_flags(rows, train, test).items():
            line_flags[i] = trip
        other = "B" if name == "A" else "A"
        print(f"  {'chosen on fold ' + name + ', reported on ' + other:42s}{figure(rows, flags, test).line()}")
        chosen_lines.append(f"  fold {name} chose: {settings(policy, base)}")
    cv = tuple(cv_flags)
    print(f"  {'2-fold, pooled':42s}{figure(rows, cv, everyone).line()}")
    for source in sorted({r.source for r in rows}):
        mine = [i for i in everyone if rows[i].source == source]
        print(f"  {'  2-fold, ' + source[:30]:42s}{figure(rows, cv, mine).line()}")
    lines_cv = tuple(line_flags)
    print(f"  {'learned line (α=5%, per source), pooled':42s}{figure(rows, lines_cv, everyone).line()}")
    print(f"  {'2-fold + learned line, pooled':42s}{figure(rows, union(cv, lines_cv), everyone).line()}")
    sources = sorted({r.source for r in rows})
    loso: list[Trip] = [Trip(None)] * len(rows)
    loso_lines: list[str] = []
    for source in sources:
        train = [i for i in everyone if rows[i].source != source]
        test = [i for i in everyone if rows[i].source == source]
        policy = choose(replay, base, train)
        flags = replay(policy)
        for i in test:
            loso[i] = flags[i]
        print(f"  {'left out: ' + source[:32]:42s}{figure(rows, flags, test).line()}")
        loso_lines.append(f"  without {source} chose: {settings(policy, base)}")
    print(f"  {'leave-one-source-out, pooled':42s}{figure(rows, tuple(loso), everyone).line()}")
    print(f"  {'in-sample: the defaults on all (tuned here)':42s}{figure(rows, replay(base), everyone).line()}")
    for text in chosen_lines + loso_lines:
        print(text)
    cv_s = time.perf_counter() - t0
    print()

    # --- 2. in-sample, per label and source ---------------------------------------------------
    in_lines: dict[int, Trip] = learned_line_flags(rows, everyone, everyone)
    line_in = tuple(in_lines[i] for i in everyone)
    detectors: dict[str, Flags] = {
        "default": replay(base),
        "seed": replay(LoopPolicy.preset("seed")),
        f"cap{CAP}": tuple(Trip(CAP + 1, "cap") if r.calls > CAP else Trip(None) for r in rows),
        "line": line_in,
        "default+line": union(replay(base), line_in),
    }
    print("in-sample (the defaults were tuned on these sessions; the line is learned on their healthy runs)")
    print(f"{'':34s}" + "".join(f"{name:>44s}" for name in detectors))
    print(f"{'label / source':34s}" + "".join(f"{'flagged [95% CI]':>29s}{'first':>7s}{'after':>8s}" for _ in detectors))
    groups = sorted({(r.label, r.source) for r in rows})
    for label in LABELS:
        line = f"{label:34s}"
        for flags in detectors.values():
            line += f"  {summarize((r, t) for r, t in zip(rows, flags, strict=True) if r.label == label):>42s}"
        print(line)
        for glabel, source in groups:
            if glabel != label:
                continue
            line = f"  {source[:32]:32s}"
            for flags in detectors.values():
                picked = ((r, t) for r, t in zip(rows, flags, strict=True) if r.label == label and r.source == source)
                line += f"  {summarize(picked):>42s}"
            print(line)
    print()
    cvf = figure(rows, cv, everyone)
    print("goal (issue 15): on unseen runs, runaway flagged >= 45%, healthy flagged <= 1%, median first flag < 0.50")
    print(
        f"2-fold estimate: runaway flagged {cvf.caught / cvf.runaways:.1%}, healthy flagged "
        f"{cvf.alarms / cvf.healthy:.1%}, median first flag {cvf.median_first or 0:.2f}"
    )
    print(f"replay time: {replay.seconds:.2f} s for {len(replay.memo)} policies; cross-validation {cv_s:.2f} s")

    default = detectors["default"]
    if dump is not None:
        with dump.open("w") as fh:
            for row, trip in zip(rows, default, strict=True):
                fh.write(json.dumps({"file": row.file, "label": row.label, "source": row.source, "calls": row.calls,
                                     "first": trip.first, "rule": trip.rule}) + "\n")
        print(f"per-session verdicts of the defaults written to {dump}", file=sys.stderr)
    if before is not None:
        compare(before, rows, default)
    return 0


def compare(before: Path, rows: Sequence[Row], now: Flags) -> None:
    """Print what changed since a ``--dump`` saved earlier: counts and the sessions that moved."""
    old = {}
    for line in before.read_text().splitlines():
        if line.strip():
            obj = json.loads(line)
            old[obj["file"]] = obj
    print()
    print(f"changes against {before.name} (before -> now):")
    moved: dict[tuple[str, str], list[str]] = {}
    for row, trip in zip(rows, now, strict=True):
        prev = old.get(row.file)
        if prev is None:
            continue
        was, got = prev["first"] is not None, trip.first is not None
        if was != got:
            key = (row.label, "newly flagged" if got else "no longer flagged")
            moved.setdefault(key, []).append(
                f"{row.source}:{Path(row.file).name} ({prev['rule']} -> {trip.rule})"
            )
    for label in LABELS:
        was = sum(1 for o in old.values() if o["label"] == label and o["first"] is not None)
        got = sum(1 for r, t in zip(rows, now, strict=True) if r.label == label and t.first is not None)
        n = sum(1 for r in rows if r.label == label)
        print(f"  {label:8s} flagged {was:3d}/{n} -> {got:3d}/{n}")
    for (label, what), names in sorted(moved.items()):
        print(f"  {label} {what}: {len(names)}")
        for name in names:
            print(f"    {name}")


def _parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=(
            "Detection quality on a labelled corpus of recorded agent runs: cross-validated figures "
            "(the headline), then in-sample ones per label and source."
        ),
        epilog=(
            "The corpus is a directory of OTLP/JSON trace files (the ExportTraceServiceRequest JSON "
            "mapping, one session per file) and a labels.jsonl beside them, one JSON object a line: "
            '{"file": "<path relative to the corpus>", "source": "<where the run came from>", '
            '"label": "runaway" | "healthy" | "other"}. It is not part of the repository.'
        ),
    )
    default = Path(__file__).resolve().parents[2] / "shared" / "corpus"
    parser.add_argument("corpus_pos", nargs="?", type=Path, metavar="CORPUS", help=argparse.SUPPRESS)
    parser.add_argument(
        "--corpus",
        type=Path,
        default=None,
        metavar="DIR",
        help=f"the labelled corpus directory (default: ../shared/corpus next to the repository, {default})",
    )
    parser.add_argument("--dump", type=Path, metavar="FILE", help="write the defaults' per-session verdicts (JSON Lines)")
    parser.add_argument("--before", type=Path, metavar="FILE", help="compare with a --dump saved earlier")
    ns = parser.parse_args(argv)
    ns.corpus = ns.corpus or ns.corpus_pos or default
    return ns


if __name__ == "__main__":
    args = _parse()
    root: Path = args.corpus
    if not (root / "labels.jsonl").is_file():
        print(
            f"no corpus at {root}: expected a directory of OTLP/JSON traces with a labels.jsonl "
            "(see --help); pass it with --corpus DIR",
            file=sys.stderr,
        )
        raise SystemExit(2)
    if args.before is not None and not args.before.is_file():
        print(f"--before: no such file {args.before}", file=sys.stderr)
        raise SystemExit(2)
    raise SystemExit(main(root, args.dump, args.before))
