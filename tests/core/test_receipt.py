"""Stop receipts: the 11-case health fixture, the priority rules, stop conditions, JSON."""

from __future__ import annotations

import json
import pickle
from dataclasses import replace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from tripwire.core.reasons import StopReason, Verdict
from tripwire.core.receipt import (
    SCHEMA,
    AfterStop,
    AnyOf,
    Approval,
    CalledTool,
    CompletedStep,
    Counters,
    EndKind,
    Evidence,
    HealthState,
    OutcomeReceipt,
    OutcomeRequirement,
    StepCap,
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


# --- stop conditions -------------------------------------------------------------------------


def steps(*tool_lists: tuple[str, ...]) -> tuple[CompletedStep, ...]:
    return tuple(CompletedStep(tools) for tools in tool_lists)


def test_step_cap_fires_when_the_count_reaches_n() -> None:
    cap = StepCap(20)
    assert cap(steps(*[("search",)] * 19)) is None
    cause = cap(steps(*[("search",)] * 20))
    assert cause is not None
    assert cause.end is EndKind.STOP_CONDITION
    assert cause.reason is StopReason.MAX_STEPS
    assert dict(cause.condition) == {"steps": 20, "max_steps": 20}


def test_step_cap_checked_after_every_step_stops_with_exactly_n_steps() -> None:
    cap = StepCap(20)
    done: list[CompletedStep] = []
    for _ in range(25):
        done.append(CompletedStep(("search",)))
        cause = cap(tuple(done))
        if cause is not None:
            break
    assert cause is not None
    stop = receipt(
        end=cause.end,
        reason=cause.reason,
        condition=cause.condition,
        counters=Counters(steps=len(done)),
    )
    assert stop.counters.steps == 20
    assert stop.condition == {"steps": 20, "max_steps": 20}
    assert classify(stop).state is HealthState.BOUNDED_STOP


def test_step_cap_checked_late_records_the_true_count() -> None:
    cause = StepCap(20)(steps(*[()] * 23))
    assert cause is not None
    assert dict(cause.condition) == {"steps": 23, "max_steps": 20}


@pytest.mark.parametrize("bad", [0, -1, 2.5, True, "20"])
def test_step_cap_rejects_bad_n(bad: object) -> None:
    with pytest.raises(ConfigError) as info:
        StepCap(bad)  # type: ignore[arg-type]
    assert info.value.field == "StepCap.n"


def test_called_tool_looks_at_the_last_completed_step_only() -> None:
    cond = CalledTool("submit")
    assert cond(()) is None
    assert cond(steps(("submit",), ("search",))) is None
    cause = cond(steps(("search",), ("lookup", "submit")))
    assert cause is not None
    assert cause.end is EndKind.EXPLICIT_DONE
    assert cause.reason is StopReason.COMPLETED
    assert dict(cause.condition) == {"stop_tool": "submit", "step": 2}


def test_called_tool_with_another_meaning() -> None:
    cond = CalledTool(
        "escalate", end=EndKind.APPROVAL_REQUESTED, reason=StopReason.APPROVAL_REQUIRED
    )
    cause = cond(steps(("escalate",)))
    assert cause is not None and cause.end is EndKind.APPROVAL_REQUESTED


def test_any_of_returns_the_first_cause_and_flattens() -> None:
    combo = StepCap(3) | CalledTool("submit") | CalledTool("finish")
    assert isinstance(combo, AnyOf)
    assert len(combo.conditions) == 3
    assert combo(steps(("a",), ("b",))) is None
    by_tool = combo(steps(("a",), ("submit",)))
    assert by_tool is not None and by_tool.reason is StopReason.COMPLETED
    both = combo(steps(("a",), ("b",), ("submit",)))
    assert both is not None and both.reason is StopReason.MAX_STEPS


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
