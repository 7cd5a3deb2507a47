"""Every exception tripwire raises, in one tree.

::

    TripwireError
    ├── RunStopped                 .reason: StopReason, .receipt: StopReceipt | None
    │   ├── LoopDetected           .rule .tool .hits .window .period .call_index .digest
    │   └── BudgetExceeded         .limit_name .limit .observed .level
    ├── ConfigError(TripwireError, ValueError)   .field .value .expected
    └── InputError(TripwireError, ValueError)    .source .detail .line

``RunStopped`` and its subclasses are *run outcomes*: the agent-facing boundary raises them on
purpose to stop a run. ``ConfigError`` and ``InputError`` are mistakes in what the developer or
a data source handed to tripwire; they subclass ``ValueError`` so existing ``except ValueError``
clauses keep working.

Every exception carries structured fields and builds its message from them: what happened,
with values, then what to do. Messages name the tool and a digest prefix, never raw
arguments. All of them survive pickling (they are rebuilt from their keyword fields).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from tripwire.core.reasons import Rule, StopReason

__all__ = [
    "BudgetExceeded",
    "ConfigError",
    "InputError",
    "LoopDetected",
    "RunStopped",
    "TripwireError",
]


def _rebuild(cls: type[TripwireError], fields: dict[str, Any]) -> TripwireError:
    return cls(**fields)


class TripwireError(Exception):
    """Base class of every exception tripwire raises."""

    def __init__(self, message: str, **fields: Any) -> None:
        super().__init__(message)
        self._fields = dict(fields, message=message)

    def __reduce__(self) -> tuple[Any, ...]:
        return (_rebuild, (type(self), self._fields))

    @property
    def message(self) -> str:
        """The message, as ``str(exc)`` gives it."""
        return str(self.args[0])


class RunStopped(TripwireError):
    """The run was stopped on purpose; ``reason`` says which condition fired.

    ``receipt`` is the run's stop receipt when the raiser had one at hand, else ``None``.
    ``counters`` is the guard's counter snapshot at the stop (``None`` outside the guard), and
    ``partial`` whatever the runner's partial-answer hook built from the run state.
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        reason: StopReason,
        receipt: Any = None,
        counters: Any = None,
        partial: Any = None,
        **fields: Any,
    ) -> None:
        self.reason = reason
        self.receipt = receipt
        self.counters = counters
        self.partial = partial
        super().__init__(
            message or f"run stopped: {reason.value}",
            reason=reason,
            receipt=receipt,
            counters=counters,
            partial=partial,
            **fields,
        )


class LoopDetected(RunStopped):
    """A loop rule tripped: the same action (or a short cycle of actions) kept repeating.

    Fields: ``rule`` (a :class:`~tripwire.core.reasons.Rule`), ``tool``, ``hits`` (how many
    times the repeated unit occurred), ``window``, ``period`` (cycle length, 1 for a plain
    repetition), ``call_index`` (1-based index of the call at which it tripped), ``digest``
    (signature digest prefix; never the raw arguments).
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        rule: Rule,
        tool: str,
        hits: int,
        window: int,
        period: int,
        call_index: int,
        digest: str = "",
        reason: StopReason | None = None,
        receipt: Any = None,
        counters: Any = None,
        partial: Any = None,
    ) -> None:
        from tripwire.core.reasons import stop_reason_for
        from tripwire.core.rules import loop_message

        self.rule = rule
        self.tool = tool
        self.hits = hits
        self.window = window
        self.period = period
        self.call_index = call_index
        self.digest = digest
        if reason is None:
            reason = stop_reason_for(rule)
        if message is None:
            message = loop_message(
                rule,
                tool=tool,
                hits=hits,
                window=window,
                period=period,
                call_index=call_index,
                digest=digest,
            )
        super().__init__(
            message,
            reason=reason,
            receipt=receipt,
            counters=counters,
            partial=partial,
            rule=rule,
            tool=tool,
            hits=hits,
            window=window,
            period=period,
            call_index=call_index,
            digest=digest,
        )


class BudgetExceeded(RunStopped):
    """A budget limit fired.

    Fields: ``limit_name`` (the keyword the user set, e.g. ``"max_tool_calls"``), ``limit``
    (its configured value), ``observed`` (the counter that crossed it), ``level`` (the
    graduated level reached, normally ``"stop"``).
    """

    def __init__(
        self,
        message: str | None = None,
        *,
        reason: StopReason,
        limit_name: str,
        limit: float,
        observed: float,
        level: str = "stop",
        receipt: Any = None,
        **fields: Any,
    ) -> None:
        self.limit_name = limit_name
        self.limit = limit
        self.observed = observed
        self.level = level
        if message is None:
            message = (
                f"{limit_name}={limit:g} reached ({limit_name.removeprefix('max_')}="
                f"{observed:g}); stop the run and answer from the work done so far, or raise "
                f"Limits({limit_name}=...)"
            )
        super().__init__(
            message,
            reason=reason,
            receipt=receipt,
            limit_name=limit_name,
            limit=limit,
            observed=observed,
            level=level,
            **fields,
        )


def _shown(value: Any) -> str:
    """``repr(value)`` for a message, cut at 200 characters; never raises (an int past the
    interpreter's 4,300-digit limit, or an object whose ``__repr__`` raises, is named instead)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 1000:
        return f"<an int of {value.bit_length()} bits>"
    try:
        text = repr(value)
    except Exception:
        return f"<a {type(value).__name__} that cannot be shown>"
    return text if len(text) <= 200 else text[:200] + "…"


class ConfigError(TripwireError, ValueError):
    """A setting is invalid: names the ``field``, the ``value`` given and what is ``expected``."""

    def __init__(self, field: str, value: Any, expected: str, message: str | None = None) -> None:
        self.field = field
        self.value = value
        self.expected = expected
        if message is None:
            message = f"{field} must be {expected}, got {_shown(value)}"
        super().__init__(message, field=field, value=value, expected=expected)

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.field, self.value, self.expected, self.message))


class InputError(TripwireError, ValueError):
    """Input data is malformed or over a cap (OTLP, arguments, receipts).

    ``source`` names where it came from (a file path, ``"<stdin>"``, a field), ``line`` the
    1-based line for line-oriented input, ``detail`` what is wrong.
    """

    def __init__(self, source: str, detail: str, line: int | None = None) -> None:
        self.source = source
        self.detail = detail
        self.line = line
        where = f"{source}:{line}" if line is not None else source
        super().__init__(f"{where}: {detail}")

    def __reduce__(self) -> tuple[Any, ...]:
        return (type(self), (self.source, self.detail, self.line))
