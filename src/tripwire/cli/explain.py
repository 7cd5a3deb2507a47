"""``tripwire explain RECEIPT.json``: why a run stopped, its health, and what to do next."""

from __future__ import annotations

import json
import math
import os
import stat
import sys
from typing import Any

import typer
from rich.table import Table
from rich.text import Text

from tripwire.cli import app
from tripwire.cli._common import abort, out_console, print_table
from tripwire.core.receipt import Health, StopReceipt, classify
from tripwire.errors import InputError

__all__ = ["explain"]

_STATE_STYLES = {
    "failed": "bold red",
    "waiting": "bold cyan",
    "waiting_unrouted": "bold yellow",
    "stuck": "bold red",
    "bounded_stop": "bold yellow",
    "verified_complete": "bold green",
    "complete_unverified": "green",
    "false_complete": "bold magenta",
    "uncertain": "bold yellow",
}


MAX_RECEIPT_BYTES = 16 * 1024 * 1024
"""A stop receipt is a few KiB; a larger file is not one (and is not read into memory)."""


def _read(path: str, source: str) -> bytes:
    if path == "-":
        raw = sys.stdin.buffer.read(MAX_RECEIPT_BYTES + 1)
    else:
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)  # a FIFO must not block the open
        except FileNotFoundError:
            abort(f"cannot read {source}: no such file. Pass the path of a stop receipt (JSON).")
        except IsADirectoryError:
            abort(f"cannot read {source}: it is a directory, not a stop receipt file.")
        except OSError as exc:
            abort(f"cannot read {source}: {exc.strerror or exc}. Check the path and permissions.")
        mode = os.fstat(fd).st_mode
        if stat.S_ISDIR(mode):  # os.open() opens a directory; os.fdopen() would refuse it
            os.close(fd)
            abort(f"cannot read {source}: it is a directory, not a stop receipt file.")
        with os.fdopen(fd, "rb", buffering=0) as fh:
            if not stat.S_ISREG(mode):
                abort(f"cannot read {source}: not a regular file (a FIFO or a device).")
            try:
                raw = fh.read(MAX_RECEIPT_BYTES + 1)
            except OSError as exc:
                abort(f"cannot read {source}: {exc.strerror or exc}.")
    if len(raw) > MAX_RECEIPT_BYTES:
        abort(f"{source} is larger than {MAX_RECEIPT_BYTES >> 20} MiB, so it is not a stop receipt.")
    return raw


def _load(path: str) -> StopReceipt:
    source = "<stdin>" if path == "-" else path
    raw = _read(path, source)
    try:
        return StopReceipt.from_json(raw, source=source)
    except InputError as exc:
        abort(f"{exc}. The file must be a tripwire stop receipt (StopReceipt.to_json()).")
    except RecursionError:
        abort(f"{source}: the JSON is nested too deeply to be a stop receipt.")
    except (ValueError, OverflowError) as exc:  # a number beyond what a receipt can hold
        abort(f"{source}: not a valid stop receipt ({str(exc)[:200]}).")


def _facts(receipt: StopReceipt) -> list[tuple[str, str]]:
    rows = [
        ("run", receipt.run_id),
        ("agent", receipt.agent),
        ("end", receipt.end.value if receipt.end else "not recorded"),
        ("stop reason", receipt.reason.value if receipt.reason else "not recorded"),
    ]
    if receipt.condition:
        rows.append(("condition", ", ".join(f"{k}={v}" for k, v in receipt.condition.items())))
    c = receipt.counters
    counters = (
        f"steps={c.steps} tool_calls={c.tool_calls} tokens={c.input_tokens}in/{c.output_tokens}out"
    )
    if c.cost_usd is not None:
        counters += f" cost=${c.cost_usd:.4f}"
    if c.duration_s is not None:
        counters += f" duration={c.duration_s:g}s"
    rows.append(("counters", counters))
    if receipt.verdict is not None:
        rows.append(("loop verdict", receipt.verdict.value))
    rows.append(("outcome policy", receipt.requires_outcome.value))
    for outcome in receipt.outcomes:
        mark = "passed" if outcome.passed else "FAILED"
        detail = f": {outcome.failure}" if outcome.failure else ""
        rows.append(
            (
                f"outcome ({outcome.kind.value}, {outcome.evidence.value})",
                f"{mark} {outcome.target} by {outcome.checked_by}{detail}",
            )
        )
    versions = [
        f"policy={receipt.policy_version}" if receipt.policy_version else "",
        f"normalizer={receipt.normalizer_version}" if receipt.normalizer_version else "",
    ]
    if any(versions):
        rows.append(("versions", " ".join(v for v in versions if v)))
    return rows


def _render(receipt: StopReceipt, health: Health) -> None:
    style = _STATE_STYLES.get(health.state.value, "bold")
    out_console.print(Text.assemble(("state:  ", "bold"), (health.state.name, style)))
    out_console.print(Text.assemble(("reason: ", "bold"), health.reason))
    out_console.print(Text.assemble(("action: ", "bold"), health.action))
    table = Table(show_header=False, box=None, pad_edge=False)
    table.add_column(style="dim")
    table.add_column(overflow="fold")
    for key, value in _facts(receipt):
        table.add_row(key, Text(value))
    out_console.print()
    print_table(table)


@app.command(
    "explain",
    short_help="Explain why a run stopped, from its stop receipt.",
    no_args_is_help=True,
)
def explain(
    receipt_file: str = typer.Argument(
        ...,
        metavar="RECEIPT.json",
        help="A stop receipt written by tripwire (StopReceipt.to_json()); '-' reads stdin.",
        show_default=False,
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print {run_id, agent, state, reason, action} as JSON on stdout."
    ),
    now: float | None = typer.Option(
        None,
        "--now",
        help="Current time on the receipt's clock (seconds); a routed approval past its "
        "deadline is then reported as waiting_unrouted.",
        show_default=False,
    ),
) -> None:
    """Explain why a run stopped: its health state, the reason, and the operator action.

    States, by priority: failed, waiting, waiting_unrouted, stuck, bounded_stop,
    verified_complete, complete_unverified, false_complete, uncertain.
    Exit code 0 when the receipt was read (whatever the state), 2 when it could not be.
    """
    if now is not None and not math.isfinite(now):
        abort(f"--now takes a finite time in seconds on the receipt's clock; got {now}")
    receipt = _load(receipt_file)
    try:
        health = classify(receipt, now=now)
        if as_json:
            payload: dict[str, Any] = {"run_id": receipt.run_id, "agent": receipt.agent}
            payload.update(health.to_dict())
            typer.echo(json.dumps(payload, ensure_ascii=False))
            return
        _render(receipt, health)
    except (ValueError, OverflowError, RecursionError) as exc:
        # A receipt whose values parse but cannot be shown (an integer of thousands of digits).
        abort(f"{receipt_file}: the receipt holds a value that cannot be shown "
              f"({type(exc).__name__}); it was not written by tripwire as it is.")

