"""Every integration obeys the fleet: ``tripwire serve`` runs in another process; an agent in
this one, on its framework's real package and offline fake model, sends its spans there and is
stopped by the service's flag, keyed by its own trace id read from the OpenTelemetry context
(the test writes no trace-id plumbing into the framework).

(a) A looping agent whose own guard cannot trip (``loop_policy=None``) is stopped by the
    service's verdict. Bound asserted: at most 3 tool bodies and 3 model calls after the flagged
    call's body, with 0.2 s per model call and the URL channel polled every 0.05 s (measured
    here: 0 bodies and 1 model call on an idle machine; the margin is for a loaded one).
(b) An operator's Kill through the API stops a healthy agent mid-run; the receipt says
    ``user_cancelled``, who acted (the flag's ``by``) and when.

The receipts say so: ``loop_detected`` with the fleet's rule and call index and
``"source": "fleet"``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

pytest.importorskip("starlette")
pytest.importorskip("uvicorn")
pytest.importorskip("opentelemetry.exporter.otlp.proto.http")

import tripwire.remote as remote
from tripwire import Guard, LoopDetected, StopReason
from tripwire.core.budget import Stop
from tripwire.core.reasons import Rule, Verdict
from tripwire.core.receipt import EndKind, StopReceipt
from tripwire.core.watch import Assessment
from tripwire.errors import BudgetExceeded, RunStopped
from tripwire.integrations import StoppedRun, new_run
from tripwire.otel import killswitch

from . import fleet_harness as fh
from .fleet_harness import Fleet, Killer, Probe, ProbedCounters

pytestmark = [
    pytest.mark.frameworks,
    pytest.mark.filterwarnings("ignore::tripwire.prices.CostNotFoundWarning"),
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]

BODIES_BOUND = 3
MODELS_BOUND = 3
MODEL_S = 0.2


# -- the guard's external stop (no service) ----------------------------------------------------


def _loop(call_index: int = 4) -> Assessment:
    return Assessment(
        verdict=Verdict.STUCK, rule=Rule.REPETITION, tool="search_docs", digest="ab12",
        hits=4, period=1, window=10, call_index=call_index, reason="repeated 4×",
    )  # fmt: skip


def _kill(by: str = "alice") -> Stop:
    return Stop(
        reason=StopReason.USER_CANCELLED, limit_name="operator", limit=0.0, observed=0.0,
        counter="operator", used=0.0, message=f"killed by an operator (by {by})",
    )  # fmt: skip


def test_an_external_stop_ends_the_run_as_a_local_one_and_the_first_cause_wins() -> None:
    guard = Guard(prices=None)
    guard.before_step()
    exc = guard.stop(_kill(), source="operator", by="alice", via="dashboard", at=1765000000.5)
    assert isinstance(exc, BudgetExceeded) and exc.reason is StopReason.USER_CANCELLED
    assert guard.stopped is exc
    with pytest.raises(RunStopped):
        guard.before_step()
    with pytest.raises(RunStopped):
        guard.before_tool("search_docs", {"query": "x"})
    assert guard.stop(_loop(), source="fleet") is exc  # the first cause wins
    receipt = guard.receipt("a")
    assert receipt.reason is StopReason.USER_CANCELLED and receipt.end is EndKind.USER_ABORT
    assert receipt.condition == {
        "source": "operator", "by": "alice", "via": "dashboard", "at": 1765000000.5
    }
    assert receipt.after_stop is not None and receipt.after_stop.model_calls == 1


def test_a_fleet_loop_stop_names_its_rule_call_and_source() -> None:
    guard = Guard(prices=None)
    exc = guard.stop(_loop(7), source="fleet", by="tripwire serve", at=1.0)
    assert isinstance(exc, LoopDetected) and exc.call_index == 7
    receipt = guard.receipt("a")
    assert receipt.reason is StopReason.LOOP_DETECTED
    assert receipt.condition["source"] == "fleet" and receipt.condition["call_index"] == 7
    assert receipt.condition["rule"] == "repetition" and receipt.condition["by"] == "tripwire serve"


def test_a_finished_run_keeps_its_end() -> None:
    guard = Guard(prices=None)
    guard.finish()
    exc = guard.stop(_kill(), source="operator")
    assert exc.reason is StopReason.USER_CANCELLED and guard.stopped is None
    assert guard.receipt("a").reason is StopReason.COMPLETED


def test_run_control_obeys_an_in_process_flag_of_the_current_trace() -> None:
    from opentelemetry.sdk.trace import TracerProvider

    tracer = TracerProvider().get_tracer("t")
    run = new_run(loop_policy=None)
    with tracer.start_as_current_span("invoke_agent a") as root:
        tid = root.get_span_context().trace_id
        run.before_model()
        assert run.before_tool("search_docs", {"query": "x"}) is None
        killswitch.KILL_FLAGS.raise_flag(tid, _loop())
        try:
            with pytest.raises(LoopDetected):
                run.before_tool("search_docs", {"query": "x"})
            killswitch.KILL_FLAGS.clear(tid)
            with pytest.raises(LoopDetected):  # recorded: lowering the flag does not undo it
                run.before_model()
        finally:
            killswitch.KILL_FLAGS.clear(tid)
    assert isinstance(run.stopped, LoopDetected)
    assert run.stop_result(run.stopped).receipt.condition["source"] == "span_processor"


# -- the fleet: tripwire serve in another process ----------------------------------------------


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    with fh.fleet(tmp_path_factory.mktemp("fleet")) as running:
        yield running


@pytest.fixture
def probe(fleet: Fleet, monkeypatch: pytest.MonkeyPatch) -> Iterator[Probe]:
    """The agent's process: its kill channel named by the environment only, polled every
    0.05 s; its spans exported to the fleet as each tool body ends."""
    for name, value in fh.env_for(fleet).items():
        monkeypatch.setenv(name, value)
    remote.disconnect()
    remote.connect(poll_s=0.05)  # the URL and token come from the environment
    made = Probe(fleet, model_s=MODEL_S)
    fh.PROBE = made
    try:
        yield made
    finally:
        fh.PROBE = None
        made.close()
        remote.disconnect()
        killswitch.KILL_FLAGS.clear_all()


def _stopped(out: Any) -> StoppedRun:
    assert isinstance(out, StoppedRun), f"the run was not stopped: {out!r}"
    return out


def assert_fleet_loop_stop(probe: Probe, out: StoppedRun, receipts: list[StopReceipt]) -> None:
    """(a): stopped by the service's verdict, within the bound, and the receipt says so."""
    assert out.reason is StopReason.LOOP_DETECTED and isinstance(out.error, LoopDetected)
    receipt = out.receipt
    assert receipts == [receipt]
    assert receipt.condition["source"] == "fleet", receipt.condition
    assert receipt.condition["by"] == "tripwire serve"
    flagged = receipt.condition["call_index"]
    assert isinstance(flagged, int) and 1 <= flagged <= 8
    flag = probe.fleet.flag(probe.trace_id)
    # The service's own verdict (a newer one replaces it if a call came in after it).
    assert flag is not None and flag["kind"] == "loop" and flag["call_index"] >= flagged
    assert receipt.condition["rule"] == flag["rule"] and receipt.condition["tool"] == flag["tool"]
    bodies_after = probe.after("tool", tool_index=flagged)
    models_after = probe.after("model", tool_index=flagged)
    print(f"fleet loop stop: flagged call {flagged}, {bodies_after} bodies and "
          f"{models_after} model calls after it")  # fmt: skip
    assert bodies_after <= BODIES_BOUND and models_after <= MODELS_BOUND
    assert probe.count("tool") < 30


def assert_operator_kill(probe: Probe, killer: Killer, out: StoppedRun, receipts: list[StopReceipt]) -> None:
    """(b): stopped after the Kill, within the bound; the receipt says who and when."""
    assert killer.error is None, killer.error
    assert killer.killed_at is not None
    assert out.reason is StopReason.USER_CANCELLED
    receipt = out.receipt
    assert receipts == [receipt]
    assert receipt.reason is StopReason.USER_CANCELLED and receipt.end is EndKind.USER_ABORT
    flag = probe.fleet.flag(probe.trace_id)
    assert flag is not None and flag["kind"] == "operator"
    assert receipt.condition["source"] == "operator"
    # Who acted: the name of the token the API was called with (the service's TRIPWIRE_TOKEN),
    # through what, and when: what the service's own receipt of the run says.
    assert receipt.condition["by"] == flag["actor"] == "TRIPWIRE_TOKEN"
    assert receipt.condition["via"] == "api" and receipt.condition["at"] == flag["at"]
    assert "TRIPWIRE_TOKEN" in out.message
    bodies_after = probe.after("tool", at=killer.killed_at)
    models_after = probe.after("model", at=killer.killed_at)
    print(f"operator kill: {bodies_after} bodies and {models_after} model calls after it")
    assert bodies_after <= BODIES_BOUND and models_after <= MODELS_BOUND
    assert probe.count("tool") < 30


def _receipts() -> tuple[list[StopReceipt], Callable[[StopReceipt], None]]:
    got: list[StopReceipt] = []
    return got, got.append


# -- pydantic-ai -------------------------------------------------------------------------------


@pytest.fixture
def pai(monkeypatch: pytest.MonkeyPatch) -> Any:
    pytest.importorskip("pydantic_ai")
    from . import test_pydantic_ai as m

    return m


def test_pydantic_ai_loop_is_stopped_by_the_fleet(probe: Probe, pai: Any) -> None:
    from tripwire.integrations.pydantic_ai import Tripwire

    got, sink = _receipts()
    agent = pai.build(pai.looping, ProbedCounters(), Tripwire(loop_policy=None, on_receipt=sink))
    with probe.run():
        out = agent.run_sync("What is the refund policy?").output
    assert_fleet_loop_stop(probe, _stopped(out), got)


def test_pydantic_ai_operator_kill(probe: Probe, pai: Any) -> None:
    from tripwire.integrations.pydantic_ai import Tripwire

    from .scripts import healthy_calls

    got, sink = _receipts()
    agent = pai.build(pai.scripted(healthy_calls()), ProbedCounters(), Tripwire(on_receipt=sink))
    killer = Killer(probe)
    with probe.run():
        killer.start()
        out = agent.run_sync("Research").output
    killer.join(5)
    assert_operator_kill(probe, killer, _stopped(out), got)


@pytest.fixture
def redis_probe(
    redis_client: Any, tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Probe]:
    """The same agent, the service and the agent sharing Redis: the environment names only
    ``TRIPWIRE_REDIS_URL`` (pub/sub pushes the flag)."""
    from conftest import REDIS_URL

    with fh.fleet(tmp_path, redis_url=REDIS_URL) as running:
        monkeypatch.setenv("TRIPWIRE_REDIS_URL", REDIS_URL)
        remote.disconnect()
        made = Probe(running, model_s=MODEL_S)
        fh.PROBE = made
        try:
            yield made
        finally:
            fh.PROBE = None
            made.close()
            remote.disconnect()
            killswitch.KILL_FLAGS.clear_all()


@pytest.mark.redis
def test_pydantic_ai_loop_is_stopped_by_the_fleet_through_redis(redis_probe: Probe, pai: Any) -> None:
    """The issue's case: the Tripwire capability with the Redis channel ran all 30 bodies."""
    from tripwire.integrations.pydantic_ai import Tripwire

    got, sink = _receipts()
    agent = pai.build(pai.looping, ProbedCounters(), Tripwire(loop_policy=None, on_receipt=sink))
    with redis_probe.run():
        out = agent.run_sync("What is the refund policy?").output
    assert remote.current() is not None and remote.current().redis_url is not None
    assert_fleet_loop_stop(redis_probe, _stopped(out), got)


@pytest.mark.redis
def test_pydantic_ai_operator_kill_through_redis(redis_probe: Probe, pai: Any) -> None:
    from tripwire.integrations.pydantic_ai import Tripwire

    from .scripts import healthy_calls

    got, sink = _receipts()
    agent = pai.build(pai.scripted(healthy_calls()), ProbedCounters(), Tripwire(on_receipt=sink))
    killer = Killer(redis_probe)
    with redis_probe.run():
        killer.start()
        out = agent.run_sync("Research").output
    killer.join(5)
    assert_operator_kill(redis_probe, killer, _stopped(out), got)


# -- LangChain: the middleware and the callback handler ----------------------------------------

LC_MODES = ["create_agent+middleware", "create_agent+callbacks", "create_react_agent+callbacks"]


@pytest.fixture
def lc(monkeypatch: pytest.MonkeyPatch) -> Any:
    pytest.importorskip("langchain")
    from . import test_langchain as m

    monkeypatch.setattr(m, "Counters", ProbedCounters)
    return m


@pytest.mark.parametrize("mode", LC_MODES)
def test_langchain_loop_is_stopped_by_the_fleet(probe: Probe, lc: Any, mode: str) -> None:
    from .agent_scripts import looping

    with probe.run():
        out, got = lc.run(mode, looping, ProbedCounters(), loop_policy=None)
    assert_fleet_loop_stop(probe, _stopped(out), got)


@pytest.mark.parametrize("mode", LC_MODES)
def test_langchain_operator_kill(probe: Probe, lc: Any, mode: str) -> None:
    from .agent_scripts import scripted
    from .scripts import healthy_calls

    killer = Killer(probe)
    with probe.run():
        killer.start()
        out, got = lc.run(mode, scripted(healthy_calls()), ProbedCounters())
    killer.join(5)
    assert_operator_kill(probe, killer, _stopped(out), got)


# -- OpenAI Agents SDK -------------------------------------------------------------------------


@pytest.fixture
def oai_agents(monkeypatch: pytest.MonkeyPatch) -> Any:
    pytest.importorskip("agents")
    from . import test_openai_agents as m

    monkeypatch.setattr(m, "Counters", ProbedCounters)
    return m


def test_openai_agents_loop_is_stopped_by_the_fleet(probe: Probe, oai_agents: Any) -> None:
    got, sink = _receipts()
    h = oai_agents.Harness(oai_agents.looping)
    with probe.run():
        out = h.tripwire(loop_policy=None, on_receipt=sink).run_sync(h.agent, "Refund policy?")
    assert_fleet_loop_stop(probe, _stopped(out), got)


def test_openai_agents_operator_kill(probe: Probe, oai_agents: Any) -> None:
    from .scripts import healthy_calls

    got, sink = _receipts()
    h = oai_agents.Harness(oai_agents.scripted(healthy_calls()))
    killer = Killer(probe)
    with probe.run():
        killer.start()
        out = h.tripwire(on_receipt=sink).run_sync(h.agent, "Research")
    killer.join(5)
    assert_operator_kill(probe, killer, _stopped(out), got)


# -- smolagents --------------------------------------------------------------------------------

SMOL_AGENTS = [pytest.param(False, id="ToolCallingAgent"), pytest.param(True, id="CodeAgent")]


@pytest.fixture
def smol(monkeypatch: pytest.MonkeyPatch) -> Any:
    pytest.importorskip("smolagents")
    from . import test_smolagents as m

    monkeypatch.setattr(m, "Counters", ProbedCounters)
    return m


@pytest.mark.parametrize("code", SMOL_AGENTS)
def test_smolagents_loop_is_stopped_by_the_fleet(probe: Probe, smol: Any, code: bool) -> None:
    got, sink = _receipts()
    h = smol.Harness(smol.looping, code=code)
    with probe.run():
        out = h.tripwire(loop_policy=None, on_receipt=sink).run(h.agent, "Refund policy?")
    assert_fleet_loop_stop(probe, _stopped(out), got)


@pytest.mark.parametrize("code", SMOL_AGENTS)
def test_smolagents_operator_kill(probe: Probe, smol: Any, code: bool) -> None:
    from .scripts import healthy_calls

    got, sink = _receipts()
    h = smol.Harness(smol.scripted(healthy_calls()), code=code)
    killer = Killer(probe)
    with probe.run():
        killer.start()
        out = h.tripwire(on_receipt=sink).run(h.agent, "Research")
    killer.join(5)
    assert_operator_kill(probe, killer, _stopped(out), got)


# -- Google ADK --------------------------------------------------------------------------------


@pytest.fixture
def adk(monkeypatch: pytest.MonkeyPatch) -> Any:
    pytest.importorskip("google.adk")
    from google.adk.cli.agent_test_runner import MockModel

    from . import test_google_adk as m

    monkeypatch.setattr(m, "Counters", ProbedCounters)
    generate = MockModel.generate_content_async

    async def thinking(self: Any, llm_request: Any, stream: bool = False) -> Any:
        if fh.PROBE is not None:
            fh.PROBE.model()  # counted, and the model thinks (blocking, as a sync client would)
        async for response in generate(self, llm_request, stream):
            yield response

    monkeypatch.setattr(MockModel, "generate_content_async", thinking)
    return m


def test_google_adk_loop_is_stopped_by_the_fleet(probe: Probe, adk: Any) -> None:
    got, sink = _receipts()
    h = adk.Harness(adk.LOOPING)
    with probe.run():
        out = h.run_sync(h.plugin(loop_policy=None, on_receipt=sink))
    assert_fleet_loop_stop(probe, _stopped(out), got)


def test_google_adk_operator_kill(probe: Probe, adk: Any) -> None:
    from .scripts import healthy_calls

    got, sink = _receipts()
    h = adk.Harness([*healthy_calls(), "done"])
    killer = Killer(probe)
    with probe.run():
        killer.start()
        out = h.run_sync(h.plugin(on_receipt=sink))
    killer.join(5)
    assert_operator_kill(probe, killer, _stopped(out), got)


# -- the plain loops: run_openai, run_anthropic ------------------------------------------------

CLIENTS = ["openai", "anthropic"]


@pytest.fixture
def loops() -> Any:
    from . import test_loop as m

    return m


@pytest.mark.parametrize("kind", CLIENTS)
def test_plain_loop_is_stopped_by_the_fleet(probe: Probe, loops: Any, kind: str) -> None:
    from .agent_scripts import looping

    with probe.run():
        out, (_, got) = loops.run(kind, looping, ProbedCounters(), loop_policy=None)
    assert_fleet_loop_stop(probe, _stopped(out), got)


@pytest.mark.parametrize("kind", CLIENTS)
def test_plain_loop_operator_kill(probe: Probe, loops: Any, kind: str) -> None:
    from .agent_scripts import scripted
    from .scripts import healthy_calls

    killer = Killer(probe)
    with probe.run():
        killer.start()
        out, (_, got) = loops.run(kind, scripted(healthy_calls()), ProbedCounters())
    killer.join(5)
    assert_operator_kill(probe, killer, _stopped(out), got)
