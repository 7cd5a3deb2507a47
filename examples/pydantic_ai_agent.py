"""tripwire inside a pydantic-ai agent: one capability; the looping agent is stopped.

Runs offline on pydantic-ai's FunctionModel (no keys): the model keeps asking for
search_docs(query="refund policy"). Run it with ``python examples/pydantic_ai_agent.py``.
"""

from __future__ import annotations

from pydantic_ai import Agent
from pydantic_ai.messages import ModelMessage, ModelResponse, ToolCallPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

from tripwire import Limits
from tripwire.integrations import StoppedRun
from tripwire.integrations.pydantic_ai import Tripwire


def stuck_model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
    """A model stuck in a loop: the same search, forever."""
    return ModelResponse(parts=[ToolCallPart("search_docs", {"query": "refund policy"})])


receipts = []
agent = Agent(
    FunctionModel(stuck_model),
    name="support",
    capabilities=[Tripwire(Limits(max_steps=20), prices=None, on_receipt=receipts.append)],
)


@agent.tool_plain
def search_docs(query: str) -> str:
    """Search the documentation."""
    return "no results"


result = agent.run_sync("What is the refund policy?")
assert isinstance(result.output, StoppedRun)
print(f"stopped: {result.output.reason.value} after {result.output.counters.tool_calls} calls")
print(result.output.message)
print(f"receipt: {receipts[0].reason.value}, {receipts[0].counters.steps} steps")
