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
from a ``key=`` function of the arguments, or by default from the call itself: the tool name
and the SHA-256 of the bound arguments (positional or by keyword alike, defaults applied), in
an exact canonical form with volatile keys such as ``timestamp`` dropped at every depth, so
identical calls are one operation and calls that differ anywhere, at any depth, are not. An
argument without a stable identity (an object whose ``str`` is the default one, with its memory
address in it, so the id would change after a restart) is refused with a
:class:`~tripwire.errors.ConfigError`: pass ``operation_id=`` or ``key=`` for such calls.

Results are stored as JSON (``msgspec``); values JSON cannot hold are stored as their ``str``.
A replay therefore returns the JSON form (tuples come back as lists). A result that cannot be
stored at all (an integer too large to print, a lone surrogate, a cycle) still completes the
record: the call returns its value, and replays return ``None`` with ``value_stored=False``.

When the action raises an ``Exception``, its claim is released and the exception propagates: a
failed action may be tried again. When it is interrupted by anything else (a ``BaseException``:
``asyncio.CancelledError`` from a timeout such as ``guard.atimeout``, ``KeyboardInterrupt``…), it
may have acted already, so the claim is kept: later calls report ``in_progress`` instead of
acting again (resolve it by hand with ``store.release(operation_id)`` if it did not act). An
operation claimed by a call that is still running (or crashed mid-way) reports
``in_progress`` and is not run again.

A store that cannot be reached when an operation is claimed fails closed: the wrapper raises
:class:`~tripwire.errors.RunStopped` (reason ``tool_error``) and does not run the action. When
the store fails *after* the action ran, the record is retried for up to ``record_wait_s``
seconds; if it still cannot be written, the call returns its result anyway (it acted), logs a
warning once, and keeps the record in this process (bounded) to write it on the next call: in
the meantime a repeat from this process replays the result, and one from elsewhere reports
``in_progress``. If the process ends first the record stays ``in_progress``: the action is never
run twice, but the record needs resolving by hand.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime as _dt
import decimal
import fractions
import functools
import hashlib
import inspect
import logging
import math
import re
import threading
import time
import uuid
from collections import OrderedDict
from collections.abc import Callable, Mapping
from enum import Enum
from pathlib import PurePath
from typing import Any, Final, Generic, Literal, TypeVar

import msgspec

from tripwire.core.reasons import StopReason
from tripwire.core.signature import DEFAULT_NORMALIZER, Normalizer
from tripwire.errors import ConfigError, RunStopped
from tripwire.store.base import IdempotencyStore, StoreUnavailable
from tripwire.store.memory import MemoryIdempotencyStore

__all__ = ["Idempotent", "IdempotentResult", "idempotent"]

logger = logging.getLogger("tripwire.idempotency")

_T = TypeVar("_T")
_ENCODER = msgspec.json.Encoder(enc_hook=str)
_DECODER = msgspec.json.Decoder()

_UNSTORED: Final = b"\x00unstored"
"""The payload of a record whose result could not be encoded. Never valid JSON, so it never
meets a stored result."""
MAX_ID_DEPTH: Final = 200
"""Arguments nested deeper than this get no derived operation id (pass one)."""
MAX_UNRECORDED: Final = 1024
"""Results kept in memory, per wrapper, while the store cannot record them."""
MAX_UNRECORDED_BYTES: Final = 16 * 1024 * 1024
"""The bytes of those results, at most."""

Status = Literal["executed", "already_sent", "in_progress"]


@dataclasses.dataclass(frozen=True, slots=True)
class IdempotentResult(Generic[_T]):
    """What an idempotent call returned, and whether it acted."""

    value: _T | Any
    """The action's result: this call's, or the first call's (decoded from the store)."""
    status: Status
    """``executed`` (this call acted), ``already_sent`` (a replay of the first result), or
    ``in_progress`` (another call holds the operation, or one was interrupted after it may
    have acted; ``value`` is ``None``)."""
    operation_id: str
    """The operation id the call was recorded under."""
    value_stored: bool = True
    """``False`` for a replay of a first result that could not be stored (``value`` is
    ``None``, but the action did run)."""

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
        normalizer: its ``volatile_keys`` are dropped from the arguments of a derived id.
        record_wait_s: how long to keep retrying the record of a result when the store fails
            after the action ran (then the record is kept in memory; see the module doc).
    """

    def __init__(
        self,
        fn: Callable[..., _T],
        *,
        store: IdempotencyStore | None = None,
        tool: str | None = None,
        key: Callable[..., str] | None = None,
        normalizer: Normalizer = DEFAULT_NORMALIZER,
        record_wait_s: float = 5.0,
    ) -> None:
        if not callable(fn):
            raise ConfigError("fn", fn, "a callable")
        if (
            isinstance(record_wait_s, bool)
            or not isinstance(record_wait_s, (int, float))
            or not math.isfinite(record_wait_s)
            or not 0 <= record_wait_s <= 3600
        ):
            raise ConfigError("record_wait_s", record_wait_s, "a number of seconds in [0, 3600]")
        self.fn = fn
        self.store: IdempotencyStore = store if store is not None else MemoryIdempotencyStore()
        self.tool: str = tool or str(getattr(fn, "__name__", "tool"))
        self.key = key
        self.normalizer = normalizer
        self.record_wait_s = float(record_wait_s)
        self._async = inspect.iscoroutinefunction(fn)
        try:
            self._signature: inspect.Signature | None = inspect.signature(fn)
        except (TypeError, ValueError):
            self._signature = None
        self._unrecorded: OrderedDict[str, bytes] = OrderedDict()
        self._unrecorded_bytes = 0
        self._pending_lock = threading.Lock()
        self._warned: set[str] = set()
        functools.update_wrapper(self, fn)

    def operation_id(self, *args: Any, **kwargs: Any) -> str:
        """The operation id of a call with these arguments.

        Raises:
            ConfigError: when ``key`` returns no id, or an argument has no stable identity
                (its default ``str`` holds a memory address), a cycle, or nesting deeper
                than :data:`MAX_ID_DEPTH`: pass ``operation_id=`` or ``key=``.
        """
        if self.key is not None:
            op = self.key(*args, **kwargs)
            if not isinstance(op, str) or not op:
                raise ConfigError("key", op, "a function returning a non-empty str")
            return op
        arguments: Any = {"args": list(args), "kwargs": kwargs}
        if self._signature is not None:
            try:
                bound = self._signature.bind(*args, **kwargs)
            except TypeError:
                pass  # the call itself will fail; any id will do
            else:
                bound.apply_defaults()
                arguments = bound.arguments
        digest = hashlib.sha256(self.tool.encode("utf-8", "surrogatepass") + b"\x00")
        _Canonical(digest, self.normalizer.volatile_keys, self.tool).value(arguments, 0)
        return f"{self.tool}:{digest.hexdigest()[:32]}"

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
        except Exception:
            self._release(op)
            raise
        except BaseException as exc:
            self._interrupted(op, exc)
            raise
        self._record(op, self._encode(op, value))
        return IdempotentResult(value, "executed", op)

    async def _acall(
        self, op: str, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> IdempotentResult[Any]:
        prior = self._claim(op)
        if prior is not None:
            return prior
        try:
            value = await self.fn(*args, **kwargs)  # type: ignore[misc]
        except Exception:
            self._release(op)
            raise
        except BaseException as exc:
            self._interrupted(op, exc)
            raise
        payload = self._encode(op, value)
        try:
            await self._arecord(op, payload)
        except BaseException:  # cancelled while waiting to record: keep it for the next call
            self._defer(op, payload)
            raise
        return IdempotentResult(value, "executed", op)

    # -- claim, record, release ---------------------------------------------------------------

    def _claim(self, op: str) -> IdempotentResult[Any] | None:
        self._flush()
        with self._pending_lock:
            held = self._unrecorded.get(op)
        if held is not None:
            return self._replay(op, held)
        try:
            record = self.store.claim(op)
        except StoreUnavailable as exc:
            raise self._unavailable(op, exc) from exc
        if record is None:
            return None
        if record.state == "done" and record.payload is not None:
            return self._replay(op, record.payload)
        return IdempotentResult(None, "in_progress", op)

    def _replay(self, op: str, payload: bytes) -> IdempotentResult[Any]:
        if payload == _UNSTORED:
            return IdempotentResult(None, "already_sent", op, value_stored=False)
        try:
            return IdempotentResult(_DECODER.decode(payload), "already_sent", op)
        except (msgspec.DecodeError, RecursionError):
            return IdempotentResult(None, "already_sent", op, value_stored=False)

    def _encode(self, op: str, value: Any) -> bytes:
        try:
            return _ENCODER.encode(value)
        # Deliberately broad: any value may reach here (a cycle, a str() that raises, a lone
        # surrogate, an int too large to print) and the action has already acted.
        except Exception as exc:
            self._warn_once(
                "unstored",
                "%s: the result of operation %s cannot be stored as JSON (%s); the record says "
                "it ran, and replays return None (value_stored=False)",
                self.tool,
                op[:60],
                type(exc).__name__,
            )
            return _UNSTORED

    def _record(self, op: str, payload: bytes) -> None:
        deadline = time.monotonic() + self.record_wait_s
        pause = 0.02
        while True:
            try:
                self.store.complete(op, payload)
                return
            except StoreUnavailable as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._unrecordable(op, payload, exc)
                    return
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.5)

    async def _arecord(self, op: str, payload: bytes) -> None:
        import asyncio  # here, not at the top: ``import tripwire`` need not load asyncio

        deadline = time.monotonic() + self.record_wait_s
        pause = 0.02
        while True:
            try:
                self.store.complete(op, payload)
                return
            except StoreUnavailable as exc:
                left = deadline - time.monotonic()
                if left <= 0:
                    self._unrecordable(op, payload, exc)
                    return
            await asyncio.sleep(min(pause, left))
            pause = min(pause * 2, 0.5)

    def _unrecordable(self, op: str, payload: bytes, exc: StoreUnavailable) -> None:
        self._warn_once(
            "unrecorded",
            "%s: operation %s ran, but its result could not be recorded within %.1f s (%s); "
            "kept in this process and written on a later call",
            self.tool,
            op[:60],
            self.record_wait_s,
            exc.detail,
        )
        self._defer(op, payload)

    def _defer(self, op: str, payload: bytes) -> None:
        with self._pending_lock:
            old = self._unrecorded.pop(op, None)
            if old is not None:
                self._unrecorded_bytes -= len(old)
            self._unrecorded[op] = payload
            self._unrecorded_bytes += len(payload)
            while self._unrecorded and (
                len(self._unrecorded) > MAX_UNRECORDED
                or self._unrecorded_bytes > MAX_UNRECORDED_BYTES
            ):
                dropped, data = self._unrecorded.popitem(last=False)
                self._unrecorded_bytes -= len(data)
                logger.error(
                    "%s: dropped the unrecorded result of operation %s (memory bound); its "
                    "record stays in_progress: it will not run again, resolve it by hand",
                    self.tool,
                    dropped[:60],
                )

    def _flush(self) -> None:
        """Write the results the store could not take before; stop at the first failure."""
        if not self._unrecorded:
            return
        with self._pending_lock:
            items = list(self._unrecorded.items())
        for op, payload in items:
            try:
                self.store.complete(op, payload)
            except StoreUnavailable:
                return
            with self._pending_lock:
                if self._unrecorded.get(op) is payload:
                    del self._unrecorded[op]
                    self._unrecorded_bytes -= len(payload)

    def _release(self, op: str) -> None:
        # On failure the claim stays "in_progress": safe (never acts twice), resolve by hand.
        with contextlib.suppress(StoreUnavailable):
            self.store.release(op)

    def _interrupted(self, op: str, exc: BaseException) -> None:
        self._warn_once(
            "interrupted",
            "%s: operation %s was interrupted (%s) and may have acted; it stays in_progress "
            "and is not run again (release it by hand if it did not act)",
            self.tool,
            op[:60],
            type(exc).__name__,
        )

    def _warn_once(self, kind: str, message: str, *args: Any) -> None:
        if kind not in self._warned:
            self._warned.add(kind)
            logger.warning(message, *args)

    def _unavailable(self, op: str, exc: StoreUnavailable) -> RunStopped:
        return RunStopped(
            f"{self.tool}: the idempotency store is unavailable ({exc.detail}), so whether "
            f"operation {op[:40]} already ran cannot be checked; not running it now. Restore "
            "the store, then retry",
            reason=StopReason.TOOL_ERROR,
        )


_ADDRESS: Final = re.compile(r" at 0x[0-9a-fA-F]+")
_STABLE_STR: Final = (
    _dt.date,
    _dt.time,
    _dt.timedelta,
    _dt.timezone,
    decimal.Decimal,
    fractions.Fraction,
    uuid.UUID,
    PurePath,
    complex,
)


class _Canonical:
    """Feeds an exact, typed canonical form of a value into a hash (no cap, no collapse).

    Every value is tagged with its kind and every string and byte string with its length, so
    different values never give the same bytes; dict keys are sorted by their encoding and
    volatile keys dropped at every depth; an integral float is the integer (``1 == 1.0``, as
    JSON has it).
    """

    __slots__ = ("hash", "path", "tool", "volatile")

    def __init__(self, digest: Any, volatile: frozenset[str], tool: str) -> None:
        self.hash = digest
        self.volatile = volatile
        self.tool = tool
        self.path: set[int] = set()

    def refuse(self, value: Any, why: str) -> ConfigError:
        return ConfigError(
            f"{self.tool} arguments",
            f"<{type(value).__qualname__}>",
            f"values with a stable identity for a derived operation id ({why}); pass "
            "operation_id= or key= for this call",
        )

    def text(self, tag: bytes, data: bytes) -> None:
        self.hash.update(b"%s%d:" % (tag, len(data)))
        self.hash.update(data)

    def value(self, value: Any, depth: int) -> None:
        if depth > MAX_ID_DEPTH:
            raise self.refuse(value, f"nested deeper than {MAX_ID_DEPTH} levels")
        update = self.hash.update
        if value is None or value is True or value is False:
            update(b"n" if value is None else b"t" if value else b"f")
        elif isinstance(value, str):
            self.text(b"s", value.encode("utf-8", "surrogatepass"))
        elif isinstance(value, int) and not isinstance(value, bool):
            update(b"i%x;" % value if value >= 0 else b"i-%x;" % -value)
        elif isinstance(value, float):
            if math.isfinite(value) and value.is_integer():
                self.value(int(value), depth)
            else:
                update(b"d" + value.hex().encode() + b";")
        elif isinstance(value, (bytes, bytearray, memoryview)):
            self.text(b"b", bytes(value))
        elif isinstance(value, Enum):
            self.text(b"e", type(value).__qualname__.encode())
            self.value(value.value, depth + 1)
        elif isinstance(value, _STABLE_STR):
            self.text(b"o", f"{type(value).__qualname__}:{value}".encode("utf-8", "surrogatepass"))
        elif isinstance(value, (Mapping, list, tuple, set, frozenset)) or _fields(value) is not None:
            self.container(value, depth)
        elif _own_text(value):
            try:
                text = str(value)
            except Exception:  # a hostile __str__: no stable identity either
                raise self.refuse(value, "its str() fails") from None
            if _ADDRESS.search(text):
                raise self.refuse(value, "its str() holds a memory address")
            self.text(b"o", f"{type(value).__qualname__}:{text}".encode("utf-8", "surrogatepass"))
        else:
            raise self.refuse(value, "its default str() holds a memory address, which changes")

    def container(self, value: Any, depth: int) -> None:
        ident = id(value)
        if ident in self.path:
            raise self.refuse(value, "they hold a cycle")
        self.path.add(ident)
        try:
            fields = None if isinstance(value, (Mapping, list, tuple, set, frozenset)) else (
                _fields(value)
            )
            if fields is not None:
                self.text(b"O", type(value).__qualname__.encode())
                self.mapping(fields, depth)
            elif isinstance(value, Mapping):
                self.mapping(value, depth)
            elif isinstance(value, (set, frozenset)):
                self.hash.update(b"<")
                for part in sorted(self.encoded(item, depth) for item in value):
                    self.text(b"", part)
                self.hash.update(b">")
            else:
                self.hash.update(b"[")
                for item in value:
                    self.value(item, depth + 1)
                self.hash.update(b"]")
        finally:
            self.path.discard(ident)

    def mapping(self, value: Mapping[Any, Any], depth: int) -> None:
        items = []
        for key, item in value.items():
            if isinstance(key, str) and key in self.volatile:
                continue
            items.append((self.encoded(key, depth), self.encoded(item, depth)))
        self.hash.update(b"{")
        for key_bytes, item_bytes in sorted(items):
            self.text(b"", key_bytes)
            self.text(b"", item_bytes)
        self.hash.update(b"}")

    def encoded(self, value: Any, depth: int) -> bytes:
        """The SHA-256 of one part's canonical form: keys and set items sort by it."""
        inner = _Canonical(hashlib.sha256(), self.volatile, self.tool)
        inner.path = self.path
        inner.value(value, depth + 1)
        digest: bytes = inner.hash.digest()
        return digest


_OBJECT_STR: Final[Any] = object.__str__
_OBJECT_REPR: Final[Any] = object.__repr__


def _own_text(value: Any) -> bool:
    """True when the value's type defines its own ``str`` or ``repr``."""
    cls: Any = type(value)
    return cls.__str__ is not _OBJECT_STR or cls.__repr__ is not _OBJECT_REPR


def _fields(value: Any) -> Mapping[str, Any] | None:
    """The fields of a dataclass, msgspec Struct, attrs or pydantic instance; else ``None``."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}
    if isinstance(value, msgspec.Struct):
        return {name: getattr(value, name) for name in value.__struct_fields__}
    attrs_fields = getattr(type(value), "__attrs_attrs__", None)
    if attrs_fields is not None:
        return {a.name: getattr(value, a.name) for a in attrs_fields}
    pydantic_fields = getattr(type(value), "model_fields", None)
    if isinstance(pydantic_fields, dict) and hasattr(value, "model_dump"):
        return {name: getattr(value, name) for name in pydantic_fields}
    return None


def idempotent(
    store: IdempotencyStore | None = None,
    *,
    key: Callable[..., str] | None = None,
    tool: str | None = None,
    normalizer: Normalizer = DEFAULT_NORMALIZER,
    record_wait_s: float = 5.0,
) -> Callable[[Callable[..., _T]], Idempotent[_T]]:
    """Decorator form of :class:`Idempotent`."""

    def wrap(fn: Callable[..., _T]) -> Idempotent[_T]:
        return Idempotent(
            fn, store=store, tool=tool, key=key, normalizer=normalizer, record_wait_s=record_wait_s
        )

    return wrap
