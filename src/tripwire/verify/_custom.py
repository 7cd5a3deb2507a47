"""Custom verifier: any callable that checks the destination and answers pass or fail."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from tripwire.core.receipt import Evidence, OutcomeReceipt, Scalar, VerifierKind
from tripwire.errors import ConfigError
from tripwire.verify._common import (
    DEFAULT_TIMEOUT_S,
    Clock,
    Deadline,
    Finding,
    check_timeout,
    run_check,
)

__all__ = ["CheckResult", "CustomCheck"]

CheckResult = bool | tuple[bool, Mapping[str, Scalar]]
"""What a custom check returns: pass/fail, or pass/fail with the values it observed."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CustomCheck:
    """Wrap a callable as an outcome verifier (an S3 head request, a CRM lookup...).

    ``fn()`` returns ``True``/``False`` or ``(passed, observed)`` with a small mapping of JSON
    scalars. It runs under the same deadline and never-raise rule as the built-in checks.
    Declare ``evidence=Evidence.JUDGE`` when the callable asks a model rather than the
    destination.
    """

    target: str
    """What is checked, without secrets (``"s3://reports/2024-06.csv"``)."""
    fn: Callable[[], CheckResult] = field(hash=False, compare=False)
    """The check."""
    checked_by: str = "tripwire.verify.custom"
    """Who checks; must not be the agent under review, or the receipt will not count."""
    evidence: Evidence = Evidence.INDEPENDENT
    """The kind of evidence ``fn`` produces."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Time budget of the call, in seconds."""
    clock: Clock = time.time
    """Where ``checked_at`` comes from."""

    def __post_init__(self) -> None:
        if not isinstance(self.target, str) or not self.target:
            raise ConfigError("CustomCheck.target", self.target, "a non-empty description")
        if not callable(self.fn):
            raise ConfigError("CustomCheck.fn", type(self.fn).__name__, "a callable")
        if not isinstance(self.checked_by, str) or not self.checked_by:
            raise ConfigError("CustomCheck.checked_by", self.checked_by, "a non-empty name")
        if not isinstance(self.evidence, Evidence):
            raise ConfigError("CustomCheck.evidence", self.evidence, "an Evidence")
        check_timeout("CustomCheck", self.timeout_s)

    def __call__(self) -> OutcomeReceipt:
        """Run the callable now; never raises (see :class:`~tripwire.verify.Verifier`)."""
        return run_check(
            kind=VerifierKind.CUSTOM,
            target=self.target,
            checked_by=self.checked_by,
            expected={"passed": True},
            timeout_s=self.timeout_s,
            clock=self.clock,
            body=self._check,
            evidence=self.evidence,
        )

    def _check(self, deadline: Deadline) -> Finding:
        result: Any = self.fn()
        if isinstance(result, bool):
            return Finding(result, {"passed": result})
        if (
            isinstance(result, tuple)
            and len(result) == 2
            and isinstance(result[0], bool)
            and isinstance(result[1], Mapping)
        ):
            return Finding(result[0], {**result[1], "passed": result[0]})
        return Finding(
            False,
            error=f"the check returned {type(result).__name__}; expected a bool or (bool, mapping)",
        )
