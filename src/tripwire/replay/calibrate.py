"""Calibrate: which loop policy catches labelled incidents without stopping healthy runs.

Labels say, per trace, whether it was an incident (and optionally from which tool call on) or
healthy. :func:`calibrate` replays a grid of policies over traces parsed once
(:func:`tripwire.replay.engine.load_traces`) and scores each policy:

- *catch rate*: incidents whose verdict became ``stuck`` at some call;
- *false-alarm rate*: healthy traces whose verdict became ``stuck`` at some call;
- *median delay*: calls from the labelled start of the incident (call 1 if not given) to the
  first flag, over caught incidents (negative: flagged before the labelled start);
- *median flag position*: the first flag's call index as a share of the trace's length;
- *saved share*: of all the incidents' tool calls, the share that came after the first flag
  (what stopping there would have saved); *cut share* is the same over healthy traces (work
  a kill switch would have cut off).

It marks the Pareto front (no other policy catches at least as many incidents with at most
as many false alarms and no longer delay, and is better in one of them) and recommends the
policy with the highest catch rate under a false-alarm cap, among the settings that keep what
tripwire promises (:func:`shipping_caveat`: the 4th identical call is the one stopped, and a
batch of different calls to one tool is not a loop); a row that breaks a promise is marked with
why, and is recommended only when asked (``shippable_only=False``).

Determinism: the grid has a fixed order, ties are broken by that order, and a process pool
(``workers > 1``, Linux ``fork`` only) returns results in grid order.
"""

from __future__ import annotations

import itertools
import math
import os
import statistics
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from fractions import Fraction
from typing import Any, Final

import msgspec

from tripwire.core.policy import KeyMode, LoopPolicy
from tripwire.errors import ConfigError
from tripwire.replay.engine import TraceCalls, replay_trace
from tripwire.replay.reader import Problem

__all__ = [
    "DEFAULT_HEALTHY_LABELS",
    "DEFAULT_INCIDENT_LABELS",
    "Calibration",
    "Label",
    "LabelSet",
    "Labelled",
    "PolicyScore",
    "StepLine",
    "StepLineGroup",
    "assign_labels",
    "calibrate",
    "default_grid_axes",
    "learn_step_line",
    "learn_step_lines",
    "limits_file_text",
    "load_labels",
    "min_runs_for",
    "pareto_front",
    "policy_grid",
    "score_policy",
    "shipping_caveat",
]

DEFAULT_INCIDENT_LABELS: Final = ("runaway",)
"""Label values that mark an incident (the corpus's runs stopped for exhausting a budget)."""
DEFAULT_HEALTHY_LABELS: Final = ("healthy",)
"""Label values that mark a healthy run (must not be flagged)."""


# -- labels ---------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Label:
    """One trace's label."""

    incident: bool
    """True for an incident, False for a healthy run."""
    incident_from: int = 1
    """The 1-based tool call at which the incident began (delays are counted from it)."""
    source: str | None = None
    """Where the run came from (the label's ``source``), for a learned line per source."""


@dataclass(slots=True)
class LabelSet:
    """Labels from a labels file, keyed by trace id and by trace file."""

    by_trace: dict[str, Label] = field(default_factory=dict)
    """Labels given with a ``trace_id``."""
    by_file: dict[str, Label] = field(default_factory=dict)
    """Labels given with a ``file`` (resolved real path)."""
    ignored: int = 0
    """Labels with a value that is neither an incident nor a healthy label (e.g. ``other``)."""
    problems: list[Problem] = field(default_factory=list)
    """Lines that could not be read."""


def _label_value(obj: Mapping[str, Any], incident: frozenset[str], healthy: frozenset[str]) -> bool | str | None:
    """True/False for incident/healthy, None to ignore, or a string describing the problem."""
    if "incident" in obj:
        value = obj["incident"]
        if not isinstance(value, bool):
            return "'incident' must be true or false"
        return value
    if "label" in obj:
        value = obj["label"]
        if not isinstance(value, str):
            return "'label' must be a string"
        if value in incident:
            return True
        if value in healthy:
            return False
        return None
    return "needs 'incident' (true/false) or 'label'"


def load_labels(
    path: str | os.PathLike[str],
    *,
    incident_labels: Iterable[str] = DEFAULT_INCIDENT_LABELS,
    healthy_labels: Iterable[str] = DEFAULT_HEALTHY_LABELS,
) -> LabelSet:
    """Read a labels file (JSON Lines).

    Each line is either ``{"trace_id": "<32 hex>", "incident": true|false, "incident_from": n}``
    or ``{"file": "<path relative to the labels file>", "label": "runaway"|"healthy"|…}``
    (``trace_id`` with ``label``, and ``file`` with ``incident``, work too). Label values
    outside ``incident_labels`` and ``healthy_labels`` are ignored (counted in
    :attr:`LabelSet.ignored`).

    Raises:
        ConfigError: the labels file cannot be read.
    """
    text_path = os.fspath(path)
    try:
        with open(text_path, "rb") as fh:
            data = fh.read()
    except OSError as exc:
        raise ConfigError("--labels", text_path, "a readable JSON Lines file",
                          message=f"cannot read the labels file {text_path} ({exc.strerror or exc})") from None
    base = os.path.dirname(os.path.abspath(text_path))
    incident, healthy = frozenset(incident_labels), frozenset(healthy_labels)
    out = LabelSet()
    for number, raw in enumerate(data.split(b"\n"), 1):
        if not raw.strip():
            continue
        try:
            obj = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            out.problems.append(Problem(text_path, f"invalid JSON: {exc}", number))
            continue
        if not isinstance(obj, dict):
            out.problems.append(Problem(text_path, "a label must be a JSON object", number))
            continue
        value = _label_value(obj, incident, healthy)
        if isinstance(value, str):
            out.problems.append(Problem(text_path, value, number))
            continue
        if value is None:
            out.ignored += 1
            continue
        start = obj.get("incident_from", 1)
        if start is None:
            start = 1
        if isinstance(start, bool) or not isinstance(start, int) or start < 1:
            out.problems.append(Problem(text_path, "'incident_from' must be a call index >= 1", number))
            continue
        source = obj.get("source")
        label = Label(incident=value, incident_from=start, source=source if isinstance(source, str) and source else None)
        trace_id = obj.get("trace_id")
        file = obj.get("file")
        if isinstance(trace_id, str) and trace_id:
            out.by_trace[trace_id.lower()] = label
        elif isinstance(file, str) and file:
            out.by_file[os.path.realpath(os.path.join(base, file))] = label
        else:
            out.problems.append(Problem(text_path, "needs a 'trace_id' or a 'file'", number))
    return out


@dataclass(frozen=True, slots=True)
class Labelled:
    """A parsed trace with its label."""

    trace: TraceCalls
    label: Label


def assign_labels(traces: Sequence[TraceCalls], labels: LabelSet) -> tuple[list[Labelled], int]:
    """Pair traces with their labels; returns the pairs and the number of labels that matched no trace.

    A ``file`` label applies to every trace with a span in that file. A trace id label wins
    over a file label.
    """
    used_traces: set[str] = set()
    used_files: set[str] = set()
    pairs: list[Labelled] = []
    real_cache: dict[str, str] = {}
    for trace in traces:
        label = labels.by_trace.get(trace.trace_id)
        if label is not None:
            used_traces.add(trace.trace_id)
        elif labels.by_file:
            for source in trace.sources:
                real = real_cache.get(source)
                if real is None:
                    real = real_cache[source] = os.path.realpath(source)
                label = labels.by_file.get(real)
                if label is not None:
                    used_files.add(real)
                    break
        if label is not None:
            pairs.append(Labelled(trace, label))
    unmatched = len(labels.by_trace) - len(used_traces) + len(labels.by_file) - len(used_files)
    return pairs, unmatched


# -- the grid -------------------------------------------------------------------------------------

SHIPPED_THRESHOLD: Final = 4
"""The repetition count tripwire promises to stop at: the 4th identical call (README, docs)."""


def shipping_caveat(policy: LoopPolicy) -> str:
    """Why ``policy`` breaks what tripwire promises of its loop rules, or ``""`` when it keeps it.

    The promises are issue 15's table (the README's "How well it works"): an identical call that
    keeps getting the same result is stopped at the 4th call, not the 3rd or the 5th; and a batch
    of different calls to one tool (30 order lookups all answered "shipped", 30 writes each
    confirmed) is not a loop, which the ``tool`` key cannot tell apart. Such a setting may score
    well on a corpus and still not be one to ship as is: :func:`calibrate` recommends it only when
    asked.
    """
    notes: list[str] = []
    if policy.threshold < SHIPPED_THRESHOLD:
        notes.append(
            f"threshold {policy.threshold} stops an identical call before the {SHIPPED_THRESHOLD}th"
        )
    elif policy.threshold > SHIPPED_THRESHOLD:
        notes.append(
            f"threshold {policy.threshold} lets the {SHIPPED_THRESHOLD}th identical call run"
        )
    if policy.key is KeyMode.TOOL:
        notes.append("key 'tool' counts a batch of different calls to one tool as a loop")
    return "; ".join(notes)


def default_grid_axes(base: LoopPolicy) -> dict[str, tuple[Any, ...]]:
    """The default grid around ``base``: its own values are always included.

    Windows 6, 10, 15, 20, 30; thresholds 3..6; both key modes; max period off, 3 and 6.
    """
    windows = sorted({6, 10, 15, 20, 30, base.window})
    thresholds = sorted({3, 4, 5, 6, base.threshold})
    keys = (KeyMode.TOOL_ARGS, KeyMode.TOOL)
    periods: list[int | None] = [None, *sorted({3, 6} | ({base.max_period} if base.max_period else set()))]
    return {"window": tuple(windows), "threshold": tuple(thresholds), "key": keys, "max_period": tuple(periods)}


def policy_grid(
    base: LoopPolicy,
    *,
    windows: Sequence[int],
    thresholds: Sequence[int],
    keys: Sequence[KeyMode],
    max_periods: Sequence[int | None],
) -> list[LoopPolicy]:
    """Every valid combination, in a fixed order (key, max period, window, threshold).

    Combinations where the threshold exceeds the window are left out (the rule could never
    trip); other fields come from ``base``.
    """
    out: list[LoopPolicy] = []
    for key, mp, window, threshold in itertools.product(keys, max_periods, windows, thresholds):
        if threshold > window:
            continue
        out.append(base.evolve(key=key, max_period=mp, window=window, threshold=threshold))
    return out


# -- scoring --------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyScore:
    """How one policy did on the labelled traces."""

    policy: LoopPolicy
    incidents: int
    caught: int
    healthy: int
    false_alarms: int
    median_delay: float | None
    """Median calls from the incident's start to the first flag, over caught incidents."""
    median_flag_position: float | None
    """Median first-flag call index / trace length, over caught incidents."""
    saved_share: float
    """Share of the incidents' tool calls after the first flag."""
    cut_share: float
    """Share of the healthy traces' tool calls after a (false) first flag."""
    pareto: bool = False
    recommended: bool = False
    caveat: str = ""
    """Why the policy breaks a promise of the loop rules (:func:`shipping_caveat`), or empty."""

    @property
    def ships(self) -> bool:
        """True when the policy keeps what tripwire promises (no :attr:`caveat`)."""
        return not self.caveat

    @property
    def catch_rate(self) -> float:
        """Caught incidents / incidents (0 without incidents)."""
        return self.caught / self.incidents if self.incidents else 0.0

    @property
    def false_alarm_rate(self) -> float:
        """Flagged healthy traces / healthy traces (0 without healthy traces)."""
        return self.false_alarms / self.healthy if self.healthy else 0.0

    def to_json(self) -> dict[str, Any]:
        """One ``calibrate --json`` line."""
        p = self.policy
        return {
            "policy_version": p.version,
            "window": p.window,
            "threshold": p.threshold,
            "key": p.key.value,
            "max_period": p.max_period,
            "min_repeats": p.min_repeats,
            "incidents": self.incidents,
            "caught": self.caught,
            "catch_rate": round(self.catch_rate, 6),
            "healthy": self.healthy,
            "false_alarms": self.false_alarms,
            "false_alarm_rate": round(self.false_alarm_rate, 6),
            "median_delay": self.median_delay,
            "median_flag_position": None if self.median_flag_position is None else round(self.median_flag_position, 6),
            "saved_share": round(self.saved_share, 6),
            "cut_share": round(self.cut_share, 6),
            "pareto": self.pareto,
            "recommended": self.recommended,
            "ships": self.ships,
            "caveat": self.caveat,
        }


def score_policy(policy: LoopPolicy, labelled: Sequence[Labelled]) -> PolicyScore:
    """Replay ``policy`` over every labelled trace and score it."""
    return PolicyScore(policy=policy, caveat=shipping_caveat(policy), **_measure(policy, labelled))


def _measure(policy: LoopPolicy, labelled: Sequence[Labelled]) -> dict[str, Any]:
    """The numbers of a :class:`PolicyScore` (plain values: they cross process boundaries)."""
    incidents = caught = healthy = alarms = 0
    inc_calls = inc_saved = ok_calls = ok_cut = 0
    delays: list[int] = []
    positions: list[float] = []
    for item in labelled:
        result = replay_trace(item.trace, policy)
        trip = result.first_trip
        if item.label.incident:
            incidents += 1
            inc_calls += result.tool_calls
            if trip is not None:
                caught += 1
                inc_saved += result.calls_after_trip
                delays.append(trip.call_index - item.label.incident_from)
                positions.append(trip.call_index / result.tool_calls)
        else:
            healthy += 1
            ok_calls += result.tool_calls
            if trip is not None:
                alarms += 1
                ok_cut += result.calls_after_trip
    return {
        "incidents": incidents,
        "caught": caught,
        "healthy": healthy,
        "false_alarms": alarms,
        "median_delay": float(statistics.median(delays)) if delays else None,
        "median_flag_position": float(statistics.median(positions)) if positions else None,
        "saved_share": inc_saved / inc_calls if inc_calls else 0.0,
        "cut_share": ok_cut / ok_calls if ok_calls else 0.0,
    }


def _delay_key(score: PolicyScore) -> float:
    return score.median_delay if score.median_delay is not None else float("inf")


def pareto_front(scores: Sequence[PolicyScore]) -> set[int]:
    """Indices of the policies no other policy dominates.

    Objectives: catch rate (higher is better), false-alarm rate (lower), median delay
    (lower; none counts as worst). Equal points are all on the front.
    """
    front: set[int] = set()
    points = [(s.catch_rate, s.false_alarm_rate, _delay_key(s)) for s in scores]
    for i, (c, f, d) in enumerate(points):
        dominated = False
        for j, (c2, f2, d2) in enumerate(points):
            if j != i and c2 >= c and f2 <= f and d2 <= d and (c2 > c or f2 < f or d2 < d):
                dominated = True
                break
        if not dominated:
            front.add(i)
    return front


@dataclass(frozen=True, slots=True)
class Calibration:
    """The scores of a grid, in grid order, with the front and the recommendation marked."""

    scores: tuple[PolicyScore, ...]
    max_false_alarms: float
    """The cap the recommendation respects (a share of healthy traces)."""
    recommended: int | None
    """Index of the recommended policy; ``None`` when none is under the cap (among the
    policies that ship as they are, unless :attr:`shippable_only` is False)."""
    shippable_only: bool = True
    """Whether the recommendation was limited to policies without a :attr:`PolicyScore.caveat`."""


_WORK: tuple[list[Labelled], list[LoopPolicy]] = ([], [])
"""The labelled traces and the grid, inherited by forked workers (never pickled: only grid
indices go to the workers and plain numbers come back)."""


def _measure_at(index: int) -> dict[str, Any]:
    labelled, policies = _WORK
    return _measure(policies[index], labelled)


def calibrate(
    labelled: Sequence[Labelled],
    policies: Sequence[LoopPolicy],
    *,
    max_false_alarms: float = 0.02,
    workers: int = 1,
    on_policy: Callable[[int], None] | None = None,
    shippable_only: bool = True,
) -> Calibration:
    """Score every policy, mark the Pareto front and recommend one.

    Args:
        labelled: the labelled traces (parse once, replay many).
        policies: the grid, e.g. from :func:`policy_grid`.
        max_false_alarms: the highest acceptable false-alarm rate for the recommendation.
        workers: processes to use; above 1 only where ``fork`` exists (Linux), else serial.
            Results are the same either way, in grid order.
        on_policy: called with the number of policies done so far (progress).
        shippable_only: recommend only a policy that keeps tripwire's promises (no
            :func:`shipping_caveat`); False also considers the others (they stay marked).

    Returns:
        The scores in grid order, each with its caveat. The recommendation is the highest catch
        rate under the cap; ties go to the shorter median delay, then the larger saved share,
        then the fewer false alarms, then the earlier grid position.
    """
    if not 0 <= max_false_alarms <= 1:
        raise ConfigError("max_false_alarms", max_false_alarms, "a share between 0 and 1")
    scores: list[PolicyScore] = []
    use_pool = workers > 1 and len(policies) > 1 and sys.platform.startswith("linux")
    if use_pool:
        import multiprocessing
        from concurrent.futures import ProcessPoolExecutor

        global _WORK
        _WORK = (list(labelled), list(policies))
        try:
            ctx = multiprocessing.get_context("fork")
            chunk = max(1, len(policies) // (workers * 8))
            with ProcessPoolExecutor(max_workers=workers, mp_context=ctx) as pool:
                for i, numbers in enumerate(pool.map(_measure_at, range(len(policies)), chunksize=chunk)):
                    scores.append(PolicyScore(policy=policies[i], caveat=shipping_caveat(policies[i]), **numbers))
                    if on_policy is not None:
                        on_policy(len(scores))
        finally:
            _WORK = ([], [])
    else:
        for policy in policies:
            scores.append(score_policy(policy, labelled))
            if on_policy is not None:
                on_policy(len(scores))

    front = pareto_front(scores)
    eligible = [
        i
        for i, s in enumerate(scores)
        if s.false_alarm_rate <= max_false_alarms + 1e-12 and (s.ships or not shippable_only)
    ]
    best: int | None = None
    if eligible:
        best = min(
            eligible,
            key=lambda i: (
                -scores[i].catch_rate,
                _delay_key(scores[i]),
                -scores[i].saved_share,
                scores[i].false_alarm_rate,
                i,
            ),
        )
    marked = tuple(
        replace(s, pareto=i in front, recommended=i == best) for i, s in enumerate(scores)
    )
    return Calibration(
        scores=marked, max_false_alarms=max_false_alarms, recommended=best, shippable_only=shippable_only
    )


# -- the learned step line --------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class StepLine:
    """A tool-call line learned from healthy runs (split-conformal), for ``Limits.max_tool_calls``.

    Over ``runs`` healthy runs, the line is the ``rank``-th smallest tool-call count, with
    ``rank = ceil((runs + 1) * (1 - alpha))``: if the runs to come are exchangeable with these (same
    agent, same kind of task), a healthy one goes over the line with probability at most
    ``alpha``. It says nothing about runaways: it stops a long run whether it loops or not, which
    is why it sits beside the loop rules rather than replacing them.
    """

    max_tool_calls: int
    """The line: runs are allowed this many tool calls; the next one is refused."""
    alpha: float
    """The stated false-stop rate: the share of healthy runs the line may stop."""
    runs: int
    """How many healthy runs it was learned from."""
    rank: int
    """Which order statistic the line is (1 = the smallest count)."""


def _exact(alpha: float) -> Fraction:
    return Fraction(repr(alpha)) if isinstance(alpha, float) else Fraction(alpha)


def _check_alpha(alpha: Any) -> Fraction:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha < 1:
        raise ConfigError("alpha", alpha, "a false-stop rate above 0 and below 1, e.g. 0.05")
    return _exact(alpha)


def min_runs_for(alpha: float) -> int:
    """The fewest healthy runs a line at false-stop rate ``alpha`` can be learned from.

    ``ceil((n + 1) * (1 - alpha))`` must not exceed ``n``: 19 runs for ``alpha=0.05``, 99 for 0.01.

    Raises:
        ConfigError: ``alpha`` is not between 0 and 1 (both excluded).
    """
    a = _check_alpha(alpha)
    return max(1, math.ceil((1 - a) / a))


def learn_step_line(counts: Iterable[int], *, alpha: float = 0.05) -> StepLine:
    """The tool-call line of a set of healthy runs at false-stop rate ``alpha`` (split-conformal).

    Args:
        counts: each healthy run's tool-call count (one agent or source: learn one line per
            population whose runs are alike).
        alpha: the share of healthy runs the line may stop.

    Returns:
        The line, with what it was learned from.

    Raises:
        ConfigError: ``alpha`` is out of range, a count is not an integer >= 0, or there are
            fewer runs than :func:`min_runs_for` needs (the line would be "never stop", which is
            no line: record more healthy runs, or accept a larger ``alpha``).
    """
    a = _check_alpha(alpha)
    values: list[int] = []
    for count in counts:
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise ConfigError("counts", count, "tool-call counts, integers >= 0")
        values.append(count)
    n = len(values)
    need = min_runs_for(alpha)
    if n < need:
        raise ConfigError(
            "healthy runs",
            n,
            f"at least {need} for alpha={alpha:g}",
            message=(
                f"a step line at alpha={alpha:g} needs at least {need} healthy runs, got {n}: "
                "label more healthy runs of this agent or source, or accept a larger alpha"
            ),
        )
    rank = math.ceil((n + 1) * (1 - a))
    values.sort()
    return StepLine(max_tool_calls=values[rank - 1], alpha=float(alpha), runs=n, rank=rank)


@dataclass(frozen=True, slots=True, kw_only=True)
class StepLineGroup:
    """The learned line of one agent or source (or why there is none), with what it would flag."""

    group: str
    """The agent name, the source, or ``all``."""
    line: StepLine | None
    """The line; ``None`` when there were too few healthy runs (see :attr:`refused`)."""
    refused: str = ""
    """Why no line was learned (the :func:`learn_step_line` message)."""
    healthy: int = 0
    """Healthy runs of the group."""
    incidents: int = 0
    """Incidents of the group."""
    incidents_over: int = 0
    """Incidents with more tool calls than the line (what it would stop; learned in-sample)."""
    healthy_over: int = 0
    """Healthy runs with more tool calls than the line (in-sample, at most about ``alpha``)."""


def learn_step_lines(
    labelled: Sequence[Labelled], *, alpha: float = 0.05, per: str = "agent"
) -> list[StepLineGroup]:
    """A step line per agent (``per="agent"``: the trace's agent name), per source (``"source"``:
    the label's ``source``) or for all runs together (``"all"``), from the healthy runs.

    Groups are sorted by name; runs without an agent name or source go to the group ``-``.

    Raises:
        ConfigError: ``per`` or ``alpha`` is invalid.
    """
    if per not in ("agent", "source", "all"):
        raise ConfigError("per", per, "'agent', 'source' or 'all'")
    _check_alpha(alpha)
    groups: dict[str, list[Labelled]] = {}
    for item in labelled:
        if per == "all":
            name = "all"
        elif per == "agent":
            name = item.trace.agent or "-"
        else:
            name = item.label.source or "-"
        groups.setdefault(name, []).append(item)
    out: list[StepLineGroup] = []
    for name in sorted(groups):
        items = groups[name]
        healthy = [len(x.trace.calls) for x in items if not x.label.incident]
        incidents = [len(x.trace.calls) for x in items if x.label.incident]
        try:
            line = learn_step_line(healthy, alpha=alpha)
        except ConfigError as exc:
            out.append(StepLineGroup(group=name, line=None, refused=str(exc), healthy=len(healthy),
                                     incidents=len(incidents)))
            continue
        cap = line.max_tool_calls
        out.append(
            StepLineGroup(
                group=name,
                line=line,
                healthy=len(healthy),
                incidents=len(incidents),
                incidents_over=sum(c > cap for c in incidents),
                healthy_over=sum(c > cap for c in healthy),
            )
        )
    return out


def limits_file_text(group: StepLineGroup) -> str:
    """A configuration file holding the learned line as ``[limits] max_tool_calls``."""
    if group.line is None:
        raise ConfigError("line", None, "a learned line", message=group.refused)
    line = group.line
    return (
        f"# Learned by tripwire calibrate for {group.group}: the tool-call count at rank {line.rank} "
        f"of {line.runs} healthy runs, shortest first\n"
        f"# (split-conformal, alpha={line.alpha:g}: about {line.alpha:.0%} of healthy runs like these go over it).\n"
        "version = 1\n"
        "\n"
        "[limits]\n"
        f"max_tool_calls = {line.max_tool_calls}\n"
    )
