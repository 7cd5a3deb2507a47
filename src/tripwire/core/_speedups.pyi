"""The compiled hot path of :mod:`tripwire.core.watch` (see ``_speedups.c``)."""

from collections.abc import Callable
from typing import Any

class RunState:
    def __init__(self, window: int, max_period: int) -> None: ...
    @classmethod
    def new(cls, policy: Any) -> RunState: ...
    calls: int
    current: Any
    lease: Any
    failures: dict[int, Any] | None
    last_trip: int
    confirm_streak: int

def evaluate(
    state: RunState,
    call: Any,
    policy: Any,
    normalizer: Any,
    *,
    signature: Any = None,
    now_s: float | None = None,
) -> Any: ...
def bind(
    failure_step: Callable[..., Any],
    judge: Callable[..., Any],
    quiet: Callable[..., Any],
    tool_args: Any,
    working: Any,
) -> None: ...
