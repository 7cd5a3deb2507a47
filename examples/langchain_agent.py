"""tripwire inside LangChain v1 create_agent: one middleware; the looping agent is stopped.

Runs offline on LangChain's GenericFakeChatModel (no keys): the model keeps asking for
search_docs(query="refund policy"). Run it with ``python examples/langchain_agent.py``.
"""

from __future__ import annotations

from typing import Any

from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool

from tripwire.integrations.langchain import TripwireMiddleware


class FakeToolModel(GenericFakeChatModel):
    """LangChain's fake chat model, plus the bind_tools that create_agent calls."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


stuck = (
    AIMessage(content="", tool_calls=[{"name": "search_docs", "args": {"query": "refund policy"},
                                       "id": f"call_{i}", "type": "tool_call"}])
    for i in range(50)
)  # fmt: skip


@tool
def search_docs(query: str) -> str:
    """Search the documentation."""
    return "no results"


agent = create_agent(
    FakeToolModel(messages=stuck),
    [search_docs],
    middleware=[TripwireMiddleware(agent="support", prices=None)],
)
out = agent.invoke({"messages": [{"role": "user", "content": "What is the refund policy?"}]})
stopped = out["tripwire"]
print(f"stopped: {stopped.reason.value} after {stopped.counters.tool_calls} calls")
print("last message:", out["messages"][-1].content)
