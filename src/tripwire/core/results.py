"""The structured result of one tool call: ``ok``, or an error with a code and a retryable flag.

Why a type and not an exception or a string: the guard needs to know, without parsing prose,
whether a failure may be retried. Re-calling a tool with the same arguments after an error
marked ``retryable=False`` is refused before it runs (stop reason
``retry_of_non_retryable``); ``retryable=None`` means "not declared" and leaves the decision
to the loop watcher's retry policy.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tripwire.errors import ConfigError

__all__ = ["ToolResult"]


@dataclass(frozen=True, slots=True, kw_only=True)
class ToolResult:
    """What a tool call returned. Build with :meth:`success` or :meth:`error`."""

    ok: bool = True
    """True when the call succeeded."""
    value: Any = None
    """The result (only its digest is kept, as progress evidence; never stored raw)."""
    code: str | None = None
    """The error code or class, e.g. ``"not_found"`` (required when ``ok`` is False)."""
    retryable: bool | None = None
    """Whether retrying the same call may succeed; ``False`` makes an identical retry refused."""
    message: str = ""
    """A short error message for the model."""
    progress: str | None = None
    """An explicit progress fingerprint, the strongest evidence that the run is moving."""

    def __post_init__(self) -> None:
        if self.ok and (self.code is not None or self.retryable is not None):
            raise ConfigError("ToolResult.code", self.code, "None for a successful result")
        if not self.ok and (not isinstance(self.code, str) or not self.code):
            raise ConfigError("ToolResult.code", self.code, "a non-empty error code for a failure")

    @classmethod
    def success(cls, value: Any = None, *, progress: str | None = None) -> ToolResult:
        """A successful result."""
        return cls(ok=True, value=value, progress=progress)

    @classmethod
    def error(
        cls, code: str, *, retryable: bool | None = None, message: str = "", value: Any = None
    ) -> ToolResult:
        """A failure with an error ``code``; say ``retryable=False`` when retrying is pointless."""
        return cls(ok=False, code=code, retryable=retryable, message=message, value=value)
