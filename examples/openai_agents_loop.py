"""An OpenAI Agents SDK agent stuck on one search, stopped by tripwire (offline, no key).

The model is the SDK's own ``ScriptedModel``: it asks for ``search_docs(query="refund
policy")`` every turn. tripwire refuses the 4th identical call before it runs and ends the run;
the caller gets a ``StoppedRun`` (reason, counters, receipt), not a traceback.

Run: python examples/openai_agents_loop.py
"""

from __future__ import annotations

from agents import Agent, function_tool, set_tracing_disabled
from agents.testing import ModelStep, ScriptedModel, function_call
from agents.usage import Usage

from tripwire import Limits
from tripwire.integrations import StoppedRun
from tripwire.integrations.openai_agents import Tripwire

set_tracing_disabled(True)  # offline: no trace upload
ran: list[str] = []


@function_tool
def search_docs(query: str) -> str:
    """Search the documentation."""
    ran.append(query)
    return "no results"


def stuck(call: object) -> ModelStep:
    usage = Usage(requests=1, input_tokens=120, output_tokens=12, total_tokens=132)
    call_id = f"call_{len(ran)}"
    return ModelStep(output=[function_call("search_docs", {"query": "refund policy"}, call_id=call_id)], usage=usage)  # fmt: skip


model = ScriptedModel([ModelStep.respond(stuck) for _ in range(50)])
agent = Agent(name="support", model=model, tools=[search_docs])

result = Tripwire(Limits(max_steps=20)).run_sync(agent, "What is the refund policy?")
assert isinstance(result, StoppedRun)
print(f"stopped: {result.reason.value}")
print(f"tool bodies run: {len(ran)}, model calls: {len(model.calls)}")
print(f"receipt: {result.receipt.reason.value}, {result.receipt.counters.steps} steps")
