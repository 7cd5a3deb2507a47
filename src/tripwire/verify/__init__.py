"""Outcome verifiers: independent checks of where a run's work should have landed.

Each verifier is a small frozen value, validated when built, and called once when the run
ends; the call returns an :class:`~tripwire.core.receipt.OutcomeReceipt` and never raises
(failures and timeouts become failed receipts with an ``error``). Attach the receipts to the
run's :class:`~tripwire.core.receipt.StopReceipt` (``outcomes=``).

- :class:`FileCheck`: a file exists, with content type, minimum size, SHA-256, JSON Schema;
- :class:`SqlRowCheck`: a SQL query (SQLAlchemy) returns a row with the intended fields;
- :class:`HttpCheck`: a URL answers with a status and, optionally, a version string;
- :class:`MessageCheck`: a message provider's receipt id is present and well-formed;
- :class:`CustomCheck`: any callable;
- :class:`LLMJudge`: a small model's verdict on "did it do what was asked" (judge evidence).

``SqlRowCheck``, ``HttpCheck``, ``LLMJudge`` with an endpoint, and ``FileCheck`` with a JSON
Schema need ``pip install 'tripwire[verify]'``; they say so when it is missing.
"""

from __future__ import annotations

from collections.abc import Iterable

from tripwire.core.receipt import OutcomeReceipt
from tripwire.verify._common import DEFAULT_TIMEOUT_S, Clock, Verifier
from tripwire.verify._custom import CheckResult, CustomCheck
from tripwire.verify._file import FileCheck
from tripwire.verify._http import HttpCheck
from tripwire.verify._judge import JUDGE_SYSTEM_PROMPT, ChatFn, LLMJudge, parse_verdict
from tripwire.verify._message import DEFAULT_RECEIPT_ID_PATTERN, MessageCheck
from tripwire.verify._sql import SqlRowCheck

__all__ = [
    "DEFAULT_RECEIPT_ID_PATTERN",
    "DEFAULT_TIMEOUT_S",
    "JUDGE_SYSTEM_PROMPT",
    "ChatFn",
    "CheckResult",
    "Clock",
    "CustomCheck",
    "FileCheck",
    "HttpCheck",
    "LLMJudge",
    "MessageCheck",
    "SqlRowCheck",
    "Verifier",
    "parse_verdict",
    "run_all",
]


def run_all(verifiers: Iterable[Verifier]) -> tuple[OutcomeReceipt, ...]:
    """Run verifiers one after another and return their receipts, in order. Never raises."""
    return tuple(verify() for verify in verifiers)
