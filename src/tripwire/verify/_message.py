"""Message-delivery verifier: the provider returned a receipt id, and it is well-formed."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass
from typing import Final

from tripwire.core.receipt import OutcomeReceipt, Scalar, VerifierKind
from tripwire.errors import ConfigError
from tripwire.verify._common import (
    DEFAULT_TIMEOUT_S,
    Clock,
    Deadline,
    Finding,
    check_timeout,
    run_check,
)

__all__ = ["DEFAULT_RECEIPT_ID_PATTERN", "MessageCheck"]

DEFAULT_RECEIPT_ID_PATTERN: Final = r"[A-Za-z0-9<][A-Za-z0-9._:@<>+=/-]{5,254}"
"""Any plausible provider id: 6 to 255 characters, no spaces. Pass a provider's own pattern
(e.g. ``r"SM[0-9a-f]{32}"`` for a Twilio SMS sid) for a stricter check."""


@dataclass(frozen=True, slots=True, kw_only=True)
class MessageCheck:
    """Check that a message provider acknowledged a send with a well-formed receipt id.

    Pass the id your code got back from the provider's API (the tool's executor saw the
    response), never one the model wrote in its answer: that would be the agent vouching for
    itself. The whole id must match ``pattern``.
    """

    provider: str
    """The provider's name, for the receipt target (``"twilio"``, ``"ses"``, ``"smtp"``)."""
    receipt_id: str | None
    """The id the provider returned; ``None`` or empty when it returned none."""
    pattern: str = DEFAULT_RECEIPT_ID_PATTERN
    """A regular expression the whole id must match."""
    timeout_s: float = DEFAULT_TIMEOUT_S
    """Time budget of the check, in seconds."""
    clock: Clock = time.time
    """Where ``checked_at`` comes from."""

    def __post_init__(self) -> None:
        if not isinstance(self.provider, str) or not self.provider:
            raise ConfigError("MessageCheck.provider", self.provider, "a provider name")
        if self.receipt_id is not None and not isinstance(self.receipt_id, str):
            raise ConfigError(
                "MessageCheck.receipt_id", type(self.receipt_id).__name__, "a str or None"
            )
        try:
            re.compile(self.pattern)
        except (re.error, TypeError) as exc:
            raise ConfigError(
                "MessageCheck.pattern", self.pattern, f"a valid regex ({exc})"
            ) from None
        check_timeout("MessageCheck", self.timeout_s)

    def __call__(self) -> OutcomeReceipt:
        """Check the id now; never raises (see :class:`~tripwire.verify.Verifier`)."""
        expected: dict[str, Scalar] = {"present": True, "pattern": self.pattern}
        return run_check(
            kind=VerifierKind.MESSAGE,
            target=f"{self.provider} delivery receipt",
            checked_by="tripwire.verify.message",
            expected=expected,
            timeout_s=self.timeout_s,
            clock=self.clock,
            body=self._check,
        )

    def _check(self, deadline: Deadline) -> Finding:
        receipt_id = (self.receipt_id or "").strip()
        if not receipt_id:
            return Finding(False, {"present": False})
        matches = re.fullmatch(self.pattern, receipt_id) is not None
        shown = receipt_id if len(receipt_id) <= 255 else receipt_id[:254] + "…"
        return Finding(matches, {"present": True, "matches": matches, "receipt_id": shown})
