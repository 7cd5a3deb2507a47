"""Stop receipts that agents post: ``POST /api/runs/{trace_id}/receipt``.

An agent outside Python (the TypeScript client, ``clients/typescript``) builds its run's stop
receipt from what its framework returned (how the loop ended, which condition fired, tool
errors, an abort, a timeout) and posts it here, so that the dashboard and ``tripwire report``
count its runs like Python ones. The body is a receipt in the schema of
:class:`~tripwire.core.receipt.StopReceipt` (``tripwire.stop_receipt/1``), read strictly:
unknown fields, wrong types, a ``run_id`` other than the path's trace id, or more than
:data:`MAX_RECEIPT_BYTES` are refused with 400 / 413 naming the field. Its health is classified
here with the one table (:func:`tripwire.core.receipt.classify`), never taken from the agent.

Where it lands: a run this receiver still holds writes the posted receipt (and its health) as
its receipt when it ends, instead of the one its trace implies; a run that ended already (or
that no span announced: telemetry off) has its row's receipt, health and stop reason replaced
now, its row created from the receipt's counters if there is none. The agent saw how its loop
ended; the trace only shows that it did. With several receivers, the receiver that ends the run
must be the one the receipt reached, or the receipt is written first and the run's end writes
the trace's over it (say so in docs/serve.md).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

import msgspec

from tripwire.core import receipt as rc
from tripwire.errors import InputError
from tripwire.store.runs import Batch, RunRow

if TYPE_CHECKING:
    from tripwire.serve.app import Service

__all__ = ["MAX_RECEIPT_BYTES", "read_receipt", "store_receipt", "valid_trace_id"]

MAX_RECEIPT_BYTES: Final = 64 * 1024
"""The largest receipt body accepted (a receipt is a few hundred bytes to a few KB)."""

_HEX: Final = frozenset("0123456789abcdef")


def valid_trace_id(trace_id: str) -> bool:
    """32 lowercase hex characters, not all zero (the OpenTelemetry trace id form)."""
    return len(trace_id) == 32 and set(trace_id) <= _HEX and trace_id != "0" * 32


def read_receipt(body: bytes, trace_id: str) -> tuple[dict[str, Any], str]:
    """The posted receipt, validated, as its canonical JSON dict, and its health state.

    Raises:
        InputError: the body is not a receipt of this schema (the message names the field), or
            its ``run_id`` is not ``trace_id``.
    """
    receipt = rc.StopReceipt.from_json(body, source="the receipt")
    if receipt.run_id.lower() != trace_id:
        raise InputError("the receipt", f"field 'run_id': {receipt.run_id!r} is not the run {trace_id}")
    return receipt.to_dict(), rc.classify(receipt).state.value


def store_receipt(svc: Service, trace_id: str, receipt: dict[str, Any], health: str) -> bool:
    """Land ``receipt`` on the run's row (see the module docstring). Returns ``True`` when this
    receiver holds the run: the receipt is then written at its end, not now.

    Called in a worker thread: takes the fleet's lock, then writes the store.
    """
    now = svc.clock()
    with svc._fleet_lock:
        held = svc.fleet.client_receipt(trace_id, receipt, health, now)
    row = svc.store.run(trace_id)
    if held and row is not None:
        return True
    reason = receipt.get("reason")
    if row is None:
        counters = receipt.get("counters") or {}
        started = receipt.get("started_at")
        row = RunRow(
            trace_id=trace_id,
            agent=str(receipt.get("agent") or "")[:200] or None,
            status="ended",
            verdict=receipt.get("verdict") or "working",
            stop_reason=reason,
            health=health,
            steps=int(counters.get("steps", 0)),
            tool_calls=int(counters.get("tool_calls", 0)),
            input_tokens=int(counters.get("input_tokens", 0)),
            output_tokens=int(counters.get("output_tokens", 0)),
            cost_usd=counters.get("cost_usd"),
            duration_s=counters.get("duration_s"),
            receipt=receipt,
            created_at=float(started) if isinstance(started, (int, float)) else now,
            updated_at=now,
            ended_at=now,
        )
    else:
        row = msgspec.structs.replace(
            row,
            status="ended",
            stop_reason=row.stop_reason or reason,
            health=health,
            receipt=receipt,
            updated_at=max(now, row.updated_at),
            ended_at=row.ended_at if row.ended_at is not None else now,
        )
    svc.store.write(Batch(runs=[row]))
    return False
