"""``tripwire explain RECEIPT.json``."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from msgspec.structs import replace
from typer.testing import CliRunner

from tripwire.cli import app
from tripwire.core.reasons import StopReason
from tripwire.core.receipt import (
    Approval,
    Counters,
    EndKind,
    OutcomeReceipt,
    StopReceipt,
    VerifierKind,
)

runner = CliRunner()


def flat(text: str) -> str:
    """Output with rich's line wrapping undone."""
    return " ".join(text.split())


FILE_OK = OutcomeReceipt(
    kind=VerifierKind.FILE,
    target="out/invoice-0042.pdf",
    checked_at=1_700_000_061.0,
    passed=True,
    checked_by="tripwire.verify.file",
    observed={"exists": True},
)


def write(tmp_path: Path, receipt: StopReceipt, name: str = "receipt.json") -> Path:
    path = tmp_path / name
    path.write_text(receipt.to_json(indent=2))
    return path


def test_prints_state_reason_and_action(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        StopReceipt(
            run_id="run-7",
            agent="invoice-bot",
            end=EndKind.STOP_CONDITION,
            reason=StopReason.MAX_STEPS,
            condition={"steps": 20, "max_steps": 20},
            counters=Counters(steps=20, tool_calls=31),
        ),
    )
    result = runner.invoke(app, ["explain", str(path)])
    assert result.exit_code == 0, result.output
    assert "BOUNDED_STOP" in result.stdout
    assert "max_steps" in result.stdout
    assert "keep the partial work; decide if a new bounded run is justified" in flat(result.stdout)
    assert "run-7" in result.stdout


def test_verified_and_false_complete_are_told_apart(tmp_path: Path) -> None:
    done = StopReceipt(
        run_id="r", agent="a", end=EndKind.NATURAL_FINISH, reason=StopReason.COMPLETED
    )
    with_receipt = write(tmp_path, replace(done, outcomes=(FILE_OK,)), "v.json")
    verified = runner.invoke(app, ["explain", str(with_receipt)])
    false = runner.invoke(app, ["explain", str(write(tmp_path, done, "f.json"))])
    assert verified.exit_code == 0 and false.exit_code == 0
    assert "VERIFIED_COMPLETE" in verified.stdout
    assert "FALSE_COMPLETE" in false.stdout
    assert "check the destination or reopen" in flat(false.stdout)


def test_json_output(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        StopReceipt(
            run_id="run-9",
            agent="ops-bot",
            end=EndKind.APPROVAL_REQUESTED,
            reason=StopReason.APPROVAL_REQUIRED,
            approval=Approval(resume_token="ck-1"),
        ),
    )
    result = runner.invoke(app, ["explain", str(path), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["run_id"] == "run-9"
    assert data["agent"] == "ops-bot"
    assert data["state"] == "waiting_unrouted"
    assert data["action"] == "add an owner and an escalation path"
    assert "owner" in data["reason"]


def test_now_option_expires_a_routed_approval(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        StopReceipt(
            run_id="r",
            agent="a",
            end=EndKind.APPROVAL_REQUESTED,
            reason=StopReason.APPROVAL_REQUIRED,
            approval=Approval(owner="ops", deadline_s=100.0, resume_token="ck"),
        ),
    )
    before = runner.invoke(app, ["explain", str(path), "--json", "--now", "99"])
    after = runner.invoke(app, ["explain", str(path), "--json", "--now", "100"])
    assert json.loads(before.stdout)["state"] == "waiting"
    assert json.loads(after.stdout)["state"] == "waiting_unrouted"
    # A time that is no time: NaN is never past a deadline, so it said "waiting" for ever.
    for bad in ("nan", "inf", "-inf"):
        refused = runner.invoke(app, ["explain", str(path), "--json", "--now", bad])
        assert refused.exit_code == 2 and "--now takes a finite time" in refused.output, bad


def test_missing_file_exits_2_naming_it(tmp_path: Path) -> None:
    path = tmp_path / "nope.json"
    result = runner.invoke(app, ["explain", str(path)])
    assert result.exit_code == 2
    assert "nope.json" in result.stderr
    assert result.stdout == ""


def test_bad_json_exits_2_naming_the_file(tmp_path: Path) -> None:
    path = tmp_path / "broken.json"
    path.write_text('{"schema": ')
    result = runner.invoke(app, ["explain", str(path)])
    assert result.exit_code == 2
    assert "broken.json" in result.stderr
    assert "not valid JSON" in flat(result.stderr)


@pytest.mark.parametrize(
    ("mutate", "field"),
    [
        (lambda d: d["counters"].update(steps="many"), "counters.steps"),
        (lambda d: d.update(end="crashed"), "end"),
        (lambda d: d.pop("run_id"), "run_id"),
    ],
)
def test_invalid_receipt_exits_2_naming_the_field(
    tmp_path: Path, mutate: Callable[[dict[str, Any]], object], field: str
) -> None:
    data = StopReceipt(
        run_id="r", agent="a", end=EndKind.NATURAL_FINISH, reason=StopReason.COMPLETED
    ).to_dict()
    mutate(data)
    path = tmp_path / "invalid.json"
    path.write_text(json.dumps(data))
    result = runner.invoke(app, ["explain", str(path)])
    assert result.exit_code == 2
    assert "invalid.json" in result.stderr
    assert f"'{field}'" in flat(result.stderr)


def test_reads_stdin(tmp_path: Path) -> None:
    text = StopReceipt(
        run_id="r", agent="a", end=EndKind.USER_ABORT, reason=StopReason.USER_CANCELLED
    ).to_json()
    result = runner.invoke(app, ["explain", "-", "--json"], input=text)
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["state"] == "bounded_stop"


def test_help() -> None:
    result = runner.invoke(app, ["explain", "--help"])
    assert result.exit_code == 0
    assert "RECEIPT.json" in result.stdout
    assert "--json" in result.stdout


@pytest.mark.parametrize(
    "data",
    [
        b"[" * 5000 + b"]" * 5000,                                       # deep JSON
        b'{"run_id": "r", "counters": {"steps": ' + b"9" * 5000 + b"}}",  # a 5,000-digit integer
        b"9" * 5000,
    ],
)
def test_hostile_receipts_exit_2_without_a_traceback(tmp_path: Path, data: bytes) -> None:
    path = tmp_path / "receipt.json"
    path.write_bytes(data)
    result = runner.invoke(app, ["explain", str(path)])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert str(path) in flat(result.stderr)


def test_a_fifo_is_refused_without_waiting_for_a_writer(tmp_path: Path) -> None:
    import os

    path = tmp_path / "receipt.json"
    os.mkfifo(path)
    result = runner.invoke(app, ["explain", str(path)])
    assert result.exit_code == 2 and "not a regular file" in flat(result.stderr)


def test_a_directory_is_refused_by_name_not_with_a_traceback(tmp_path: Path) -> None:
    # os.open() opens a directory on Linux; os.fdopen() then raised IsADirectoryError.
    result = runner.invoke(app, ["explain", str(tmp_path)])
    assert result.exit_code == 2, result.output
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "it is a directory, not a stop receipt file" in result.stderr
