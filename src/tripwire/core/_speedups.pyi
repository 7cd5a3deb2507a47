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
def volatile_free(obj: Any, keys: frozenset[str] | set[str], budget: int) -> bool | None: ...
def json_signature(tool: str, text: str, keys: frozenset[str], max_bytes: int) -> Any: ...
def bind_signature(
    decode: Callable[[str], Any],
    decode_errors: tuple[type[BaseException], ...],
    encode: Callable[[Any], bytes],
    hash: Callable[[bytes, int], int],
    seed: Callable[[str, Any], int],
    seeds: dict[str, int],
    json_kind: Any,
    signature_type: type,
    result_hash: Callable[[bytes, int], str],
    result_seed: int,
) -> None: ...
def tool_span(
    attrs: dict[str, Any],
    start_ns: int | None,
    end_ns: int | None,
    keys: frozenset[str],
    max_bytes: int,
    may_hold_volatile: Callable[[bytes], bool],
) -> tuple[Any, Any] | None: ...
def bind_tool_span(
    tool_key: str,
    args_key: str,
    id_key: str,
    result_keys: tuple[str, ...],
    other_keys: tuple[str, ...],
    no_id: str,
    prefixes: tuple[str, ...],
    needles: tuple[str, ...],
    result_needles: tuple[str, ...],
    call_type: type,
) -> None: ...
def remember_id(ids: bytes | None, text: str, memory: int) -> bytes: ...
