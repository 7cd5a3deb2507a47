"""A smolagents ToolCallingAgent stuck on one search, stopped by tripwire (offline, no key).

The model is the smallest smolagents ``Model`` subclass: it asks for ``search_docs(query=
"refund policy")`` every step. tripwire refuses the 4th identical call before it runs and its
step callback ends the run; the caller gets a ``StoppedRun``, not 20 more model calls.

Run: python examples/smolagents_loop.py
"""

from __future__ import annotations

from typing import Any

from smolagents import Model, ToolCallingAgent, tool
from smolagents.models import (
    ChatMessage,
    ChatMessageToolCall,
    ChatMessageToolCallFunction,
    MessageRole,
)
from smolagents.monitoring import TokenUsage

from tripwire import Limits
from tripwire.integrations import StoppedRun
from tripwire.integrations.smolagents import Tripwire

ran: list[str] = []


@tool
def search_docs(query: str) -> str:
    """Search the documentation.

    Args:
        query: what to look for.
    """
    ran.append(query)
    return "no results"


class StuckModel(Model):  # type: ignore[misc]
    """Always asks for the same search."""

    calls = 0

    def generate(self, messages: list[Any], **kwargs: Any) -> ChatMessage:
        StuckModel.calls += 1
        function = ChatMessageToolCallFunction(name="search_docs", arguments={"query": "refund policy"})
        call = ChatMessageToolCall(id=f"call_{StuckModel.calls}", type="function", function=function)
        usage = TokenUsage(input_tokens=120, output_tokens=12)
        return ChatMessage(role=MessageRole.ASSISTANT, content=None, tool_calls=[call], token_usage=usage)


agent = ToolCallingAgent(tools=[search_docs], model=StuckModel(model_id="stuck"), name="support",
                         max_steps=20, verbosity_level=0)  # fmt: skip

result = Tripwire(Limits(max_steps=20)).run(agent, "What is the refund policy?")
assert isinstance(result, StoppedRun)
print(f"stopped: {result.reason.value}")
print(f"tool bodies run: {len(ran)}, model calls: {StuckModel.calls}")
print(f"receipt: {result.receipt.reason.value}, {result.receipt.counters.steps} steps")
