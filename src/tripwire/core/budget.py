"""Run budgets: the limits, their graduated levels, and the pure checks the guard runs.

Counting semantics (one meaning everywhere; see ``docs/guard.md``):

- a **step** is one model call (request). ``max_steps=n`` allows exactly n steps: the check
  before step n+1 refuses it before it runs;
- a **tool call** counts when the guard allows it to run (before it runs, whether it then
  succeeds or fails). A cap of n (``max_tool_calls``, ``tool_caps[tool]``,
  ``default_tool_cap``, ``max_duplicate_calls``, ``max_subagents``) allows exactly n; the
  (n+1)-th is refused before it runs. A parallel batch is checked as a whole: if it would take
  any counter over its cap, none of it runs and nothing is counted;
- **tokens and cost** are only known after the model call, from the usage the runner reports:
  they are checked after each report and stop the run when the total is ``>=`` the limit;
- **time** (``max_duration_s``) is checked before every step and tool call, and stops at
  ``>=`` the limit;
- **no progress**: ``max_no_progress_steps=n`` allows n consecutive steps whose progress
  fingerprint did not change; the step after them is refused.

Levels: below ``advise`` nothing happens; at ``advise`` the guard returns an :class:`Advisory`
the runner can show the model; at ``restrict`` new tool calls are refused (softly: the run goes
on) and the model is told to answer without tools; at the limit the run stops. ``restrict``
applies to the budgets the final answer itself consumes (steps, tokens, cost, time); count
caps on tools go from ``advise`` straight to the hard stop, because one more tool call costs
exactly one unit and the answer needs none.

:class:`Meter` is the one budget meter for a run observed *after the fact* (the span
processor's engine, replay, the OTLP receiver): it counts what the run consumed and returns the
same decisions (:func:`check_charges`, :func:`check_before_step`, :func:`check_duration`) the
guard takes before each call.

Pure and stdlib-only: no clock, no I/O, no logging. Time comes in as ``elapsed_s``.
"""

from __future__ import annotations

import math
import string
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from enum import Enum
from types import MappingProxyType
from typing import Any, Final

from tripwire.core.reasons import StopReason
from tripwire.errors import BudgetExceeded, ConfigError

__all__ = [
    "NO_LIMITS",
    "OK",
    "Advisory",
    "Charge",
    "Level",
    "Levels",
    "Limits",
    "Messages",
    "Meter",
    "RunCounters",
    "Stop",
    "charge_stop",
    "check_before_step",
    "check_before_tool_calls",
    "check_charges",
    "check_duplicates",
    "check_duration",
    "check_usage",
    "count_advisory",
    "plan_subagent",
    "plan_tool_calls",
    "refused",
    "usage_advisory",
]

NANO: Final = 1_000_000_000
"""Cost is counted in integer nano-dollars in ledgers (exact sums, atomic ``INCRBY``)."""


class Level(str, Enum):
    """How close a run is to a limit."""

    OK = "ok"
    """Below every soft level: nothing to say."""
    ADVISE = "advise"
    """Past the soft level: tell the model what is left, so it can wrap up."""
    RESTRICT = "restrict"
    """Near the end: new tool calls are refused; the model must answer now, without tools."""
    STOP = "stop"
    """The limit fired: the run stops (the guard raises)."""


_RANK: Final = {Level.OK: 0, Level.ADVISE: 1, Level.RESTRICT: 2, Level.STOP: 3}


@dataclass(frozen=True, slots=True, kw_only=True)
class Levels:
    """Where the graduated levels start. ``None`` switches a level off."""

    advise: float | None = 0.8
    """Fraction of a budget used at which the advisory starts (tokens, cost, time, tool caps)."""
    restrict: float | None = 0.9
    """Fraction of a consumable budget (tokens, cost, time) at which tool calls are refused."""
    step_advise: int | None = 2
    """Advise when at most this many steps are left after the current one."""
    step_restrict: int | None = 0
    """Restrict when at most this many steps are left after the current one (0 = the last)."""

    def __post_init__(self) -> None:
        for name in ("advise", "restrict"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < 1
            ):
                raise ConfigError(
                    f"Levels.{name}", value, "a fraction strictly between 0 and 1, or None"
                )
        if self.advise is not None and self.restrict is not None and self.advise > self.restrict:
            raise ConfigError("Levels.advise", self.advise, f"at most restrict ({self.restrict})")
        for name in ("step_advise", "step_restrict"):
            value = getattr(self, name)
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int) or value < 0
            ):
                raise ConfigError(f"Levels.{name}", value, "an integer >= 0, or None")
        if (
            self.step_advise is not None
            and self.step_restrict is not None
            and self.step_advise < self.step_restrict
        ):
            raise ConfigError(
                "Levels.step_advise",
                self.step_advise,
                f"at least step_restrict ({self.step_restrict})",
            )


_FIELDS: Final = frozenset({"left", "limit_name", "limit", "used", "remaining"})


@dataclass(frozen=True, slots=True, kw_only=True)
class Messages:
    """The texts shown to the model, as ``str.format`` templates the user can replace.

    Placeholders: ``{left}`` (what is left, in words: "about $0.04 of the $0.50 budget left"),
    ``{limit_name}`` (the keyword, e.g. ``max_cost_usd``), ``{limit}``, ``{used}``,
    ``{remaining}``. Templates are checked at construction.
    """

    advise: str = "{left}: start wrapping up."
    """At the advise level."""
    restrict: str = "{left}: answer now from what you have, without tools."
    """At the restrict level (and on the last step)."""
    refused: str = (
        "Tool call refused, the run is near its {limit_name} limit ({left}). "
        "Answer now from what you have, without tools."
    )
    """Returned instead of running tool calls while the run is restricted."""

    def __post_init__(self) -> None:
        for name in ("advise", "restrict", "refused"):
            template = getattr(self, name)
            if not isinstance(template, str):
                raise ConfigError(f"Messages.{name}", template, "a str.format template")
            try:
                used = {f for _, f, _, _ in string.Formatter().parse(template) if f is not None}
            except ValueError as exc:
                raise ConfigError(
                    f"Messages.{name}", template, f"a valid template ({exc})"
                ) from None
            unknown = {u.split(".")[0].split("[")[0] for u in used} - _FIELDS
            if unknown or "" in used:
                raise ConfigError(
                    f"Messages.{name}", template, f"placeholders among {sorted(_FIELDS)}"
                )


def _count(name: str, value: Any) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ConfigError(name, value, "an integer >= 0, or None")


def _positive(name: str, value: Any) -> None:
    if value is None:
        return
    if isinstance(value, int) and not isinstance(value, bool) and value > sys.float_info.max:
        # math.isfinite() of such an int raises OverflowError (10**400), and its repr may not
        # even be printable (over 4,300 digits): name its size instead.
        raise ConfigError(name, f"<an int of {value.bit_length()} bits>", "a finite number > 0, or None")
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ConfigError(name, value, "a finite number > 0, or None")


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    """Every budget of one run, as one typed value. ``None`` switches a limit off.

    Count caps allow exactly their value (the next one is refused before it runs); tokens,
    cost and time stop the run once the total is ``>=`` the limit (they are known only after
    the fact). Make variants with ``dataclasses.replace``.
    """

    max_steps: int | None = None
    """Model calls (requests). Step n+1 is refused before it runs."""
    max_tool_calls: int | None = None
    """Tool calls allowed to run, all tools together."""
    tool_caps: Mapping[str, int] = field(default_factory=dict)
    """Per-tool caps, e.g. ``{"send_email": 1, "search_web": 8}``; 0 forbids a tool."""
    default_tool_cap: int | None = None
    """Cap for each tool not listed in ``tool_caps``."""
    max_duplicate_calls: int | None = None
    """Calls with the same signature (tool + normalized arguments) allowed per run."""
    max_input_tokens: int | None = None
    """Input (prompt) tokens over all model calls; checked after each usage report."""
    max_output_tokens: int | None = None
    """Output (completion) tokens over all model calls; checked after each usage report."""
    max_total_tokens: int | None = None
    """Input + output tokens over all model calls; checked after each usage report."""
    max_cost_usd: float | None = None
    """Cost in USD, from the reported cost or the ``genai-prices`` table. Cannot be enforced
    for calls whose model has no known price (the guard warns once per model)."""
    max_duration_s: float | None = None
    """Wall-clock deadline of the run, from the guard's creation; checked before every step
    and tool call."""
    tool_timeout_s: float | None = None
    """Default timeout of :meth:`Guard.timeout` / :meth:`Guard.atimeout` for one tool call."""
    max_no_progress_steps: int | None = None
    """Consecutive steps whose progress fingerprint did not change; the next step is refused."""
    max_subagents: int | None = None
    """Sub-agents (child guards) this run and its descendants may start."""
    levels: Levels = field(default_factory=Levels)
    """Where the advise / restrict levels start."""
    messages: Messages = field(default_factory=Messages)
    """The texts shown to the model."""

    def __post_init__(self) -> None:
        for name in (
            "max_steps",
            "max_tool_calls",
            "default_tool_cap",
            "max_duplicate_calls",
            "max_no_progress_steps",
            "max_subagents",
        ):
            _count(name, getattr(self, name))
        if self.max_no_progress_steps == 0:
            raise ConfigError("max_no_progress_steps", 0, "an integer >= 1, or None")
        for name in ("max_input_tokens", "max_output_tokens", "max_total_tokens"):
            value = getattr(self, name)
            _count(name, value)
            if value == 0:
                raise ConfigError(name, value, "an integer > 0, or None")
        _positive("max_cost_usd", self.max_cost_usd)
        _positive("max_duration_s", self.max_duration_s)
        _positive("tool_timeout_s", self.tool_timeout_s)
        if not isinstance(self.tool_caps, Mapping):
            raise ConfigError("tool_caps", self.tool_caps, "a mapping of tool name to cap")
        for tool, cap in self.tool_caps.items():
            if not isinstance(tool, str) or not tool:
                raise ConfigError("tool_caps", tool, "non-empty tool names")
            _count(f"tool_caps[{tool!r}]", cap)
            if cap is None:
                raise ConfigError(f"tool_caps[{tool!r}]", cap, "an integer >= 0")
        object.__setattr__(self, "tool_caps", MappingProxyType(dict(self.tool_caps)))
        if not isinstance(self.levels, Levels):
            raise ConfigError("levels", self.levels, "a Levels")
        if not isinstance(self.messages, Messages):
            raise ConfigError("messages", self.messages, "a Messages")

    # -- fast paths ---------------------------------------------------------------------

    def has_limits(self) -> bool:
        """True when any limit is set (a guard with none only counts)."""
        return (
            self.has_tool_limits()
            or self.has_usage_limits()
            or any(
                v is not None
                for v in (
                    self.max_steps,
                    self.max_duration_s,
                    self.max_no_progress_steps,
                    self.max_subagents,
                )
            )
        )

    def has_tool_limits(self) -> bool:
        """True when a cap applies to tool calls (total, per tool, default or duplicates)."""
        return bool(self.tool_caps) or any(
            v is not None
            for v in (self.max_tool_calls, self.default_tool_cap, self.max_duplicate_calls)
        )

    def has_usage_limits(self) -> bool:
        """True when a token or cost limit is set (usage reports need checking)."""
        return any(
            v is not None
            for v in (
                self.max_input_tokens,
                self.max_output_tokens,
                self.max_total_tokens,
                self.max_cost_usd,
            )
        )

    def cap_for(self, tool: str) -> tuple[int | None, str]:
        """The cap that applies to ``tool`` and the name of the setting it comes from."""
        cap = self.tool_caps.get(tool)
        if cap is not None:
            return cap, f"tool_caps[{tool!r}]"
        return self.default_tool_cap, "default_tool_cap"


NO_LIMITS: Final = Limits()
"""No limit at all: the guard only counts (and the loop watcher, if on, still watches)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class RunCounters:
    """A frozen snapshot of what a run consumed. Shared counters include sub-agents' use."""

    steps: int = 0
    """Steps (model calls) started."""
    tool_calls: int = 0
    """Tool calls allowed to run."""
    tool_calls_by_tool: Mapping[str, int] = field(default_factory=dict)
    """Tool calls allowed to run, per tool."""
    max_duplicates: int = 0
    """The most calls allowed with one signature."""
    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    """Cost of the priced model calls (see ``unpriced_calls``)."""
    unpriced_calls: int = 0
    """Model calls whose cost was unknown: ``cost_usd`` undercounts when this is not 0."""
    elapsed_s: float = 0.0
    """Seconds since the run started."""
    no_progress_steps: int = 0
    """Consecutive steps whose progress fingerprint did not change."""
    subagents: int = 0
    """Sub-agents started (by this run and its descendants)."""

    @property
    def total_tokens(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def to_dict(self) -> dict[str, Any]:
        """The counters as a JSON-ready dict."""
        return {
            "steps": self.steps,
            "tool_calls": self.tool_calls,
            "tool_calls_by_tool": dict(self.tool_calls_by_tool),
            "max_duplicates": self.max_duplicates,
            "input_tokens": self.input_tokens,
            "output_tokens": self.output_tokens,
            "total_tokens": self.total_tokens,
            "cost_usd": self.cost_usd,
            "unpriced_calls": self.unpriced_calls,
            "elapsed_s": self.elapsed_s,
            "no_progress_steps": self.no_progress_steps,
            "subagents": self.subagents,
        }


@dataclass(frozen=True, slots=True, kw_only=True)
class Advisory:
    """What the guard has to say about the budget left; show ``message`` to the model.

    ``allowed`` is ``False`` when tool calls were refused (restricted): they were not run and
    not counted; hand ``message`` back to the model as their result.
    """

    level: Level = Level.OK
    message: str = ""
    """The text for the model (empty at ``ok``)."""
    limit_name: str | None = None
    """The setting whose budget the advisory is about, e.g. ``max_cost_usd``."""
    remaining: float | None = None
    """What is left of that budget (in its unit: steps, calls, tokens, USD, seconds)."""
    allowed: bool = True
    """False when the tool calls were refused."""

    @property
    def ok(self) -> bool:
        """True at level ``ok``."""
        return self.level is Level.OK

    def worse(self, other: Advisory) -> Advisory:
        """The more severe of the two (``self`` on a tie)."""
        return other if _RANK[other.level] > _RANK[self.level] else self


OK: Final = Advisory()
"""The advisory for "nothing to say" (a shared constant: the hot path allocates nothing)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Stop:
    """The decision to stop: which limit fired, with what values."""

    reason: StopReason
    limit_name: str
    """The setting that fired, e.g. ``max_tool_calls`` or ``tool_caps['send_email']``."""
    limit: float
    """Its configured value."""
    observed: float
    """The counter's value: what it would become (before-checks) or what it is (after)."""
    counter: str
    """The counter's name, e.g. ``tool_calls`` or ``send_email calls``."""
    used: float
    """The counter before the refused call (equal to ``observed`` for after-the-fact checks)."""
    message: str
    tool: str | None = None

    @property
    def condition(self) -> dict[str, str | int | float | bool | None]:
        """The inputs of the condition, e.g. ``{"tool_calls": 20, "requested": 1,
        "max_tool_calls": 20}`` (``requested`` only for a refused call or batch)."""
        out: dict[str, str | int | float | bool | None] = {self.counter: _num(self.used)}
        if self.observed != self.used:
            out["requested"] = _num(self.observed - self.used)
        out[self.limit_name] = _num(self.limit)
        if self.tool is not None:
            out["tool"] = self.tool
        return out

    def exception(self, **fields: Any) -> BudgetExceeded:
        """The :class:`~tripwire.errors.BudgetExceeded` that stops a run on this decision.

        ``fields`` are passed on (e.g. ``counters=``, ``partial=``, ``receipt=``).
        """
        return BudgetExceeded(
            self.message,
            reason=self.reason,
            limit_name=self.limit_name,
            limit=self.limit,
            observed=self.observed,
            level=Level.STOP.value,
            **fields,
        )


def _num(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


def _fmt(value: float, unit: str = "") -> str:
    if unit == "$":
        return f"${value:.2f}" if value >= 0.01 or value == 0 else f"${value:.4f}"
    text = f"{int(value):,}" if float(value).is_integer() else f"{value:.1f}"
    return f"{text} {unit}".rstrip() if unit else text


def _before(
    what: str, limit_name: str, limit: float, counter: str, observed: float, unit: str = ""
) -> str:
    return (
        f"The next {what} would exceed {limit_name}={_fmt(limit, unit)} ({counter} would be "
        f"{_fmt(observed, unit)}); answer from the work done so far, or raise "
        f"Limits({limit_name.split('[')[0]}=...)"
    )


def _after(limit_name: str, limit: float, counter: str, observed: float, unit: str = "") -> str:
    verb = "Exceeded" if observed > limit else "Reached"
    return (
        f"{verb} {limit_name}={_fmt(limit, unit)} ({counter}={_fmt(observed, unit)}); "
        f"answer from the work done so far, or raise Limits({limit_name}=...)"
    )


# -- tool calls -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Charge:
    """One counter a call (or batch) adds to, with the cap that applies to it."""

    counter: str
    """The ledger counter: ``tool_calls``, ``tool:<name>`` or ``subagents``."""
    amount: int
    cap: int | None
    limit_name: str
    reason: StopReason
    what: str
    """The unit in words, singular: ``tool call``, ``send_email call``, ``sub-agent``."""
    tool: str | None = None


def plan_tool_calls(limits: Limits, tools: Sequence[str]) -> tuple[Charge, ...]:
    """The counters a batch of tool calls adds to: each tool's own counter first, then the total.

    Repeated tools in the batch are added up. Counters without a cap are listed too (with
    ``cap=None``), so the ledger keeps per-tool counts for the snapshot.
    """
    per_tool: dict[str, int] = {}
    for tool in tools:
        per_tool[tool] = per_tool.get(tool, 0) + 1
    charges = []
    for tool, n in per_tool.items():
        cap, name = limits.cap_for(tool)
        charges.append(
            Charge(
                f"tool:{tool}",
                n,
                cap,
                name,
                StopReason.MAX_TOOL_CALLS_FOR_TOOL,
                f"{tool} call",
                tool,
            )
        )
    charges.append(
        Charge(
            "tool_calls",
            len(tools),
            limits.max_tool_calls,
            "max_tool_calls",
            StopReason.MAX_TOOL_CALLS,
            "tool call",
        )
    )
    return tuple(charges)


def plan_subagent(limits: Limits) -> Charge:
    """The counter starting one sub-agent adds to."""
    return Charge(
        "subagents", 1, limits.max_subagents, "max_subagents", StopReason.MAX_SUBAGENTS, "sub-agent"
    )


def charge_stop(charge: Charge, used: int) -> Stop:
    """The stop for ``charge`` refused with the counter at ``used``."""
    assert charge.cap is not None
    counter = charge.counter.removeprefix("tool:") + " calls" if charge.tool else charge.counter
    what = charge.what if charge.amount == 1 else f"batch of {charge.amount} {charge.what}s"
    observed = used + charge.amount
    return Stop(
        reason=charge.reason,
        limit_name=charge.limit_name,
        limit=charge.cap,
        observed=observed,
        counter=counter,
        used=used,
        message=_before(what, charge.limit_name, charge.cap, counter, observed),
        tool=charge.tool,
    )


def check_charges(charges: Sequence[Charge], used: Mapping[str, int]) -> Stop | None:
    """The first charge that would take its counter over its cap, as a :class:`Stop`."""
    for charge in charges:
        if charge.cap is not None:
            current = used.get(charge.counter, 0)
            if current + charge.amount > charge.cap:
                return charge_stop(charge, current)
    return None


def check_duplicates(
    limits: Limits, counts: Mapping[int, int], batch: Sequence[tuple[str, int]]
) -> Stop | None:
    """Refuse a batch that would take some signature over ``max_duplicate_calls``.

    Args:
        limits: the limits.
        counts: calls allowed so far, per signature key.
        batch: ``(tool, signature key)`` of each call in the batch.
    """
    cap = limits.max_duplicate_calls
    if cap is None:
        return None
    extra: dict[int, int] = {}
    for tool, key in batch:
        extra[key] = n = extra.get(key, 0) + 1
        used = counts.get(key, 0)
        if used + n > cap:
            return Stop(
                reason=StopReason.MAX_DUPLICATE_CALLS,
                limit_name="max_duplicate_calls",
                limit=cap,
                observed=used + n,
                counter="duplicate_calls",
                used=used + n - 1,
                message=_before(
                    f"identical {tool} call",
                    "max_duplicate_calls",
                    cap,
                    "identical calls",
                    used + n,
                ),
                tool=tool,
            )
    return None


def check_before_tool_calls(
    limits: Limits,
    counters: RunCounters,
    batch: Sequence[tuple[str, int]],
    duplicates: Mapping[int, int] | None = None,
) -> Stop | None:
    """Refuse a batch of tool calls that would take any cap over its limit (pure form).

    The guard applies the same caps atomically through its ledger; this is the reference it
    follows. Checks the caps per tool, then duplicates, then the total.
    """
    used = {f"tool:{t}": n for t, n in counters.tool_calls_by_tool.items()}
    used["tool_calls"] = counters.tool_calls
    charges = plan_tool_calls(limits, [t for t, _ in batch])
    per_tool = check_charges(charges[:-1], used)
    if per_tool is not None:
        return per_tool
    dup = check_duplicates(limits, duplicates or {}, batch)
    if dup is not None:
        return dup
    return check_charges(charges[-1:], used)


def count_advisory(limits: Limits, charge: Charge, used: int) -> Advisory | None:
    """The advisory for a count cap after a charge brought it to ``used`` (None when quiet)."""
    cap = charge.cap
    advise = limits.levels.advise
    if cap is None or advise is None or cap == 0:
        return None
    if used < cap * advise and used < cap:
        return None
    left = cap - used
    unit = charge.what + ("" if left == 1 else "s")
    words = (
        f"{left} of {cap} {unit} left"
        if left
        else f"no {charge.what}s left (the next one stops the run)"
    )
    return _advisory(limits, Level.ADVISE, words, charge.limit_name, cap, used, left)


def _advisory(
    limits: Limits,
    level: Level,
    left: str,
    limit_name: str,
    limit: float,
    used: float,
    remaining: float,
    *,
    allowed: bool = True,
) -> Advisory:
    msgs = limits.messages
    template = (
        msgs.refused if not allowed else (msgs.restrict if level is Level.RESTRICT else msgs.advise)
    )
    text = template.format(
        left=left,
        limit_name=limit_name,
        limit=_num(limit),
        used=_num(used),
        remaining=_num(remaining),
    )
    return Advisory(
        level=level, message=text, limit_name=limit_name, remaining=remaining, allowed=allowed
    )


def refused(limits: Limits, advisory: Advisory) -> Advisory:
    """The advisory returned instead of running tool calls while ``advisory`` restricts."""
    name = advisory.limit_name or ""
    remaining = advisory.remaining or 0.0
    limit = _limit_value(limits, name)
    used = limit - remaining if name != "max_steps" else limit
    return _advisory(
        limits,
        Level.RESTRICT,
        _left_words(name, remaining, limits),
        name,
        limit,
        used,
        remaining,
        allowed=False,
    )


def _limit_value(limits: Limits, name: str | None) -> float:
    value = getattr(limits, name, None) if name else None
    return float(value) if isinstance(value, (int, float)) else 0.0


_CONSUMABLE: Final = (
    ("max_cost_usd", "cost_usd", "$", StopReason.MAX_COST),
    ("max_input_tokens", "input_tokens", "input tokens", StopReason.MAX_INPUT_TOKENS),
    ("max_output_tokens", "output_tokens", "output tokens", StopReason.MAX_OUTPUT_TOKENS),
    ("max_total_tokens", "total_tokens", "total tokens", StopReason.MAX_TOTAL_TOKENS),
)


def _left_words(limit_name: str, remaining: float, limits: Limits) -> str:
    limit = _limit_value(limits, limit_name)
    if limit_name == "max_steps":
        r = int(remaining)
        return (
            "this is the last step"
            if r <= 0
            else f"{r} more step{'s' if r != 1 else ''} after this one"
        )
    if limit_name == "max_cost_usd":
        return f"about {_fmt(max(remaining, 0.0), '$')} of the {_fmt(limit, '$')} budget left"
    if limit_name == "max_duration_s":
        return f"about {max(remaining, 0.0):.0f} s of {limit:g} s left"
    if limit_name == "max_no_progress_steps":
        r = int(remaining)
        return f"{r} more step{'s' if r != 1 else ''} without progress allowed"
    for name, _, unit, _ in _CONSUMABLE:
        if name == limit_name:
            return f"about {_fmt(max(remaining, 0.0))} of {_fmt(limit)} {unit} left"
    return f"{_fmt(remaining)} left"


def _fraction_level(levels: Levels, used: float, limit: float) -> Level:
    if used >= limit:
        return Level.STOP
    if levels.restrict is not None and used >= limit * levels.restrict:
        return Level.RESTRICT
    if levels.advise is not None and used >= limit * levels.advise:
        return Level.ADVISE
    return Level.OK


def _value(counters: RunCounters, counter: str) -> float:
    return float(getattr(counters, counter))


# -- usage (after the fact) -------------------------------------------------------------------


def check_usage(limits: Limits, counters: RunCounters) -> Stop | None:
    """After a usage report: stop when tokens or cost reached their limit (``>=``).

    Checked in this order, the first that fired wins: cost, input, output, total tokens.
    """
    for limit_name, counter, unit, reason in _CONSUMABLE:
        limit = getattr(limits, limit_name)
        if limit is None:
            continue
        used = _value(counters, counter)
        if used >= limit:
            shown = "$" if unit == "$" else ""
            return Stop(
                reason=reason,
                limit_name=limit_name,
                limit=limit,
                observed=used,
                counter=counter,
                used=used,
                message=_after(limit_name, limit, counter, used, shown),
            )
    return None


def usage_advisory(limits: Limits, counters: RunCounters) -> Advisory:
    """The most severe advisory from tokens, cost and time (:data:`OK` when all are quiet)."""
    best = OK
    checks: list[tuple[str, float, float]] = []
    for limit_name, counter, _, _ in _CONSUMABLE:
        limit = getattr(limits, limit_name)
        if limit is not None:
            checks.append((limit_name, _value(counters, counter), float(limit)))
    if limits.max_duration_s is not None:
        checks.append(("max_duration_s", counters.elapsed_s, limits.max_duration_s))
    for limit_name, used, limit in checks:
        level = _fraction_level(limits.levels, used, limit)
        if level is Level.OK or level is Level.STOP:
            continue
        if _RANK[level] > _RANK[best.level]:
            remaining = limit - used
            best = _advisory(
                limits,
                level,
                _left_words(limit_name, remaining, limits),
                limit_name,
                limit,
                used,
                remaining,
            )
    return best


def check_duration(limits: Limits, elapsed_s: float, what: str = "step") -> Stop | None:
    """Before a step or tool call: stop once ``elapsed_s >= max_duration_s``."""
    limit = limits.max_duration_s
    if limit is None or elapsed_s < limit:
        return None
    return Stop(
        reason=StopReason.MAX_DURATION,
        limit_name="max_duration_s",
        limit=limit,
        observed=elapsed_s,
        counter="duration_s",
        used=elapsed_s,
        message=(
            f"The run's deadline passed before the next {what}: max_duration_s={limit:g} "
            f"(duration_s={elapsed_s:.3f}); answer from the work done so far, or raise "
            "Limits(max_duration_s=...)"
        ),
    )


# -- steps ------------------------------------------------------------------------------------


def check_before_step(limits: Limits, counters: RunCounters) -> Stop | Advisory:
    """Before the next step (model call): refuse it, or say how close the run is to its limits.

    ``counters.steps`` is the number of steps already started. Checks, first that fires wins:
    deadline, steps, no progress, tokens/cost already at their limit (e.g. spent by a
    sub-agent on the shared ledger). Otherwise returns the most severe advisory of the step
    schedule, tokens, cost, time and no-progress streak.
    """
    stop = check_duration(limits, counters.elapsed_s, "step")
    if stop is not None:
        return stop
    step = counters.steps + 1
    max_steps = limits.max_steps
    if max_steps is not None and step > max_steps:
        return Stop(
            reason=StopReason.MAX_STEPS,
            limit_name="max_steps",
            limit=max_steps,
            observed=step,
            counter="steps",
            used=counters.steps,
            message=_before("step", "max_steps", max_steps, "steps", step),
        )
    cap = limits.max_no_progress_steps
    if cap is not None and counters.no_progress_steps >= cap:
        return Stop(
            reason=StopReason.NO_PROGRESS,
            limit_name="max_no_progress_steps",
            limit=cap,
            observed=counters.no_progress_steps + 1,
            counter="no_progress_steps",
            used=counters.no_progress_steps,
            message=(
                f"The next step would exceed max_no_progress_steps={cap} ("
                f"{counters.no_progress_steps} consecutive steps without progress); change "
                "approach or answer from the work done so far, or raise "
                "Limits(max_no_progress_steps=...)"
            ),
        )
    usage = check_usage(limits, counters)
    if usage is not None:
        return usage

    best = usage_advisory(limits, counters)
    if max_steps is not None:
        left_after = max_steps - step
        levels = limits.levels
        level = Level.OK
        if levels.step_restrict is not None and left_after <= levels.step_restrict:
            level = Level.RESTRICT
        elif levels.step_advise is not None and left_after <= levels.step_advise:
            level = Level.ADVISE
        if level is not Level.OK and _RANK[level] > _RANK[best.level]:
            best = _advisory(
                limits,
                level,
                _left_words("max_steps", left_after, limits),
                "max_steps",
                max_steps,
                step,
                left_after,
            )
    if cap is not None and best.level is Level.OK:
        advise = limits.levels.advise
        streak = counters.no_progress_steps
        if advise is not None and streak >= cap * advise:
            best = _advisory(
                limits,
                Level.ADVISE,
                _left_words("max_no_progress_steps", cap - streak, limits),
                "max_no_progress_steps",
                cap,
                streak,
                cap - streak,
            )
    return best


# -- the meter ----------------------------------------------------------------------------------

MAX_METERED_TOOLS: Final = 64
"""Distinct tools one :class:`Meter` counts per tool at most (only capped tools are counted);
the calls of further tools are counted in the total only (:attr:`Meter.untracked`)."""

MAX_TOOL_KEY: Final = 256
"""Longer tool names are counted under a clipped key (bounded bytes per run, whatever the
names): the first characters and a hash of the rest."""


def _tool_key(tool: str) -> str:
    if len(tool) <= MAX_TOOL_KEY:
        return tool
    return f"{tool[:64]}…#{hash(tool) & 0xFFFFFFFFFFFF:012x}"


class Meter:
    """One run's budget meter, observed after the fact: counters in, decisions out.

    Feed it each finished tool call (:meth:`tool_call`) and model call (:meth:`model_call`) with
    their times; each returns the :class:`Stop` decisions that call brought, at most once per
    limit (a run's stop is reported once; a per-tool cap once per tool). The question each check
    asks is the one the runtime's next check answers: "may the run take its next step?". A count
    cap of n (``max_tool_calls``, ``max_steps``, per-tool caps) is reached when the n-th call
    *ends*; tokens, cost and time stop the run once their total is ``>=`` the limit.

    Bounded: a few ints, and per-tool counts for at most :data:`MAX_METERED_TOOLS` capped tools
    under keys of at most :data:`MAX_TOOL_KEY` characters. Not thread-safe (its owner locks).
    The guard counts in its ledger and decides with the same pure checks.

    Args:
        limits: the run's limits.
    """

    __slots__ = (
        "_by_tool",
        "_per_tool",
        "_stopped",
        "_tool_stops",
        "cost_nusd",
        "first_start_s",
        "input_tokens",
        "last_end_s",
        "limits",
        "output_tokens",
        "steps",
        "tool_calls",
        "unpriced",
        "untracked",
    )

    def __init__(self, limits: Limits) -> None:
        self.limits = limits
        """The limits decided on."""
        self._per_tool = bool(limits.tool_caps) or limits.default_tool_cap is not None
        self.steps = 0
        """Model calls counted."""
        self.tool_calls = 0
        """Tool calls counted."""
        self._by_tool: dict[str, int] | None = None
        self.input_tokens = 0
        self.output_tokens = 0
        self.cost_nusd = 0
        """Cost in integer nano-dollars (exact sums)."""
        self.unpriced = 0
        """Model calls whose cost was unknown."""
        self.untracked = 0
        """Tool calls not counted per tool (beyond :data:`MAX_METERED_TOOLS` capped tools)."""
        self.first_start_s: float | None = None
        """The earliest start among the calls seen (seconds, the calls' clock)."""
        self.last_end_s: float | None = None
        """The latest end among them."""
        self._stopped = False
        self._tool_stops: set[str] | None = None

    @property
    def stopped(self) -> bool:
        """True once a run-level stop was returned (it is returned once)."""
        return self._stopped

    @property
    def elapsed_s(self) -> float:
        """Seconds from the earliest start to the latest end seen (0 before any)."""
        if self.first_start_s is None or self.last_end_s is None:
            return 0.0
        return max(0.0, self.last_end_s - self.first_start_s)

    def _see(self, start_s: float | None, end_s: float | None) -> None:
        for t in (start_s, end_s):
            if t is None:
                continue
            if self.first_start_s is None or t < self.first_start_s:
                self.first_start_s = t
            if self.last_end_s is None or t > self.last_end_s:
                self.last_end_s = t

    def counters(self) -> RunCounters:
        """A snapshot of what the run consumed."""
        return RunCounters(
            steps=self.steps,
            tool_calls=self.tool_calls,
            tool_calls_by_tool=dict(self._by_tool or {}),
            input_tokens=self.input_tokens,
            output_tokens=self.output_tokens,
            cost_usd=self.cost_nusd / NANO,
            unpriced_calls=self.unpriced,
            elapsed_s=self.elapsed_s,
        )

    def tool_call(
        self, tool: str, start_s: float | None = None, end_s: float | None = None
    ) -> tuple[tuple[Stop, bool], ...]:
        """Count one finished tool call; the stops it brings, as ``(stop, tool_only)``.

        ``tool_only`` is True for a per-tool cap (refuse that tool only, not the run). Per-tool
        stops come first, the run's last.
        """
        self._see(start_s, end_s)
        self.tool_calls += 1
        limits = self.limits
        stops: tuple[tuple[Stop, bool], ...] = ()
        if self._per_tool:
            cap, name = limits.cap_for(tool)
            if cap is not None:
                key = _tool_key(tool)
                by_tool = self._by_tool
                if by_tool is None:
                    by_tool = self._by_tool = {}
                used = by_tool.get(key)
                if used is None and len(by_tool) >= MAX_METERED_TOOLS:
                    self.untracked += 1
                else:
                    by_tool[key] = used = (used or 0) + 1
                    done = self._tool_stops
                    if done is None or key not in done:
                        # the next call of this tool would take the count to used + 1
                        charge = Charge(
                            f"tool:{key}", 1, cap, name, StopReason.MAX_TOOL_CALLS_FOR_TOOL,
                            f"{key} call", key,
                        )  # fmt: skip
                        stop = check_charges((charge,), {charge.counter: used})
                        if stop is not None:
                            if done is None:
                                done = self._tool_stops = set()
                            done.add(key)
                            stops = ((stop, True),)
        if not self._stopped:
            stop = None
            cap_total = limits.max_tool_calls
            if cap_total is not None and self.tool_calls + 1 > cap_total:
                stop = charge_stop(
                    Charge(
                        "tool_calls", 1, cap_total, "max_tool_calls", StopReason.MAX_TOOL_CALLS,
                        "tool call",
                    ),
                    self.tool_calls,
                )  # fmt: skip
            if stop is None and limits.max_duration_s is not None:
                stop = check_duration(limits, self.elapsed_s, "step")
            if stop is not None:
                self._stopped = True
                stops = (*stops, (stop, False))
        return stops

    def model_call(
        self,
        input_tokens: int,
        output_tokens: int,
        cost_usd: float | None,
        start_s: float | None = None,
        end_s: float | None = None,
    ) -> Stop | None:
        """Count one finished model call (a step) with its usage; the run's stop, if it brings one.

        ``cost_usd`` is ``None`` when the call could not be priced (counted in ``unpriced``).
        """
        self._see(start_s, end_s)
        self.steps += 1
        self.input_tokens += input_tokens
        self.output_tokens += output_tokens
        if cost_usd is not None:
            self.cost_nusd += round(min(cost_usd, 1e18) * NANO)  # 1e300 must not overflow
        elif self.limits.max_cost_usd is not None:
            self.unpriced += 1
        if self._stopped:
            return None
        decision = check_before_step(self.limits, self.counters())
        if isinstance(decision, Stop):
            self._stopped = True
            return decision
        return None
