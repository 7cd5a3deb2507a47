"""CustomCheck and the never-raise, always-on-time wrapper all verifiers share."""

from __future__ import annotations

import time

from tripwire.core.receipt import Evidence, VerifierKind
from tripwire.verify import CustomCheck, MessageCheck, run_all

T0 = 1_700_000_000.0


def clock() -> float:
    return T0


def test_true_passes_and_false_fails() -> None:
    ok = CustomCheck(target="s3://reports/q2.csv", fn=lambda: True, clock=clock)()
    assert ok.passed is True
    assert ok.kind is VerifierKind.CUSTOM
    assert ok.evidence is Evidence.INDEPENDENT
    assert ok.checked_at == T0
    no = CustomCheck(target="s3://reports/q2.csv", fn=lambda: False, clock=clock)()
    assert no.passed is False
    assert no.error is None


def test_observed_values_are_recorded() -> None:
    receipt = CustomCheck(
        target="crm contact 42", fn=lambda: (False, {"rows": 0, "table": "contacts"}), clock=clock
    )()
    assert receipt.passed is False
    assert receipt.observed == {"rows": 0, "table": "contacts", "passed": False}


def test_exception_becomes_a_failed_receipt() -> None:
    def boom() -> bool:
        raise PermissionError("access denied to bucket")

    receipt = CustomCheck(target="s3://reports/q2.csv", fn=boom, clock=clock)()
    assert receipt.passed is False
    assert receipt.error == "PermissionError: access denied to bucket"


def test_slow_check_times_out_on_time() -> None:
    started = time.monotonic()
    receipt = CustomCheck(
        target="slow service", fn=lambda: time.sleep(5) or True, timeout_s=0.2, clock=clock
    )()
    assert receipt.passed is False
    assert receipt.error == "timed out after 0.2 s"
    assert time.monotonic() - started < 1


def test_wrong_return_type_fails() -> None:
    receipt = CustomCheck(target="x", fn=lambda: "yes", clock=clock)()  # type: ignore[arg-type,return-value]
    assert receipt.passed is False
    assert receipt.error is not None and "str" in receipt.error


def test_unserializable_observed_value_fails() -> None:
    receipt = CustomCheck(target="x", fn=lambda: (True, {"blob": object()}), clock=clock)()  # type: ignore[arg-type,return-value,dict-item]
    assert receipt.passed is False
    assert receipt.error is not None


def test_declared_judge_evidence_is_kept() -> None:
    receipt = CustomCheck(
        target="rubric",
        fn=lambda: True,
        evidence=Evidence.JUDGE,
        checked_by="rubric-model",
        clock=clock,
    )()
    assert receipt.evidence is Evidence.JUDGE
    assert receipt.checked_by == "rubric-model"


def test_run_all_keeps_order() -> None:
    receipts = run_all(
        [
            CustomCheck(target="a", fn=lambda: True, clock=clock),
            MessageCheck(provider="ses", receipt_id=None, clock=clock),
        ]
    )
    assert [r.kind for r in receipts] == [VerifierKind.CUSTOM, VerifierKind.MESSAGE]
    assert [r.passed for r in receipts] == [True, False]
