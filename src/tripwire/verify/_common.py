"""Shared plumbing of the outcome verifiers: the timeout, the clock, the never-raise wrapper.

Every verifier is a small frozen value, validated when it is built (bad settings raise
:class:`~tripwire.errors.ConfigError` there, loudly), and called once at the end of a run.
The call never raises: an exception or a timeout inside the check becomes a failed
:class:`~tripwire.core.receipt.OutcomeReceipt` whose ``error`` says what happened.

Errors are redacted like everything else a receipt holds: the error text keeps its type and
its first line, with every quoted literal, every ``key=(value)`` detail, every e-mail address
and every value the check was given to send (bind parameters, headers) replaced by ``…``.
Drivers quote the offending value in their messages (PostgreSQL: ``invalid input syntax for
type integer: "alice@example.com"``); the receipt, and ``tripwire explain``, never show it.
"""

from __future__ import annotations

import importlib
import math
import re
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Final, Protocol

from tripwire.core.receipt import Evidence, OutcomeReceipt, Scalar, VerifierKind
from tripwire.errors import ConfigError

__all__ = [
    "DEFAULT_TIMEOUT_S",
    "Clock",
    "Deadline",
    "Finding",
    "Verifier",
    "describe_error",
    "redact",
    "require",
    "run_check",
]

Clock = Callable[[], float]
"""A wall clock returning seconds (``time.time``); inject a fixed one in tests."""

DEFAULT_TIMEOUT_S: Final = 10.0
"""Default time budget of one check, in seconds."""

_MAX_ERROR_CHARS: Final = 300
_JOIN_S: Final = 1.0
"""After a timeout, the longest wait for the worker to notice and end (it is told to stop):
``min(timeout_s, _JOIN_S)``. The checks shipped here stop within milliseconds."""
_QUOTED: Final = re.compile(r"\"(?:[^\"\\]|\\.)*\"|'(?:[^'\\]|\\.)*'")
_KEY_VALUE: Final = re.compile(r"=\([^)]*\)")
_EMAIL: Final = re.compile(r"[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_MIN_SECRET: Final = 2
"""Given values shorter than this are not searched for (a "1" would blank every digit)."""


class Deadline:
    """The time budget of one check, shared by ``run_check`` and the check body.

    The body polls :meth:`expired` (or calls :meth:`check`) in its loops and passes
    :meth:`remaining` to the clients it uses; ``run_check`` calls :meth:`cancel` when the
    budget is spent, so a body that is still running stops at its next poll.
    """

    __slots__ = ("_cancelled", "_end")

    def __init__(self, timeout_s: float) -> None:
        self._end = time.monotonic() + timeout_s
        self._cancelled = threading.Event()

    def remaining(self) -> float:
        """Seconds left (0 when spent or cancelled)."""
        if self._cancelled.is_set():
            return 0.0
        return max(0.0, self._end - time.monotonic())

    def expired(self) -> bool:
        """True when the budget is spent or the check was cancelled."""
        return self.remaining() <= 0.0

    def check(self) -> None:
        """Raise ``TimeoutError`` when :meth:`expired`."""
        if self.expired():
            raise TimeoutError("the check ran out of time")

    def cancel(self) -> None:
        """Tell the body to stop."""
        self._cancelled.set()


class Verifier(Protocol):
    """An outcome check: calling it checks the destination and returns a receipt.

    Contract: it returns within about its ``timeout_s`` (plus at most as long again, and at
    most 1 s, for a timed-out check to stop) and never raises; failures and timeouts come
    back as receipts with ``passed=False`` and an ``error``.
    """

    def __call__(self) -> OutcomeReceipt: ...


@dataclass(frozen=True, slots=True)
class Finding:
    """What a check body found: pass/fail and the observed values."""

    passed: bool
    """Whether every expectation held."""
    observed: dict[str, Scalar] = field(default_factory=dict)
    """The values the check saw."""
    error: str | None = None
    """Why the check could not decide, when it could not (forces ``passed=False``)."""


def require(module: str, *, extra: str = "verify") -> ModuleType:
    """Import an optional dependency or say which extra to install.

    Raises:
        ModuleNotFoundError: naming the module and the ``pip install`` command.
    """
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ModuleNotFoundError(
            f"{module} is needed for this verifier and is not installed: "
            f"pip install 'tripwire[{extra}]'",
            name=module,
        ) from None


def check_timeout(owner: str, timeout_s: Any) -> None:
    """Validate a verifier's ``timeout_s`` at construction."""
    if (
        isinstance(timeout_s, bool)
        or not isinstance(timeout_s, (int, float))
        or not math.isfinite(timeout_s)
        or timeout_s <= 0
    ):
        raise ConfigError(f"{owner}.timeout_s", timeout_s, "a finite number of seconds > 0")


def redact(text: str, secrets: Iterable[Scalar] = ()) -> str:
    """``text`` without the values it may quote: see the module docstring."""
    for secret in sorted({str(v) for v in secrets if v is not None}, key=len, reverse=True):
        if len(secret) >= _MIN_SECRET:
            text = text.replace(secret, "…")
    text = _QUOTED.sub(lambda m: m.group(0)[0] + "…" + m.group(0)[0], text)
    text = _KEY_VALUE.sub("=(…)", text)
    return _EMAIL.sub("…", text)


def describe_error(exc: BaseException, secrets: Iterable[Scalar] = ()) -> str:
    """``"Type: first line of the message"``, redacted and bounded; never a traceback."""
    try:
        message = str(exc).strip()
    except Exception:  # a hostile __str__: the type still says something
        message = ""
    text = message.splitlines()[0] if message else ""
    text = text.split("[SQL:", 1)[0].strip()  # SQLAlchemy appends the statement and params
    text = redact(text, secrets)
    if len(text) > _MAX_ERROR_CHARS:
        text = text[: _MAX_ERROR_CHARS - 1] + "…"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def run_check(
    *,
    kind: VerifierKind,
    target: str,
    checked_by: str,
    expected: Mapping[str, Scalar],
    timeout_s: float,
    clock: Clock,
    body: Callable[[Deadline], Finding],
    evidence: Evidence = Evidence.INDEPENDENT,
    secrets: Iterable[Scalar] = (),
) -> OutcomeReceipt:
    """Run ``body`` on a worker thread with a deadline and turn the outcome into a receipt.

    ``body`` gets the :class:`Deadline`: it passes the time left to the client it uses and
    polls it in its loops. On a timeout the deadline is cancelled and the worker is given
    ``min(timeout_s, 1 s)`` to end; a body that ignores its deadline is abandoned (a daemon thread:
    Python cannot kill threads). ``secrets`` are values the check sent (bind parameters,
    headers) that must not appear in the error. ``checked_at`` is read from ``clock`` before
    the check starts.
    """
    checked_at = clock()
    box: dict[str, Any] = {}
    finished = threading.Event()
    deadline = Deadline(timeout_s)

    def work() -> None:
        # The verifier boundary: whatever the check raises becomes a failed receipt, so the
        # agent runtime that asked for the check never sees an exception from it.
        try:
            box["finding"] = body(deadline)
        except BaseException as exc:
            box["error"] = exc
        finally:
            finished.set()

    worker = threading.Thread(target=work, name=f"tripwire-verify-{kind.value}", daemon=True)
    worker.start()
    if not finished.wait(timeout_s):
        deadline.cancel()
        finished.wait(min(timeout_s, _JOIN_S))
        finding = Finding(False, error=f"timed out after {timeout_s:g} s")
    elif "error" in box:
        if isinstance(box["error"], TimeoutError) and deadline.expired():
            finding = Finding(False, error=f"timed out after {timeout_s:g} s")
        else:
            finding = Finding(False, error=describe_error(box["error"], secrets))
    else:
        finding = box["finding"]
        if finding.error is not None:
            finding = Finding(False, finding.observed, redact(finding.error, secrets))
    try:
        return OutcomeReceipt(
            kind=kind,
            target=target,
            checked_at=checked_at,
            passed=finding.passed and finding.error is None,
            checked_by=checked_by,
            evidence=evidence,
            observed=finding.observed,
            expected=expected,
            error=finding.error,
        )
    except ConfigError as exc:  # observed values the receipt cannot hold
        return OutcomeReceipt(
            kind=kind,
            target=target,
            checked_at=checked_at,
            passed=False,
            checked_by=checked_by,
            evidence=evidence,
            expected=expected,
            error=f"the check returned an invalid value: {exc.field} must be {exc.expected}",
        )


def to_scalar(value: Any) -> Scalar:
    """A JSON scalar standing for ``value`` (decimals, dates, UUIDs and bytes as text)."""
    if value is None or isinstance(value, (bool, int, str)):
        return value if not isinstance(value, str) else value[:500]
    if isinstance(value, float):
        return value if math.isfinite(value) else str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return f"<{len(value)} bytes>"
    isoformat = getattr(value, "isoformat", None)
    if callable(isoformat):
        return str(isoformat())
    return str(value)[:500]
