"""The loop watcher's compiled per-call bookkeeping (see ``_watchstep.c``)."""

from typing import Any

def step(state: Any, call: Any, key: int, result: int, policy: Any) -> int | None: ...
def configure(
    state_type: type,
    call_type: type,
    no_runs: dict[int, int],
    working: object,
    array_type: type,
    tool_args: object,
    empty: int,
    replay_grace: int,
) -> None: ...
