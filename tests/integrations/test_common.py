"""The shared layer under every adapter: RunControl over the Guard, driven by a scripted loop.

The loop below is the smallest adapter there is ("call the model, run the tools, repeat"); each
test counts the tool bodies that really ran and the model calls really made.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from collections.abc import Callable
from typing import Any

import pytest

from tripwire import BudgetExceeded, ConfigError, Limits, LoopDetected, RunStopped, StopReason
from tripwire.core.receipt import StopReceipt
from tripwire.integrations import OnLoop, RunControl, StoppedRun, current_run, new_run

from .scripts import (
    LOOP_ARGS,
    LOOP_TOOL,
    NUDGE_TEXT_START,
    Counters,
    healthy_calls,
    order_calls,
    run_body,
)
from .xfails import needs_g1, needs_g2, needs_g3, needs_g5, orders_flagged

Model = Callable[[int, list[str], str | None], list[tuple[str, dict[str, Any]]] | str]
"""A scripted model: (call index, tool results seen so far, wrap-up text) -> tool calls or
an answer."""


def looping(i: int, seen: list[str], wrap: str | None) -> list[tuple[str, dict[str, Any]]] | str:
    return [(LOOP_TOOL, dict(LOOP_ARGS))]


def obeys_nudge(
    i: int, seen: list[str], wrap: str | None
) -> list[tuple[str, dict[str, Any]]] | str:
    if any(s.startswith(NUDGE_TEXT_START) for s in seen):
        return "I could not find the refund policy."
    return [(LOOP_TOOL, dict(LOOP_ARGS))]


def scripted(calls: list[tuple[str, dict[str, Any]]]) -> Model:
    def model(i: int, seen: list[str], wrap: str | None) -> list[tuple[str, dict[str, Any]]] | str:
        if wrap is not None:
            return f"partial: {len(seen)} results"
        return [calls[i]] if i < len(calls) else "done"

    return model


def drive(run: RunControl, model: Model, counters: Counters, max_calls: int = 60) -> Any:
    """The plain loop, as an adapter writes it; returns the answer or the StoppedRun."""
    seen: list[str] = []
    try:
        for _ in range(max_calls):
            run.before_model()
            i = counters.model() - 1
            reply = model(i, seen, run.wrap_up())
            run.after_model(model="scripted", input_tokens=10, output_tokens=3, cost_usd=0.0)
            if isinstance(reply, str):
                run.finish(reply)
                return reply
            for name, args in reply:
                refusal = run.before_tool(name, args)
                if refusal is not None:
                    counters.saw_nudge = counters.saw_nudge or refusal.startswith(NUDGE_TEXT_START)
                    seen.append(refusal)
                    continue
                result = run_body(counters, name, args)
                seen.append(result)
                run.after_tool(name, args, result)
        raise AssertionError("the scripted run never ended")
    except RunStopped as exc:
        counters.model_calls_at_stop = counters.model_calls
        # Nothing runs after a stop: the next model call and tool call are refused again.
        with pytest.raises(RunStopped):
            run.before_model()
        with pytest.raises(RunStopped):
            run.before_tool(LOOP_TOOL, dict(LOOP_ARGS))
        return run.stop_result(exc)


def receipts() -> tuple[list[StopReceipt], Callable[[StopReceipt], None]]:
    got: list[StopReceipt] = []
    return got, got.append


# -- kill switch -------------------------------------------------------------------------------


def test_a_looping_run_is_stopped_with_a_structured_result() -> None:
    got, sink = receipts()
    counters = Counters()
    out = drive(new_run(agent="looper", on_receipt=sink), looping, counters)
    assert isinstance(out, StoppedRun)
    assert out.reason is StopReason.LOOP_DETECTED
    assert isinstance(out.error, LoopDetected) and out.error.tool == LOOP_TOOL
    assert "refund policy" not in out.message and LOOP_TOOL in out.message
    assert out.counters.tool_calls >= 3
    assert got == [out.receipt]
    assert out.receipt.reason is StopReason.LOOP_DETECTED and out.receipt.agent == "looper"
    assert counters.model_calls == counters.model_calls_at_stop
    assert counters.loop_bodies <= 4


@needs_g1
def test_the_fourth_identical_call_is_refused_before_it_runs() -> None:
    counters = Counters()
    drive(new_run(), looping, counters)
    assert counters.loop_bodies == 3


def test_the_stop_is_kept_for_every_later_hook() -> None:
    run = new_run()
    counters = Counters()
    out = drive(run, looping, counters)
    assert run.stopped is out.error
    assert run.stop_result(out.error).receipt is out.receipt  # one receipt per run
    assert run.finish() is out.receipt


# -- nudge -------------------------------------------------------------------------------------


def test_on_loop_is_checked() -> None:
    with pytest.raises(ConfigError) as err:
        new_run(on_loop="page")
    assert err.value.field == "on_loop"
    assert OnLoop("nudge") is OnLoop.NUDGE


@needs_g2
def test_a_model_that_obeys_the_nudge_finishes_untouched() -> None:
    got, sink = receipts()
    counters = Counters()
    out = drive(new_run(on_loop="nudge", on_receipt=sink), obeys_nudge, counters)
    assert out == "I could not find the refund policy."
    assert counters.saw_nudge and counters.loop_bodies == 3
    assert got[0].reason is StopReason.COMPLETED


@needs_g2
def test_a_model_that_ignores_the_nudge_is_killed_at_its_next_repeated_call() -> None:
    counters = Counters()
    out = drive(new_run(on_loop="nudge"), looping, counters)
    assert isinstance(out, StoppedRun) and out.reason is StopReason.LOOP_DETECTED
    assert counters.saw_nudge and counters.loop_bodies == 3
    assert counters.model_calls == counters.model_calls_at_stop


# -- healthy runs ------------------------------------------------------------------------------


def test_a_healthy_thirty_call_run_completes_untouched() -> None:
    got, sink = receipts()
    counters = Counters()
    out = drive(new_run(on_receipt=sink), scripted(healthy_calls()), counters)
    assert out == "done"
    assert counters.tool_bodies == 30 and counters.model_calls == 31
    assert got[0].reason is StopReason.COMPLETED
    assert got[0].counters.tool_calls == 30


@orders_flagged
def test_thirty_different_orders_all_shipped_complete_untouched() -> None:
    counters = Counters()
    out = drive(new_run(), scripted(order_calls()), counters)
    assert out == "done"
    assert counters.tool_bodies == 30


def test_a_final_answer_is_never_refused_by_a_tool_call_cap() -> None:
    counters = Counters()
    out = drive(new_run(Limits(max_tool_calls=30)), scripted(healthy_calls()), counters)
    assert out == "done" and counters.tool_bodies == 30


# -- budgets -----------------------------------------------------------------------------------


def test_a_step_budget_ends_with_the_graceful_last_step_answer() -> None:
    got, sink = receipts()
    counters = Counters()
    out = drive(new_run(Limits(max_steps=5), on_receipt=sink), scripted(healthy_calls()), counters)
    assert out == "partial: 4 results"  # the 5th step was told to wrap up, without tools
    assert counters.model_calls == 5 and counters.tool_bodies == 4
    assert len(got) == 1


@needs_g3
def test_the_graceful_last_step_records_the_limit_as_the_reason() -> None:
    got, sink = receipts()
    drive(new_run(Limits(max_steps=5), on_receipt=sink), scripted(healthy_calls()), Counters())
    assert got[0].reason is StopReason.MAX_STEPS
    assert got[0].condition == {"steps": 5, "max_steps": 5}  # filled, never {}


def test_a_model_that_ignores_the_wrap_up_is_stopped_with_the_partial_answer() -> None:
    counters = Counters()
    run = new_run(
        Limits(max_steps=3),
        partial_answer=lambda snap: f"partial after {snap.counters.tool_calls} calls",
    )
    calls = healthy_calls()
    out = drive(run, lambda i, seen, wrap: [calls[i]], counters)
    assert isinstance(out, StoppedRun)
    assert isinstance(out.error, BudgetExceeded) and out.reason is StopReason.MAX_STEPS
    assert out.partial == "partial after 2 calls"
    assert counters.model_calls == 3 and counters.tool_bodies == 2  # the 3rd step's call refused
    assert out.receipt.reason is StopReason.MAX_STEPS


def test_usage_is_counted_from_what_the_adapter_reports() -> None:
    run = new_run(Limits(max_total_tokens=100))
    run.before_model()
    run.after_model(model=None, input_tokens=None, output_tokens=3.0)  # type: ignore[arg-type]
    assert run.guard.snapshot().counters.output_tokens == 3
    run.before_model()
    with pytest.raises(BudgetExceeded) as err:
        run.after_model(model="m", input_tokens=90, output_tokens=10, cost_usd=0.0)
    assert err.value.reason is StopReason.MAX_TOTAL_TOKENS
    assert run.stop_result(err.value).receipt.reason is StopReason.MAX_TOTAL_TOKENS


def test_a_tool_error_is_fed_to_the_watcher_as_a_failure() -> None:
    run = new_run()
    run.before_model()
    assert run.before_tool("send", {"to": "a"}) is None
    run.after_tool("send", {"to": "a"}, error=TimeoutError("slow"))
    assert run.guard.snapshot().counters.tool_calls == 1


# -- receipts ----------------------------------------------------------------------------------


def test_every_run_gets_exactly_one_receipt() -> None:
    got, sink = receipts()
    run = new_run(on_receipt=sink, agent="a")
    run.before_model()
    first = run.finish("hello")
    assert run.finish() is first and got == [first]
    assert first.reason is StopReason.COMPLETED and run.receipt is first


def test_a_failing_receipt_sink_is_logged_not_raised(caplog: pytest.LogCaptureFixture) -> None:
    def broken(receipt: StopReceipt) -> None:
        raise OSError("disk full")

    run = new_run(on_receipt=broken)
    with caplog.at_level(logging.ERROR, logger="tripwire.integrations"):
        receipt = run.finish()
    assert receipt.reason is StopReason.COMPLETED
    assert run.receipt_errors == 1
    assert "on_receipt raised" in caplog.text


@needs_g5
def test_a_receipt_says_when_the_run_went_on_after_the_stop() -> None:
    run = new_run()
    counters = Counters()
    drive(run, looping, counters)
    receipt = run.receipt
    assert receipt is not None
    assert receipt.after_stop.model_calls >= 1  # type: ignore[attr-defined]


# -- two runs at once --------------------------------------------------------------------------


def test_two_runs_in_two_threads_are_judged_separately() -> None:
    results: dict[str, Any] = {}
    counters = {"loop": Counters(), "healthy": Counters()}
    barrier = threading.Barrier(2)

    def work(name: str, model: Model) -> None:
        run = new_run(agent=name)
        barrier.wait()
        with run.activate():
            assert current_run.get() is run
            results[name] = drive(run, model, counters[name])

    threads = [
        threading.Thread(target=work, args=("loop", looping)),
        threading.Thread(target=work, args=("healthy", scripted(healthy_calls()))),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert isinstance(results["loop"], StoppedRun)
    assert results["healthy"] == "done" and counters["healthy"].tool_bodies == 30
    assert current_run.get() is None


async def test_two_runs_in_two_tasks_are_judged_separately() -> None:
    async def work(name: str, model: Model) -> Any:
        run = new_run(agent=name)
        with run.activate():
            await asyncio.sleep(0)
            assert current_run.get() is run
            return drive(run, model, Counters())

    loop_out, healthy_out = await asyncio.gather(
        work("loop", looping), work("healthy", scripted(healthy_calls()))
    )
    assert isinstance(loop_out, StoppedRun) and healthy_out == "done"


def test_bad_settings_name_the_field() -> None:
    with pytest.raises(ConfigError) as err:
        RunControl(object(), agent="a")  # type: ignore[arg-type]
    assert err.value.field == "guard"
    with pytest.raises(ConfigError) as err:
        new_run(agent="")
    assert err.value.field == "agent"
    with pytest.raises(ConfigError) as err:
        new_run(partial_answer="summary")  # type: ignore[arg-type]
    assert err.value.field == "partial_answer"
    with pytest.raises(ConfigError) as err:
        new_run(colour="red")
    assert err.value.field == "colour"


# -- a run that raised ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("error", "reason"),
    [(RuntimeError("model down"), None), (KeyboardInterrupt(), StopReason.USER_CANCELLED),
     (asyncio.CancelledError(), StopReason.USER_CANCELLED)],
)
def test_a_run_that_raised_gets_one_receipt_that_never_claims_completed(
    error: BaseException, reason: StopReason | None
) -> None:
    import warnings

    import tripwire.guard._guard as guard_module

    got: list[StopReceipt] = []
    run = new_run(agent="a", on_receipt=got.append)
    run.before_model()
    assert run.before_tool("search_docs", {"query": "x"}) is None
    run.after_tool("search_docs", {"query": "x"}, "found it")
    guard_module._UNFINISHED_WARNED.clear()  # the guard warns once per process
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        receipt = run.failed(error)
        assert run.failed(error) is receipt  # once
    assert got == [receipt] and receipt.reason is reason
    assert receipt.counters.tool_calls == 1
    # A crash is not a forgotten finish(): no warning telling the user to call it.
    assert not [w for w in caught if "guard.finish()" in str(w.message)]


def test_a_stop_the_framework_turned_into_another_exception_keeps_its_reason() -> None:
    run = new_run(Limits(max_steps=1), agent="a")
    run.before_model()
    with pytest.raises(BudgetExceeded):
        run.before_model()
    receipt = run.failed(RuntimeError("the framework wrapped the stop"))
    assert receipt.reason is StopReason.MAX_STEPS
