"""Stop receipts: the 11-case health fixture, the priority rules, JSON."""

from __future__ import annotations

import json
import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st
from msgspec.structs import replace

from tripwire.core.reasons import StopReason, Verdict
from tripwire.core.receipt import (
    SCHEMA,
    AfterStop,
    Approval,
    Counters,
    EndKind,
    Evidence,
    HealthState,
    OutcomeReceipt,
    OutcomeRequirement,
    StopReceipt,
    ToolFailure,
    VerifierKind,
    classify,
)
from tripwire.errors import ConfigError, InputError

T0 = 1_700_000_000.0

FILE_OK = OutcomeReceipt(
    kind=VerifierKind.FILE,
    target="out/invoice-0042.pdf",
    checked_at=T0 + 61,
    passed=True,
    checked_by="tripwire.verify.file",
    observed={"exists": True, "size": 18_204},
    expected={"exists": True, "min_size": 1024},
)
FILE_MISSING = OutcomeReceipt(
    kind=VerifierKind.FILE,
    target="out/invoice-0042.pdf",
    checked_at=T0 + 61,
    passed=False,
    checked_by="tripwire.verify.file",
    observed={"exists": False},
    expected={"exists": True},
)
JUDGE_YES = OutcomeReceipt(
    kind=VerifierKind.LLM_JUDGE,
    target="did the agent do what was asked?",
    checked_at=T0 + 62,
    passed=True,
    checked_by="llm_judge:tiny",
    evidence=Evidence.JUDGE,
    observed={"done": True, "confidence": 0.9},
)
JUDGE_NO = replace(JUDGE_YES, passed=False, observed={"done": False, "confidence": 0.8})


def receipt(**fields: object) -> StopReceipt:
    base: dict[str, object] = {
        "run_id": "run-1",
        "agent": "invoice-bot",
        "end": EndKind.NATURAL_FINISH,
        "reason": StopReason.COMPLETED,
        "started_at": T0,
        "ended_at": T0 + 60,
    }
    base.update(fields)
    return StopReceipt(**base)  # type: ignore[arg-type]


# The 11-case fixture of issue 6. Expected states written from the priority table.
ELEVEN = {
    "natural_finish_with_outcome": (
        receipt(end=EndKind.NATURAL_FINISH, reason=StopReason.COMPLETED, outcomes=(FILE_OK,)),
        HealthState.VERIFIED_COMPLETE,
    ),
    "natural_finish_without_outcome": (
        receipt(end=EndKind.NATURAL_FINISH, reason=StopReason.COMPLETED),
        HealthState.FALSE_COMPLETE,
    ),
    "explicit_done_with_outcome": (
        receipt(end=EndKind.EXPLICIT_DONE, reason=StopReason.COMPLETED, outcomes=(FILE_OK,)),
        HealthState.VERIFIED_COMPLETE,
    ),
    "explicit_done_without_outcome": (
        receipt(end=EndKind.EXPLICIT_DONE, reason=StopReason.COMPLETED),
        HealthState.FALSE_COMPLETE,
    ),
    "step_cap": (
        receipt(
            end=EndKind.STOP_CONDITION,
            reason=StopReason.MAX_STEPS,
            condition={"steps": 20, "max_steps": 20},
            counters=Counters(steps=20, tool_calls=31),
        ),
        HealthState.BOUNDED_STOP,
    ),
    "token_budget": (
        receipt(
            end=EndKind.STOP_CONDITION,
            reason=StopReason.MAX_TOTAL_TOKENS,
            condition={"total_tokens": 100_412, "max_total_tokens": 100_000},
            counters=Counters(steps=7, input_tokens=90_000, output_tokens=10_412),
        ),
        HealthState.BOUNDED_STOP,
    ),
    "approval_routed": (
        receipt(
            end=EndKind.APPROVAL_REQUESTED,
            reason=StopReason.APPROVAL_REQUIRED,
            approval=Approval(owner="finance-oncall", deadline_s=T0 + 3600, resume_token="ck-9"),
        ),
        HealthState.WAITING,
    ),
    "approval_unrouted": (
        receipt(
            end=EndKind.APPROVAL_REQUESTED,
            reason=StopReason.APPROVAL_REQUIRED,
            approval=Approval(resume_token="ck-9"),
        ),
        HealthState.WAITING_UNROUTED,
    ),
    "tool_error": (
        receipt(
            end=EndKind.TOOL_FAILURE,
            reason=StopReason.TOOL_ERROR,
            tool_failure=ToolFailure(tool="send_invoice", error_type="HTTP 503", call_index=5),
        ),
        HealthState.FAILED,
    ),
    "timeout": (
        receipt(
            end=EndKind.TIMEOUT,
            reason=StopReason.MAX_DURATION,
            condition={"duration_s": 300.4, "max_duration_s": 300.0},
            verdict=Verdict.STUCK,
        ),
        HealthState.STUCK,
    ),
    "user_abort": (
        receipt(end=EndKind.USER_ABORT, reason=StopReason.USER_CANCELLED),
        HealthState.BOUNDED_STOP,
    ),
}


@pytest.mark.parametrize("case", sorted(ELEVEN))
def test_eleven_case_fixture(case: str) -> None:
    stop, expected = ELEVEN[case]
    assert classify(stop).state is expected


@pytest.mark.parametrize(
    ("with_receipt", "without_receipt"),
    [
        ("natural_finish_with_outcome", "natural_finish_without_outcome"),
        ("explicit_done_with_outcome", "explicit_done_without_outcome"),
    ],
)
def test_pairs_differing_only_by_outcome_receipt_differ(
    with_receipt: str, without_receipt: str
) -> None:
    a, b = ELEVEN[with_receipt][0], ELEVEN[without_receipt][0]
    assert replace(a, outcomes=()) == b
    assert classify(a).state is not classify(b).state


def test_operator_actions_are_the_documented_ones() -> None:
    assert {s: s.operator_action for s in HealthState} == {
        HealthState.FAILED: (
            "diagnose the tool boundary; do not blindly retry uncertain side effects"
        ),
        HealthState.WAITING: "route the decision; keep it resumable",
        HealthState.WAITING_UNROUTED: "add an owner and an escalation path",
        HealthState.STUCK: "inspect the last durable progress; pick one bounded recovery",
        HealthState.BOUNDED_STOP: (
            "keep the partial work; decide if a new bounded run is justified"
        ),
        HealthState.VERIFIED_COMPLETE: "close the run",
        HealthState.COMPLETE_UNVERIFIED: (
            "close the run; nothing beyond the control flow was checked, so add an outcome "
            "verifier if this agent changes anything outside itself"
        ),
        HealthState.FALSE_COMPLETE: "check the destination or reopen",
        HealthState.UNCERTAIN: "ask before acting",
    }
    health = classify(ELEVEN["tool_error"][0])
    assert (
        health.action == "diagnose the tool boundary; do not blindly retry uncertain side effects"
    )
    assert health.to_dict()["state"] == "failed"


# --- priority and disagreement ---------------------------------------------------------------


def test_timeout_at_step_four_is_a_timeout_even_when_the_step_cap_is_four() -> None:
    stop = receipt(
        end=EndKind.TIMEOUT,
        reason=StopReason.MAX_DURATION,
        condition={"duration_s": 30.0, "max_duration_s": 30.0},
        counters=Counters(steps=4),
        policy_version="max_steps=4",
    )
    assert classify(stop).state is HealthState.STUCK


def test_timeout_while_making_progress_is_a_bounded_stop() -> None:
    stop = receipt(end=EndKind.TIMEOUT, reason=StopReason.MAX_DURATION, verdict=Verdict.WORKING)
    assert classify(stop).state is HealthState.BOUNDED_STOP


@pytest.mark.parametrize("verdict", [None, Verdict.STUCK, Verdict.RETRYING, Verdict.UNCERTAIN])
def test_timeout_without_valid_progress_is_stuck(verdict: Verdict | None) -> None:
    stop = receipt(end=EndKind.TIMEOUT, reason=None, verdict=verdict)
    assert classify(stop).state is HealthState.STUCK


def test_loop_detector_stop_is_stuck() -> None:
    stop = receipt(end=EndKind.STOP_CONDITION, reason=StopReason.LOOP_DETECTED)
    assert classify(stop).state is HealthState.STUCK


def test_tool_failure_outranks_an_approval_request() -> None:
    stop = replace(
        ELEVEN["approval_routed"][0],
        tool_failure=ToolFailure(tool="charge_card", error_type="TimeoutError"),
    )
    assert classify(stop).state is HealthState.FAILED


def test_tool_failure_recorded_only_as_end_kind_is_failed() -> None:
    assert classify(receipt(end=EndKind.TOOL_FAILURE, reason=None)).state is HealthState.FAILED


def test_approval_request_stays_waiting_not_incomplete() -> None:
    stop = replace(ELEVEN["approval_routed"][0], requires_outcome=OutcomeRequirement.INDEPENDENT)
    assert classify(stop).state is HealthState.WAITING


@pytest.mark.parametrize("missing", ["owner", "deadline_s", "resume_token"])
def test_approval_missing_any_routing_field_is_unrouted(missing: str) -> None:
    fields = {"owner": "ops", "deadline_s": T0 + 60, "resume_token": "ck"}
    fields[missing] = None
    stop = receipt(
        end=EndKind.APPROVAL_REQUESTED,
        reason=StopReason.APPROVAL_REQUIRED,
        approval=Approval(**fields),  # type: ignore[arg-type]
    )
    assert classify(stop).state is HealthState.WAITING_UNROUTED


def test_approval_request_without_any_approval_record_is_unrouted() -> None:
    stop = receipt(end=EndKind.APPROVAL_REQUESTED, reason=StopReason.APPROVAL_REQUIRED)
    assert classify(stop).state is HealthState.WAITING_UNROUTED


def test_routed_approval_past_its_deadline_is_unrouted() -> None:
    stop = ELEVEN["approval_routed"][0]
    assert classify(stop, now=T0 + 3599).state is HealthState.WAITING
    assert classify(stop, now=T0 + 3600).state is HealthState.WAITING_UNROUTED


def test_no_cause_recorded_is_uncertain() -> None:
    stop = receipt(end=None, reason=None, outcomes=(FILE_OK,))
    assert classify(stop).state is HealthState.UNCERTAIN


@pytest.mark.parametrize(
    ("end", "reason"),
    [
        (EndKind.NATURAL_FINISH, StopReason.MAX_STEPS),
        (EndKind.STOP_CONDITION, StopReason.COMPLETED),
        (EndKind.USER_ABORT, StopReason.MAX_COST),
        (EndKind.TIMEOUT, StopReason.COMPLETED),
        (EndKind.APPROVAL_REQUESTED, StopReason.USER_CANCELLED),
    ],
)
def test_end_kind_and_reason_that_disagree_are_uncertain(end: EndKind, reason: StopReason) -> None:
    assert classify(receipt(end=end, reason=reason, outcomes=(FILE_OK,))).state is (
        HealthState.UNCERTAIN
    )


def test_approval_record_on_a_finished_run_is_uncertain() -> None:
    stop = receipt(outcomes=(FILE_OK,), approval=Approval(owner="ops"))
    assert classify(stop).state is HealthState.UNCERTAIN


def test_cap_reason_whose_inputs_show_the_cap_not_reached_is_uncertain() -> None:
    stop = receipt(
        end=EndKind.STOP_CONDITION,
        reason=StopReason.MAX_STEPS,
        condition={"steps": 12, "max_steps": 20},
    )
    assert classify(stop).state is HealthState.UNCERTAIN


def test_every_stop_reason_has_a_meaning() -> None:
    for reason in StopReason:
        assert classify(receipt(end=None, reason=reason)).state is not HealthState.UNCERTAIN


# --- activity after the stop ----------------------------------------------------------------


CLEAN_STOPS = {
    name: ELEVEN[name][0]
    for name in (
        "natural_finish_with_outcome",
        "step_cap",
        "token_budget",
        "approval_routed",
        "timeout",
        "user_abort",
    )
}


@pytest.mark.parametrize("case", sorted(CLEAN_STOPS))
def test_a_run_that_went_on_after_its_stop_is_never_a_clean_stop(case: str) -> None:
    stop = replace(CLEAN_STOPS[case], after_stop=AfterStop(model_calls=2, tool_calls=3))
    health = classify(stop)
    assert health.state is HealthState.UNCERTAIN
    assert "went on after the stop (2 model call(s), 3 tool call(s))" in health.reason
    assert "framework integration that ends the run" in health.action
    assert health.to_dict()["action"] == health.action


@pytest.mark.parametrize("after", [AfterStop(model_calls=1), AfterStop(tool_calls=1)])
def test_one_call_of_either_kind_after_the_stop_is_enough(after: AfterStop) -> None:
    stop = replace(ELEVEN["step_cap"][0], after_stop=after)
    assert classify(stop).state is HealthState.UNCERTAIN


def test_no_activity_after_the_stop_classifies_as_before() -> None:
    for case, (stop, expected) in ELEVEN.items():
        quiet = replace(stop, after_stop=AfterStop(model_calls=0, tool_calls=0))
        assert classify(quiet).state is expected, case


def test_a_tool_failure_stays_failed_and_says_the_run_went_on() -> None:
    stop = replace(ELEVEN["tool_error"][0], after_stop=AfterStop(tool_calls=4))
    health = classify(stop)
    assert health.state is HealthState.FAILED
    assert "went on after the stop (0 model call(s), 4 tool call(s))" in health.reason


@pytest.mark.parametrize("bad", [-1, 1.5, True, "2", None])
def test_after_stop_counts_are_validated(bad: object) -> None:
    with pytest.raises(ConfigError) as info:
        AfterStop(tool_calls=bad)  # type: ignore[arg-type]
    assert info.value.field == "AfterStop.tool_calls"


def test_after_stop_round_trips_through_json() -> None:
    stop = replace(FULL, after_stop=AfterStop(model_calls=1, tool_calls=7))
    data = json.loads(stop.to_json())
    assert data["after_stop"] == {"model_calls": 1, "tool_calls": 7}
    again = StopReceipt.from_json(stop.to_json())
    assert again == stop
    assert classify(again).state is HealthState.UNCERTAIN


def test_a_receipt_without_after_stop_still_reads() -> None:
    data = FULL.to_dict()
    del data["after_stop"]
    assert StopReceipt.from_dict(data) == FULL


def test_a_bad_after_stop_names_the_field() -> None:
    data = FULL.to_dict()
    data["after_stop"] = {"model_calls": -3, "tool_calls": 0}
    with pytest.raises(InputError) as info:
        StopReceipt.from_dict(data, source="r.json")
    assert "after_stop.model_calls" in info.value.detail


# --- outcome receipts ------------------------------------------------------------------------


def test_failed_outcome_receipt_is_not_verification() -> None:
    assert classify(receipt(outcomes=(FILE_MISSING,))).state is HealthState.FALSE_COMPLETE


def test_one_failed_independent_check_outweighs_passing_ones() -> None:
    stop = receipt(outcomes=(FILE_OK, FILE_MISSING, JUDGE_YES))
    assert classify(stop).state is HealthState.FALSE_COMPLETE


def test_receipts_checked_by_the_agent_itself_never_count() -> None:
    self_file = replace(FILE_OK, checked_by="invoice-bot")
    self_judge = replace(JUDGE_YES, checked_by="invoice-bot")
    stop = receipt(outcomes=(self_file, self_judge))
    assert classify(stop).state is HealthState.FALSE_COMPLETE


def test_model_saying_done_is_not_a_receipt() -> None:
    with pytest.raises(InputError):
        OutcomeReceipt.from_dict({"status": "done"})
    data = receipt().to_dict()
    data["outcomes"] = [{"status": "done"}]
    with pytest.raises(InputError) as info:
        StopReceipt.from_dict(data, source="r.json")
    assert info.value.source == "r.json"
    assert "outcomes[0]" in info.value.detail


def test_judge_only_counts_when_policy_accepts_judge_evidence() -> None:
    stop = receipt(outcomes=(JUDGE_YES,))
    assert classify(stop).state is HealthState.VERIFIED_COMPLETE
    strict = replace(stop, requires_outcome=OutcomeRequirement.INDEPENDENT)
    assert classify(strict).state is HealthState.FALSE_COMPLETE


def test_failing_judge_alone_is_false_complete() -> None:
    assert classify(receipt(outcomes=(JUDGE_NO,))).state is HealthState.FALSE_COMPLETE


def test_independent_pass_with_judge_fail_is_uncertain() -> None:
    assert classify(receipt(outcomes=(FILE_OK, JUDGE_NO))).state is HealthState.UNCERTAIN


def test_judges_that_disagree_are_uncertain() -> None:
    assert classify(receipt(outcomes=(JUDGE_YES, JUDGE_NO))).state is HealthState.UNCERTAIN


def test_no_receipt_required_finish_is_complete_but_not_verified() -> None:
    stop = receipt(requires_outcome=OutcomeRequirement.NONE)
    assert classify(stop).state is HealthState.COMPLETE_UNVERIFIED
    assert classify(replace(stop, outcomes=(FILE_OK,))).state is HealthState.VERIFIED_COMPLETE
    assert classify(replace(stop, outcomes=(FILE_MISSING,))).state is (HealthState.FALSE_COMPLETE)


def test_llm_judge_receipt_cannot_claim_independent_evidence() -> None:
    with pytest.raises(ConfigError) as info:
        replace(JUDGE_YES, evidence=Evidence.INDEPENDENT)
    assert info.value.field == "OutcomeReceipt.evidence"


def test_passed_receipt_cannot_carry_an_error() -> None:
    with pytest.raises(ConfigError) as info:
        replace(FILE_OK, error="timed out")
    assert info.value.field == "OutcomeReceipt.error"


# --- serialization ---------------------------------------------------------------------------


FULL = receipt(
    end=EndKind.STOP_CONDITION,
    reason=StopReason.MAX_COST,
    condition={"cost_usd": 2.0125, "max_cost_usd": 2.0, "tool": "search_docs"},
    policy_version="p7",
    normalizer_version="n1:v3",
    counters=Counters(
        steps=12,
        tool_calls=30,
        input_tokens=51_000,
        output_tokens=4_200,
        cost_usd=2.0125,
        duration_s=61.5,
    ),
    verdict=Verdict.WORKING,
    outcomes=(FILE_OK, JUDGE_NO),
    requires_outcome=OutcomeRequirement.INDEPENDENT,
)


def test_json_round_trip_is_exact() -> None:
    text = FULL.to_json()
    again = StopReceipt.from_json(text)
    assert again == FULL
    assert again.to_json() == text
    data = json.loads(text)
    assert data["schema"] == "tripwire.stop_receipt/1" == SCHEMA
    assert data["reason"] == "max_cost"
    assert data["counters"]["steps"] == 12
    assert data["outcomes"][1]["evidence"] == "judge"
    assert classify(again).state is HealthState.BOUNDED_STOP


def test_round_trip_with_approval_and_tool_failure() -> None:
    for stop in (ELEVEN["approval_routed"][0], ELEVEN["tool_error"][0]):
        assert StopReceipt.from_json(stop.to_json(indent=2)) == stop


def test_receipt_survives_pickling() -> None:
    assert pickle.loads(pickle.dumps(FULL)) == FULL


def test_from_json_names_the_source_and_line_of_bad_json() -> None:
    with pytest.raises(InputError) as info:
        StopReceipt.from_json('{\n  "schema": ', source="r.json")
    assert info.value.source == "r.json"
    assert info.value.line == 2


@pytest.mark.parametrize(
    ("path", "value", "field"),
    [
        (("counters", "steps"), -1, "counters.steps"),
        (("reason",), "finished", "reason"),
        (("schema",), "tripwire.stop_receipt/99", "schema"),
        (("outcomes",), "none", "outcomes"),
        (("prompt",), "You are a helpful agent", "prompt"),
    ],
)
def test_from_dict_names_the_invalid_field(
    path: tuple[str, ...], value: object, field: str
) -> None:
    data = FULL.to_dict()
    target = data
    for key in path[:-1]:
        target = target[key]
    target[path[-1]] = value
    with pytest.raises(InputError) as info:
        StopReceipt.from_dict(data, source="bad.json")
    assert info.value.source == "bad.json"
    assert f"'{field}'" in info.value.detail


def test_non_finite_counters_are_rejected() -> None:
    with pytest.raises(ConfigError) as info:
        Counters(cost_usd=float("nan"))
    assert info.value.field == "Counters.cost_usd"


def test_ended_before_started_is_rejected() -> None:
    with pytest.raises(ConfigError) as info:
        receipt(started_at=T0, ended_at=T0 - 1)
    assert info.value.field == "StopReceipt.ended_at"


counts = st.integers(min_value=0, max_value=2**53)
seconds = st.none() | st.floats(min_value=0, max_value=1e12, allow_nan=False)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**63)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40)
)


@given(
    steps_=counts,
    tool_calls=counts,
    input_tokens=counts,
    output_tokens=counts,
    cost=seconds,
    duration=seconds,
    condition=st.dictionaries(st.text(max_size=20), scalars, max_size=8),
    end=st.none() | st.sampled_from(EndKind),
    reason=st.none() | st.sampled_from(StopReason),
    verdict=st.none() | st.sampled_from(Verdict),
)
def test_round_trip_for_arbitrary_counters(
    steps_: int,
    tool_calls: int,
    input_tokens: int,
    output_tokens: int,
    cost: float | None,
    duration: float | None,
    condition: dict[str, object],
    end: EndKind | None,
    reason: StopReason | None,
    verdict: Verdict | None,
) -> None:
    stop = receipt(
        end=end,
        reason=reason,
        verdict=verdict,
        condition=condition,
        counters=Counters(
            steps=steps_,
            tool_calls=tool_calls,
            input_tokens=input_tokens,
            output_tokens=output_tokens,
            cost_usd=cost,
            duration_s=duration,
        ),
    )
    again = StopReceipt.from_json(stop.to_json())
    assert again == stop
    assert again.to_json() == stop.to_json()
    assert classify(again) == classify(stop)


# --- the msgspec format: old receipts, hostile input, one counters conversion ----------------


OLD_RECEIPT = """{
  "schema": "tripwire.stop_receipt/1",
  "run_id": "run-7",
  "agent": "invoice-bot",
  "end": "stop_condition",
  "reason": "max_steps",
  "condition": {"max_steps": 20, "steps": 20},
  "policy_version": "p1",
  "normalizer_version": "n1:v3",
  "counters": {"steps": 20, "tool_calls": 31, "input_tokens": 0, "output_tokens": 0,
               "cost_usd": null, "duration_s": 12.5},
  "verdict": "working",
  "approval": null,
  "outcomes": [],
  "requires_outcome": "any",
  "tool_failure": null,
  "started_at": 1700000000.0,
  "ended_at": 1700000012.5
}"""
"""A receipt as the hand-written decoder's version wrote it (no after_stop, no unpriced_calls)."""


def test_a_receipt_written_before_the_msgspec_format_still_reads() -> None:
    stop = StopReceipt.from_json(OLD_RECEIPT, source="old.json")
    assert stop.reason is StopReason.MAX_STEPS
    assert stop.counters == Counters(steps=20, tool_calls=31, duration_s=12.5)
    assert stop.after_stop is None
    assert classify(stop).state is HealthState.BOUNDED_STOP


def test_the_health_classification_is_its_own_module_and_still_imports_from_receipt() -> None:
    from tripwire.core import health, receipt

    assert receipt.classify is health.classify
    assert receipt.Health is health.Health
    assert receipt.HealthState is health.HealthState


def test_an_invalid_counter_is_named_with_the_value_seen() -> None:
    data = json.loads(OLD_RECEIPT)
    data["counters"]["steps"] = -1
    with pytest.raises(InputError) as info:
        StopReceipt.from_dict(data, source="r.json")
    assert info.value.detail == "field 'counters.steps': expected an integer >= 0, got -1"


def test_another_schema_is_reported_before_its_unknown_fields() -> None:
    data = json.loads(OLD_RECEIPT)
    data["schema"] = "tripwire.stop_receipt/2"
    data["new_thing"] = {"x": 1}
    for read in (
        lambda: StopReceipt.from_dict(data, source="r.json"),
        lambda: StopReceipt.from_json(json.dumps(data), source="r.json"),
    ):
        with pytest.raises(InputError) as info:
            read()
        assert info.value.detail.startswith(
            "field 'schema': unsupported receipt schema 'tripwire.stop_receipt/2'"
        )


@pytest.mark.parametrize(
    "text",
    [
        '{"run_id": "r", "agent": "a", "end": null, "reason": null, "x": '
        + "[" * 100_000
        + "]" * 100_000
        + "}",
        '{"schema": 5, "x": ' + "[" * 100_000 + "]" * 100_000 + "}",
        '{"run_id": "r", "agent": "a", "end": null, "reason": null, "condition": {"x": '
        + "9" * 5000
        + "}}",
        '{"run_id": "r", "agent": "a", "end": null, "reason": null, "started_at": 1e999}',
        '{"run_id": "r", "agent": "a", "end": null, "reason": null, "condition": {"x": '
        + "[" * 100_000,
        "[" * 100_000,
        b"\xff\xfe{}",
    ],
)
def test_hostile_json_is_an_input_error(text: str | bytes) -> None:
    with pytest.raises(InputError) as info:
        StopReceipt.from_json(text, source="bad.json")
    assert info.value.source == "bad.json"


def test_deep_python_data_is_an_input_error() -> None:
    deep: dict[str, object] = {}
    cur = deep
    for _ in range(100_000):
        cur["a"] = {}
        cur = cur["a"]  # type: ignore[assignment]
    data = json.loads(OLD_RECEIPT)
    data["condition"] = deep
    with pytest.raises(InputError) as info:
        StopReceipt.from_dict(data, source="deep")
    assert "condition" in info.value.detail


def test_a_byte_order_mark_is_not_an_error() -> None:
    assert StopReceipt.from_json(("\ufeff" + OLD_RECEIPT).encode()).run_id == "run-7"
    assert StopReceipt.from_json("\ufeff" + OLD_RECEIPT).run_id == "run-7"


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, 10**400])
def test_integers_that_do_not_fit_in_64_bits_are_refused_when_built(value: int) -> None:
    with pytest.raises(ConfigError) as info:
        receipt(condition={"steps": value})
    assert info.value.field == "StopReceipt.condition['steps']"
    with pytest.raises(ConfigError):
        Counters(tool_calls=2**64)


def test_integers_at_the_64_bit_edges_round_trip() -> None:
    stop = receipt(condition={"lo": -(2**63), "hi": 2**64 - 1}, counters=Counters(steps=2**63))
    assert StopReceipt.from_json(stop.to_json()) == stop


def test_counters_come_from_the_budget_meter_in_one_place() -> None:
    from tripwire.core.budget import RunCounters

    run = RunCounters(
        steps=3, tool_calls=5, input_tokens=10, output_tokens=4, cost_usd=0.25, elapsed_s=9.5,
        unpriced_calls=1,
    )
    assert Counters.from_run(run) == Counters(
        steps=3, tool_calls=5, input_tokens=10, output_tokens=4, cost_usd=0.25, duration_s=9.5,
        unpriced_calls=1,
    )
    only_unpriced = RunCounters(steps=2, unpriced_calls=2)
    assert Counters.from_run(only_unpriced).cost_usd is None
    assert Counters.from_run(RunCounters(steps=1)).cost_usd == 0.0


def test_the_constructors_still_validate() -> None:
    with pytest.raises(ConfigError) as info:
        receipt(end="natural_finish")
    assert info.value.field == "StopReceipt.end"
    with pytest.raises(ConfigError) as info:
        receipt(outcomes=("done",))
    assert info.value.field == "StopReceipt.outcomes"


# --- why an outcome check failed -----------------------------------------------------------


def outcome(**fields: object) -> OutcomeReceipt:
    base: dict[str, object] = {
        "kind": VerifierKind.SQL,
        "target": "sqlite:///app.db :: SELECT status FROM invoices",
        "checked_at": T0,
        "passed": False,
        "checked_by": "tripwire.verify.sql",
    }
    base.update(fields)
    return OutcomeReceipt(**base)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        (
            {"observed": {"row": True, "status": "sent"}, "expected": {"row": True, "status": "paid"}},
            "status: expected 'paid', observed 'sent'",
        ),
        ({"observed": {"row": False}, "expected": {"row": True, "status": "paid"}}, "row: expected True, observed False"),
        (
            {"kind": VerifierKind.FILE, "observed": {"exists": True, "size": 10}, "expected": {"exists": True, "min_size": 1024}},
            "size=10 below min_size=1024",
        ),
        (
            {"observed": {"row": True, "missing_columns": "total"}, "expected": {"row": True, "total": 5}},
            "missing columns: total",
        ),
        ({"error": "timed out after 10 s"}, "timed out after 10 s"),
        ({}, "the check did not pass"),
    ],
)
def test_a_failed_outcome_says_why(fields: dict[str, object], why: str) -> None:
    failed = outcome(**fields)
    assert failed.failure == why
    health = classify(receipt(outcomes=(failed,)))
    assert health.state is HealthState.FALSE_COMPLETE
    assert health.reason.endswith(f"failed: {why}")


def test_a_passed_outcome_has_no_failure() -> None:
    assert FILE_OK.failure is None


def test_a_failing_judge_says_why() -> None:
    judge = replace(JUDGE_NO, expected={"done": True})  # as LLMJudge records it
    health = classify(receipt(outcomes=(judge,)))
    assert "done: expected True, observed False" in health.reason


json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(10**30), max_value=10**30)
    | st.floats()
    | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
    max_leaves=20,
)


@given(data=st.binary(max_size=300))
def test_arbitrary_bytes_are_a_receipt_or_an_input_error(data: bytes) -> None:
    try:
        StopReceipt.from_json(data, source="fuzz.json")
    except InputError as exc:
        assert exc.source == "fuzz.json"


@given(patch=st.dictionaries(st.sampled_from(sorted(FULL.to_dict())), json_values, max_size=4))
def test_receipts_with_arbitrary_fields_are_a_receipt_or_an_input_error(
    patch: dict[str, object],
) -> None:
    data = {**FULL.to_dict(), **patch}
    try:
        text = json.dumps(data)
    except ValueError:
        return
    for read in (lambda: StopReceipt.from_json(text), lambda: StopReceipt.from_dict(data)):
        try:
            read()
        except InputError as exc:
            assert exc.detail
