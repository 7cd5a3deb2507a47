"""The exception tree: fields, one pinned message per type, pickling."""

from __future__ import annotations

import copy
import pickle
from typing import Any

import pytest

from tripwire.core.reasons import Rule, StopReason
from tripwire.errors import (
    BudgetExceeded,
    ConfigError,
    InputError,
    LoopDetected,
    RunStopped,
    TripwireError,
)


def roundtrip(exc: BaseException) -> Any:
    return pickle.loads(pickle.dumps(exc))


def loop(rule: Rule, **kw: Any) -> LoopDetected:
    fields: dict[str, Any] = dict(
        rule=rule, tool="search_docs", hits=4, window=10, period=1, call_index=4, digest="3f9a0c1d2e3f4a5b"
    )
    fields.update(kw)
    return LoopDetected(**fields)


# -- the tree ----------------------------------------------------------------------------------


def test_hierarchy() -> None:
    assert issubclass(RunStopped, TripwireError)
    assert issubclass(LoopDetected, RunStopped)
    assert issubclass(BudgetExceeded, RunStopped)
    assert issubclass(ConfigError, TripwireError) and issubclass(ConfigError, ValueError)
    assert issubclass(InputError, TripwireError) and issubclass(InputError, ValueError)
    assert not issubclass(RunStopped, ValueError)


# -- one pinned message per type ---------------------------------------------------------------


def test_tripwire_error_message() -> None:
    exc = TripwireError("something broke", detail=3)
    assert str(exc) == "something broke"
    assert exc.message == "something broke"


def test_run_stopped_message() -> None:
    exc = RunStopped(reason=StopReason.USER_CANCELLED)
    assert str(exc) == "run stopped: user_cancelled"
    assert exc.reason is StopReason.USER_CANCELLED
    assert exc.receipt is None


def test_loop_detected_repetition_message() -> None:
    exc = loop(Rule.REPETITION)
    assert str(exc) == (
        "search_docs repeated 4× with identical arguments (sig 3f9a0c1d…) in the last 10 calls "
        "(tripped at call 4); tell the model to change approach, or if search_docs polls "
        "something that takes time, declare it with its interval and longest wait in seconds: "
        "LoopPolicy(polls={'search_docs': Poll(interval_s=10, max_wait_s=600)}), or in "
        "tripwire.toml:\n[policy.polls.search_docs]\ninterval_s = 10\nmax_wait_s = 600"
    )
    assert (exc.rule, exc.tool, exc.hits, exc.window, exc.period, exc.call_index) == (
        Rule.REPETITION, "search_docs", 4, 10, 1, 4,
    )
    assert exc.reason is StopReason.LOOP_DETECTED


def test_loop_detected_period_message() -> None:
    exc = loop(Rule.PERIOD, tool="read", hits=3, period=2, call_index=6)
    assert str(exc) == (
        "the last 6 calls, ending with read (sig 3f9a0c1d…), repeat a cycle of 2 calls 3× "
        "(tripped at call 6); tell the model to change approach, or raise "
        "LoopPolicy(min_repeats=...) if this cycle is expected"
    )


def test_loop_detected_non_retryable_message_and_reason() -> None:
    exc = loop(Rule.RETRY_OF_NON_RETRYABLE, hits=2, call_index=2)
    assert str(exc) == (
        "search_docs was called again with identical arguments (sig 3f9a0c1d…) after it failed "
        "with an error marked non-retryable (tripped at call 2); change the arguments or report "
        "the failure instead of retrying"
    )
    assert exc.reason is StopReason.RETRY_OF_NON_RETRYABLE


def test_loop_detected_same_error_message() -> None:
    exc = loop(Rule.SAME_ERROR, hits=5, call_index=9, digest="")
    assert str(exc) == (
        "the last 5 calls, ending with search_docs, all failed with the same error (tripped at "
        "call 9); fix the cause or report it instead of trying variations, or raise "
        "LoopPolicy(same_error=...)"
    )


def test_loop_detected_failures_message_names_the_switch() -> None:
    exc = loop(Rule.FAILURES, hits=8, call_index=12, digest="")
    assert str(exc).startswith("8 of the last 10 calls, up to search_docs, failed (tripped at call 12);")
    assert "LoopPolicy(failure_share=...)" in str(exc)


def test_loop_detected_without_digest_has_no_sig() -> None:
    assert "sig" not in str(loop(Rule.REPETITION, digest=""))


def test_budget_exceeded_message() -> None:
    exc = BudgetExceeded(
        reason=StopReason.MAX_TOOL_CALLS, limit_name="max_tool_calls", limit=10, observed=10
    )
    assert str(exc) == (
        "max_tool_calls=10 reached (tool_calls=10); stop the run and answer from the work done "
        "so far, or raise Limits(max_tool_calls=...)"
    )
    assert (exc.limit_name, exc.limit, exc.observed, exc.level) == ("max_tool_calls", 10, 10, "stop")


def test_config_error_message() -> None:
    exc = ConfigError("window", 0, "an integer >= 1")
    assert str(exc) == "window must be an integer >= 1, got 0"
    assert (exc.field, exc.value, exc.expected) == ("window", 0, "an integer >= 1")


def test_input_error_message() -> None:
    assert str(InputError("trace.json", "not OTLP JSON", line=3)) == "trace.json:3: not OTLP JSON"
    exc = InputError("<stdin>", "payload over 4 MiB")
    assert str(exc) == "<stdin>: payload over 4 MiB"
    assert (exc.source, exc.detail, exc.line) == ("<stdin>", "payload over 4 MiB", None)


# -- pickling ----------------------------------------------------------------------------------

EXAMPLES: list[TripwireError] = [
    TripwireError("boom", detail=3),
    RunStopped(reason=StopReason.MAX_DURATION),
    RunStopped("custom", reason=StopReason.COMPLETED, receipt={"ok": True}),
    loop(Rule.REPETITION),
    loop(Rule.PERIOD, period=3, hits=3, call_index=9),
    loop(Rule.RETRY_OF_NON_RETRYABLE),
    loop(Rule.SAME_ERROR),
    LoopDetected("custom text", rule=Rule.REPETITION, tool="t", hits=4, window=10, period=1, call_index=4),
    BudgetExceeded(reason=StopReason.MAX_COST, limit_name="max_cost_usd", limit=2.5, observed=2.51, level="refuse"),
    ConfigError("threshold", 1, "an integer >= 2"),
    ConfigError("key", "x", "'tool+args' or 'tool'", message="custom"),
    InputError("spans.jsonl", "bad line", line=7),
    InputError("<stdin>", "empty"),
]


@pytest.mark.parametrize("exc", EXAMPLES, ids=lambda e: type(e).__name__)
def test_every_exception_survives_pickling(exc: TripwireError) -> None:
    back = roundtrip(exc)
    assert type(back) is type(exc)
    assert str(back) == str(exc)
    assert back.args == exc.args
    skip = {"_fields"}
    assert {k: v for k, v in vars(back).items() if k not in skip} == {
        k: v for k, v in vars(exc).items() if k not in skip
    }
    assert str(copy.deepcopy(exc)) == str(exc)


def test_loop_detected_fields_survive_pickling() -> None:
    back = roundtrip(loop(Rule.PERIOD, period=2, hits=3, call_index=6))
    assert (back.rule, back.period, back.hits, back.call_index, back.digest) == (
        Rule.PERIOD, 2, 3, 6, "3f9a0c1d2e3f4a5b",
    )
    assert back.reason is StopReason.LOOP_DETECTED


def test_every_public_callable_refuses_wrong_types_with_tripwires_own_errors() -> None:
    # Bad input gets a clear error: each keyword of each public class and function, given a
    # value of a wrong type, raises a TripwireError naming it (or is accepted), never an
    # AttributeError or a TypeError from deep inside (seven did: Guard clock/ledger/normalizer,
    # Lease renewals, classify receipt, instrument env, signature_of normalizer).
    import enum
    import inspect
    import warnings

    import tripwire
    from tripwire.errors import TripwireError

    wrong = [None, "x", -1, 1.5, [], {}, object(), b"\xff", float("nan"), 10**400, True]
    escaped: dict[tuple[str, str], str] = {}
    for name in tripwire.__all__:
        obj = getattr(tripwire, name)
        if not callable(obj) or (inspect.isclass(obj) and issubclass(obj, (BaseException, enum.Enum))):
            continue
        try:
            params = [
                p for p in inspect.signature(obj).parameters.values()
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and not p.name.startswith("_")
            ]
        except (TypeError, ValueError):
            continue
        for param in params:
            for value in wrong:
                kwargs = {
                    q.name: "search" if "tool" in q.name or "name" in q.name else {}
                    for q in params if q.default is q.empty and q.name != param.name
                }
                kwargs[param.name] = value
                try:
                    with warnings.catch_warnings():
                        warnings.simplefilter("ignore")
                        obj(**kwargs)
                except TripwireError:
                    pass
                except TypeError as exc:
                    if "argument" not in str(exc):  # not a call's own missing/unexpected keyword
                        escaped[(name, param.name)] = f"TypeError: {exc}"
                except Exception as exc:
                    escaped[(name, param.name)] = f"{type(exc).__name__}: {exc}"
    assert not escaped, escaped
