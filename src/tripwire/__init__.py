"""tripwire: stop AI agents that are stuck in loops, guard run budgets, prove why runs stopped.

The public surface. Extras live behind their own import path (``tripwire.otel``,
``tripwire.verify``); :func:`check` and :func:`instrument` are re-exported lazily so that the
core install works without the ``otel`` extra.
"""

from __future__ import annotations

from typing import Any

from tripwire._version import __version__
from tripwire.core.budget import Advisory, Level, Limits
from tripwire.core.events import Lease, ModelCall, ToolCall
from tripwire.core.policy import DEFAULT_POLICY, SEED_POLICY, KeyMode, LoopPolicy, RetryPolicy
from tripwire.core.reasons import ArgsKind, Rule, StopReason, Verdict
from tripwire.core.receipt import (
    Approval,
    EndKind,
    Health,
    HealthState,
    OutcomeReceipt,
    StopReceipt,
    classify,
)
from tripwire.core.results import ToolResult
from tripwire.core.signature import ABSENT, Normalizer, Signature, signature_of
from tripwire.core.watch import Assessment
from tripwire.detector import LoopDetector, LoopWatcher
from tripwire.errors import (
    BudgetExceeded,
    ConfigError,
    InputError,
    LoopDetected,
    RunStopped,
    TripwireError,
)
from tripwire.guard import Guard
from tripwire.idempotency import idempotent

__all__ = [
    "ABSENT",
    "DEFAULT_POLICY",
    "SEED_POLICY",
    "Advisory",
    "Approval",
    "ArgsKind",
    "Assessment",
    "BudgetExceeded",
    "ConfigError",
    "EndKind",
    "Guard",
    "Health",
    "HealthState",
    "InputError",
    "KeyMode",
    "Lease",
    "Level",
    "Limits",
    "LoopDetected",
    "LoopDetector",
    "LoopPolicy",
    "LoopWatcher",
    "ModelCall",
    "Normalizer",
    "OutcomeReceipt",
    "RetryPolicy",
    "Rule",
    "RunStopped",
    "Signature",
    "StopReason",
    "StopReceipt",
    "ToolCall",
    "ToolResult",
    "TripwireError",
    "Verdict",
    "__version__",
    "check",
    "classify",
    "idempotent",
    "instrument",
    "signature_of",
]

_LAZY = {
    "check": ("tripwire.otel", "check"),
    "instrument": ("tripwire.otel", "instrument"),
}
"""Names that need the ``otel`` extra: imported on first use."""


def __getattr__(name: str) -> Any:
    target = _LAZY.get(name)
    if target is None:
        raise AttributeError(f"module 'tripwire' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(target[0]), target[1])
