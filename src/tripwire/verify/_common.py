"""Shared plumbing of the outcome verifiers: the timeout, the clock, the never-raise wrapper.

Every verifier is a small frozen value, validated when it is built (bad settings raise
:class:`~tripwire.errors.ConfigError` there, loudly), and called once at the end of a run.
The call never raises: an exception or a timeout inside the check becomes a failed
:class:`~tripwire.core.receipt.OutcomeReceipt` whose ``error`` says what happened.
"""

from __future__ import annotations

import importlib
import math
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any, Final, Protocol

from tripwire.core.receipt import Evidence, OutcomeReceipt, Scalar, VerifierKind
from tripwire.errors import ConfigError

__all__ = ["DEFAULT_TIMEOUT_S", "Clock", "Finding", "Verifier", "require", "run_check"]

Clock = Callable[[], float]
"""A wall clock returning seconds (``time.time``); inject a fixed one in tests."""

DEFAULT_TIMEOUT_S: Final = 10.0
"""Default time budget of one check, in seconds."""

_MAX_ERROR_CHARS: Final = 300


class Verifier(Protocol):
    """An outcome check: calling it checks the destination and returns a receipt.

    Contract: it returns within about its ``timeout_s`` and never raises; failures and
    timeouts come back as receipts with ``passed=False`` and an ``error``.
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


def describe_error(exc: BaseException) -> str:
    """``"Type: first line of the message"``, bounded; never a traceback or a payload dump."""
    text = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    text = text.split("[SQL:", 1)[0].strip()  # SQLAlchemy appends the statement and params
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
    body: Callable[[], Finding],
    evidence: Evidence = Evidence.INDEPENDENT,
) -> OutcomeReceipt:
    """Run ``body`` on a worker thread with a deadline and turn the outcome into a receipt.

    The worker is a daemon thread: a check that overruns its deadline is abandoned, not
    killed (Python cannot kill threads), so bodies should also pass ``timeout_s`` to the
    client they use. ``checked_at`` is read from ``clock`` before the check starts.
    """
    checked_at = clock()
    box: dict[str, Any] = {}
    finished = threading.Event()

    def work() -> None:
        # The verifier boundary: whatever the check raises becomes a failed receipt, so the
        # agent runtime that asked for the check never sees an exception from it.
        try:
            box["finding"] = body()
        except BaseException as exc:
            box["error"] = exc
        finally:
            finished.set()

    worker = threading.Thread(target=work, name=f"tripwire-verify-{kind.value}", daemon=True)
    worker.start()
    if not finished.wait(timeout_s):
        finding = Finding(False, error=f"timed out after {timeout_s:g} s")
    elif "error" in box:
        finding = Finding(False, error=describe_error(box["error"]))
    else:
        finding = box["finding"]
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
