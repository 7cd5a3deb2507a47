"""LLMJudge against a local fake OpenAI-compatible endpoint, and with a user callable."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence

import pytest

from tripwire.core.reasons import StopReason
from tripwire.core.receipt import (
    EndKind,
    Evidence,
    HealthState,
    StopReceipt,
    VerifierKind,
    classify,
)
from tripwire.errors import ConfigError
from tripwire.verify import LLMJudge, parse_verdict

from .conftest import LocalServer

T0 = 1_700_000_000.0
TASK = "Email the Q2 report to finance@example.com"
RESULT = "send_email returned id 0100018f; attachment q2.pdf, 184 kB"


def clock() -> float:
    return T0


def judge(server: LocalServer, **kwargs: object) -> LLMJudge:
    fields: dict[str, object] = {
        "task": TASK,
        "result": RESULT,
        "base_url": f"{server.base_url}/v1",
        "model": "tiny-judge",
        "api_key": "sk-judge-key",
        "clock": clock,
    }
    fields.update(kwargs)
    return LLMJudge(**fields)  # type: ignore[arg-type]


def test_yes_verdict_passes_as_judge_evidence(http_server: LocalServer) -> None:
    receipt = judge(http_server)()
    assert receipt.passed is True, receipt.error
    assert receipt.kind is VerifierKind.LLM_JUDGE
    assert receipt.evidence is Evidence.JUDGE
    assert receipt.checked_by == "llm_judge:tiny-judge"
    assert receipt.checked_at == T0
    assert receipt.observed == {"model": "tiny-judge", "done": True, "confidence": 0.9}


def test_request_is_an_openai_chat_completion(http_server: LocalServer) -> None:
    judge(http_server)()
    request = http_server.requests[-1]
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == "Bearer sk-judge-key"
    body = request["body"]
    assert body["model"] == "tiny-judge"
    assert body["temperature"] == 0
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert TASK in body["messages"][1]["content"]
    assert RESULT in body["messages"][1]["content"]


def test_receipt_keeps_neither_the_task_nor_the_key(http_server: LocalServer) -> None:
    text = json.dumps(judge(http_server)().to_dict())
    for secret in ("finance@example.com", "0100018f", "sk-judge-key"):
        assert secret not in text


def test_no_verdict_fails_without_error(http_server: LocalServer) -> None:
    http_server.judge_reply = '{"done": false, "confidence": 0.7, "reason": "no attachment"}'
    receipt = judge(http_server)()
    assert receipt.passed is False
    assert receipt.error is None
    assert receipt.observed["done"] is False


def test_fenced_reply_with_prose_is_parsed(http_server: LocalServer) -> None:
    http_server.judge_reply = 'Sure.\n```json\n{"done": true, "confidence": 1}\n```\n'
    assert judge(http_server)().passed is True


def test_unparsable_reply_is_a_failed_receipt(http_server: LocalServer) -> None:
    http_server.judge_reply = "Yes, it looks done to me."
    receipt = judge(http_server)()
    assert receipt.passed is False
    assert receipt.error == "the judge's reply holds no JSON object"


def test_low_confidence_does_not_pass(http_server: LocalServer) -> None:
    http_server.judge_reply = '{"done": true, "confidence": 0.5}'
    assert judge(http_server, min_confidence=0.8)().passed is False
    assert judge(http_server, min_confidence=0.5)().passed is True


def test_endpoint_error_is_a_failed_receipt_without_the_body(http_server: LocalServer) -> None:
    http_server.judge_status = 500
    receipt = judge(http_server)()
    assert receipt.passed is False
    assert receipt.error == "RuntimeError: the judge endpoint answered HTTP 500"


def test_slow_endpoint_times_out(http_server: LocalServer) -> None:
    started = time.monotonic()
    receipt = judge(http_server, base_url=f"{http_server.base_url}/slow/v1", timeout_s=0.3)()
    assert receipt.passed is False
    assert receipt.error is not None
    assert time.monotonic() - started < 2


def test_user_callable_judge() -> None:
    seen: list[Sequence[dict[str, str]]] = []

    def chat(messages: Sequence[dict[str, str]]) -> str:
        seen.append(messages)
        return '{"done": true, "confidence": 0.95}'

    receipt = LLMJudge(task=TASK, result=RESULT, chat=chat, clock=clock)()
    assert receipt.passed is True
    assert receipt.checked_by == "llm_judge:callable"
    assert TASK in seen[0][1]["content"]


def test_user_callable_that_raises_is_a_failed_receipt() -> None:
    def chat(messages: Sequence[dict[str, str]]) -> str:
        raise ConnectionError("model server down")

    receipt = LLMJudge(task=TASK, result=RESULT, chat=chat, clock=clock)()
    assert receipt.passed is False
    assert receipt.error == "ConnectionError: model server down"


def test_judge_receipt_counts_only_for_a_different_checker(http_server: LocalServer) -> None:
    outcome = judge(http_server)()
    run = StopReceipt(
        run_id="r",
        agent="report-bot",
        end=EndKind.NATURAL_FINISH,
        reason=StopReason.COMPLETED,
        outcomes=(outcome,),
    )
    assert classify(run).state is HealthState.VERIFIED_COMPLETE
    self_judged = StopReceipt(
        run_id="r",
        agent="llm_judge:tiny-judge",
        end=EndKind.NATURAL_FINISH,
        reason=StopReason.COMPLETED,
        outcomes=(outcome,),
    )
    assert classify(self_judged).state is HealthState.FALSE_COMPLETE


@pytest.mark.parametrize(
    ("text", "verdict"),
    [
        ('{"done": true}', (True, None)),
        ('{"done": false, "confidence": 0}', (False, 0.0)),
        ('noise {"done": true, "confidence": 0.25} noise', (True, 0.25)),
    ],
)
def test_parse_verdict(text: str, verdict: tuple[bool, float | None]) -> None:
    assert parse_verdict(text) == verdict


@pytest.mark.parametrize(
    "text", ['{"done": "yes"}', '{"status": "done"}', '{"done": true, "confidence": 7}', "{"]
)
def test_parse_verdict_rejects(text: str) -> None:
    with pytest.raises(ValueError):
        parse_verdict(text)


def test_needs_exactly_one_client() -> None:
    with pytest.raises(ConfigError) as info:
        LLMJudge(task=TASK, result=RESULT)
    assert info.value.field == "LLMJudge.base_url"
    with pytest.raises(ConfigError) as info:
        LLMJudge(task=TASK, result=RESULT, base_url="http://127.0.0.1:1/v1")
    assert info.value.field == "LLMJudge.model"


def test_key_is_not_in_repr() -> None:
    j = LLMJudge(
        task=TASK, result=RESULT, base_url="http://127.0.0.1:1/v1", model="m", api_key="sk-x"
    )
    assert "sk-x" not in repr(j)
    assert TASK not in repr(j)
