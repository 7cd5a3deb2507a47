"""Stop receipts from traces: what the service knows of how a run ended, and nothing more.

The cause comes from the trace, never from prose: the root span's status (an error ends the
run as a failure), a budget stop or a loop verdict the service decided, or idleness (the trace
went quiet before its root span ended: the receipt says so and claims no finish).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from tripwire.core import receipt as rc
from tripwire.core.policy import LoopPolicy
from tripwire.core.reasons import StopReason, Verdict, stop_reason_for
from tripwire.core.signature import Normalizer
from tripwire.core.watch import Assessment
from tripwire.store.runs import RunRow

if TYPE_CHECKING:
    from tripwire.serve.fleet import Rec

__all__ = ["receipt_for"]


def receipt_for(
    row: RunRow,
    assessment: Assessment | None,
    budget_stop: StopReason | None,
    *,
    root: Rec | None,
    idle: bool,
    policy: LoopPolicy,
    normalizer: Normalizer,
    operator: tuple[str, str, float] | None = None,
) -> tuple[dict[str, Any], str]:
    """The run's stop receipt as JSON, and its health state.

    Args:
        row: the run's record (counters, times).
        assessment: the verdict in force when the run ended.
        budget_stop: the budget stop the service decided, if any.
        root: the root span, when the run ended with it; ``None`` when it went idle.
        idle: True when the trace went quiet (or was evicted) before its root span ended.
        operator: who killed the run, through what (``dashboard`` or ``api``) and when, if an
            operator did: the run was cancelled, whatever its root span says of its end (an
            agent that obeys the flag ends its run cleanly, or with the stop as an error).
            A loop verdict or a budget stop the service reached first still comes first.
    """
    end: rc.EndKind | None
    reason: StopReason | None
    condition: dict[str, str | int | float | bool | None] = {}
    tool_failure = None
    if budget_stop is not None:
        end, reason = rc.EndKind.STOP_CONDITION, budget_stop
        condition = {"tool_calls": row.tool_calls, "steps": row.steps}
    elif assessment is not None and assessment.verdict is Verdict.STUCK:
        end, reason = rc.EndKind.STOP_CONDITION, stop_reason_for(assessment.rule)
        condition = {
            "rule": assessment.rule.value if assessment.rule is not None else None,
            "hits": assessment.hits,
            "window": assessment.window,
            "call_index": assessment.call_index,
        }
    elif operator is not None:
        end, reason = rc.EndKind.USER_ABORT, StopReason.USER_CANCELLED
        actor, via, at = operator
        condition = {"source": "operator", "by": actor, "via": via, "at": at}
    elif root is not None and root.status_error:
        end, reason = rc.EndKind.TOOL_FAILURE, StopReason.TOOL_ERROR
        tool_failure = rc.ToolFailure(
            tool=row.agent or "run", error_type=(root.exception_type or "error")[:100]
        )
    elif root is not None and not idle:
        end, reason = rc.EndKind.NATURAL_FINISH, StopReason.COMPLETED
    else:
        end, reason = None, None  # went quiet: nothing says how it ended
    counters = rc.Counters(
        steps=row.steps,
        tool_calls=row.tool_calls,
        input_tokens=row.input_tokens,
        output_tokens=row.output_tokens,
        cost_usd=row.cost_usd,
        duration_s=row.duration_s,
    )
    started = root.start_s if root is not None and root.start_s is not None else None
    ended = root.end_s if root is not None and root.end_s is not None else None
    if started is not None and ended is not None and ended < started:
        started = ended = None
    receipt = rc.StopReceipt(
        run_id=row.trace_id,
        agent=row.agent or "unknown-agent",
        end=end,
        reason=reason,
        condition=condition,
        policy_version=policy.version,
        normalizer_version=normalizer.version,
        counters=counters,
        verdict=assessment.verdict if assessment is not None else Verdict.WORKING,
        requires_outcome=rc.OutcomeRequirement.NONE,
        tool_failure=tool_failure,
        started_at=started,
        ended_at=ended,
    )
    health = rc.classify(receipt).state.value
    return receipt.to_dict(), health
