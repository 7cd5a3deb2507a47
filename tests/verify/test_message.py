"""MessageCheck: the provider's receipt id is present and well-formed."""

from __future__ import annotations

import pytest

from tripwire.core.receipt import VerifierKind
from tripwire.errors import ConfigError
from tripwire.verify import MessageCheck

T0 = 1_700_000_000.0
TWILIO_SID = r"SM[0-9a-f]{32}"


def clock() -> float:
    return T0


def test_well_formed_id_passes() -> None:
    sid = "SM" + "0123456789abcdef" * 2
    receipt = MessageCheck(provider="twilio", receipt_id=sid, pattern=TWILIO_SID, clock=clock)()
    assert receipt.passed is True
    assert receipt.kind is VerifierKind.MESSAGE
    assert receipt.target == "twilio delivery receipt"
    assert receipt.observed == {"present": True, "matches": True, "receipt_id": sid}


@pytest.mark.parametrize("receipt_id", [None, "", "   "])
def test_missing_id_fails(receipt_id: str | None) -> None:
    receipt = MessageCheck(provider="ses", receipt_id=receipt_id, clock=clock)()
    assert receipt.passed is False
    assert receipt.observed == {"present": False}


def test_id_not_matching_the_whole_pattern_fails() -> None:
    receipt = MessageCheck(
        provider="twilio", receipt_id="SM123 sent!", pattern=TWILIO_SID, clock=clock
    )()
    assert receipt.passed is False
    assert receipt.observed["matches"] is False


def test_default_pattern_rejects_prose() -> None:
    assert MessageCheck(provider="smtp", receipt_id="done", clock=clock)().passed is False
    ok = MessageCheck(provider="smtp", receipt_id="<a1b2c3@mail.example.com>", clock=clock)()
    assert ok.passed is True


def test_bad_pattern_fails_at_construction() -> None:
    with pytest.raises(ConfigError) as info:
        MessageCheck(provider="x", receipt_id="y", pattern="([")
    assert info.value.field == "MessageCheck.pattern"
