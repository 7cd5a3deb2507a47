"""Idempotent side effects: a repeated operation returns its first result instead of acting twice.

An agent that loops, retries or is restarted can send the same e-mail twice. Wrap the
side-effecting tool::

    store = SQLiteIdempotencyStore("ops.db")          # survives a restart

    @idempotent(store)
    def send_email(to: str, subject: str, body: str) -> dict: ...

    first = send_email(to="a@x", subject="Hi", body="…")    # runs: first.status == "executed"
    again = send_email(to="a@x", subject="Hi", body="…")    # does not run: "already_sent",
                                                             # again.value == first.value

The operation id is explicit (``send_email(..., operation_id="order-42-receipt")``), or comes
from a ``key=`` function of the arguments, or by default from the call's signature (tool name
+ normalized arguments, volatile keys such as ``timestamp`` dropped), so identical calls are
one operation.

Results are stored as JSON (``msgspec``); values JSON cannot hold are stored as their ``str``.
A replay therefore returns the JSON form (tuples come back as lists). If the action raises,
its claim is released and the exception propagates: a failed action may be tried again. An
operation claimed by a call that is still running (or crashed mid-way) reports
``in_progress`` and is not run again.

A store that cannot be reached fails closed: the wrapper raises
:class:`~tripwire.errors.RunStopped` (reason ``tool_error``) rather than risk acting twice.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, Literal, TypeVar

import msgspec

from tripwire.core.reasons import StopReason
from tripwire.core.signature import DEFAULT_NORMALIZER, Normalizer
from tripwire.errors import ConfigError, RunStopped
from tripwire.store.base import IdempotencyStore, StoreUnavailable
from tripwire.store.memory import MemoryIdempotencyStore

__all__ = ["Idempotent", "IdempotentResult", "idempotent"]

_T = TypeVar("_T")
_ENCODER = msgspec.json.Encoder(enc_hook=str)
_DECODER = msgspec.json.Decoder()

Status = Literal["executed", "already_sent", "in_progress"]


@dataclass(frozen=True, slots=True)
class IdempotentResult(Generic[_T]):
    """What an idempotent call returned, and whether it acted."""

    value: _T | Any
    """The action's result: this call's, or the first call's (decoded from the store)."""
    status: Status
    """``executed`` (this call acted), ``already_sent`` (a replay of the first result), or
    ``in_progress`` (another call holds the operation; ``value`` is ``None``)."""
    operation_id: str

    @property
    def replayed(self) -> bool:
        """True when this call did not act."""
        return self.status != "executed"


class Idempotent(Generic[_T]):
    """A side-effecting callable that acts at most once per operation id.

    Args:
        fn: the action (sync or ``async def``).
        store: where operations are remembered (default: in-memory, this process only).
        tool: the name used in derived operation ids (default ``fn.__name__``).
        key: ``key(*args, **kwargs) -> str``, the operation id from the arguments.
        normalizer: normalizes arguments for the derived operation id.
    """

    def __init__(
        self,
        fn: Callable[..., _T],
        *,
        store: IdempotencyStore | None = None,
        tool: str | None = None,
        key: Callable[..., str] | None = None,
        normalizer: Normalizer = DEFAULT_NORMALIZER,
    ) -> None:
        if not callable(fn):
            raise ConfigError("fn", fn, "a callable")
        self.fn = fn
        self.store: IdempotencyStore = store if store is not None else MemoryIdempotencyStore()
        self.tool: str = tool or str(getattr(fn, "__name__", "tool"))
        self.key = key
        self.normalizer = normalizer
        self._async = inspect.iscoroutinefunction(fn)
        functools.update_wrapper(self, fn)

    def operation_id(self, *args: Any, **kwargs: Any) -> str:
        """The operation id of a call with these arguments."""
        if self.key is not None:
            op = self.key(*args, **kwargs)
            if not isinstance(op, str) or not op:
                raise ConfigError("key", op, "a function returning a non-empty str")
            return op
        payload = {"args": list(args), "kwargs": kwargs}
        return f"{self.tool}:{self.normalizer.signature(self.tool, payload).digest}"

    def __call__(self, *args: Any, operation_id: str | None = None, **kwargs: Any) -> Any:
        """Run the action once per operation id; returns an :class:`IdempotentResult`
        (an awaitable of one for an ``async def`` action)."""
        op = operation_id or self.operation_id(*args, **kwargs)
        if self._async:
            return self._acall(op, args, kwargs)
        prior = self._claim(op)
        if prior is not None:
            return prior
        try:
            value = self.fn(*args, **kwargs)
        except BaseException:
            self._release(op)
            raise
        self._complete(op, value)
        return IdempotentResult(value, "executed", op)

    async def _acall(
        self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> IdempotentResult[Any]:
        prior = self._claim(op)
        if prior is not None:
            return prior
        try:
            value = await self.fn(*args, **kwargs)  # type: ignore[misc]
        except BaseException:
            self._release(op)
            raise
        self._complete(op, value)
        return IdempotentResult(value, "executed", op)

    def _claim(self, op: str) -> IdempotentResult[Any] | None:
        try:
            record = self.store.claim(op)
        except StoreUnavailable as exc:
            raise self._unavailable(op, exc) from exc
        if record is None:
            return None
        if record.state == "done" and record.payload is not None:
            return IdempotentResult(_DECODER.decode(record.payload), "already_sent", op)
        return IdempotentResult(None, "in_progress", op)

    def _complete(self, op: str, value: Any) -> None:
        try:
            self.store.complete(op, _ENCODER.encode(value))
        except StoreUnavailable as exc:
            raise self._unavailable(op, exc) from exc

    def _release(self, op: str) -> None:
        # On failure the claim stays "in_progress": safe (never acts twice), resolve by hand.
        with contextlib.suppress(StoreUnavailable):
            self.store.release(op)

    def _unavailable(self, op: str, exc: StoreUnavailable) -> RunStopped:
        return RunStopped(
            f"{self.tool}: the idempotency store is unavailable ({exc.detail}); not running a "
            f"side effect that may already have happened (operation {op[:40]}). Restore the "
            "store, then retry",
            reason=StopReason.TOOL_ERROR,
        )


def idempotent(
    store: IdempotencyStore | None = None,
    *,
    key: Callable[..., str] | None = None,
    tool: str | None = None,
    normalizer: Normalizer = DEFAULT_NORMALIZER,
) -> Callable[[Callable[..., _T]], Idempotent[_T]]:
    """Decorator form of :class:`Idempotent`."""

    def wrap(fn: Callable[..., _T]) -> Idempotent[_T]:
        return Idempotent(fn, store=store, tool=tool, key=key, normalizer=normalizer)

    return wrap
