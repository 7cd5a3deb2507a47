"""tripwire inside a LangGraph create_react_agent: one callback handler.

Runs offline on LangChain's GenericFakeChatModel (no keys): the model keeps asking for
search_docs(query="refund policy"). Run it with ``python examples/langgraph_react_agent.py``.
"""

from __future__ import annotations

import warnings
from typing import Any

from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage
from langchain_core.tools import tool
from langgraph.prebuilt import create_react_agent

from tripwire import Limits
from tripwire.integrations import StoppedRun
from tripwire.integrations.langchain import TripwireCallbackHandler


class FakeToolModel(GenericFakeChatModel):
    """LangChain's fake chat model, plus the bind_tools that create_react_agent calls."""

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


with warnings.catch_warnings():
    warnings.simplefilter("ignore", DeprecationWarning)  # create_react_agent moved in LangChain v1
    graph = create_react_agent(FakeToolModel(messages=stuck), [search_docs])

handler = TripwireCallbackHandler(Limits(max_steps=20), agent="support", prices=None)
out = handler.invoke(graph, {"messages": [{"role": "user", "content": "Refund policy?"}]})
assert isinstance(out, StoppedRun)
print(f"stopped: {out.reason.value} after {out.counters.tool_calls} calls")
print(f"receipt: {out.receipt.reason.value}, {out.receipt.counters.steps} steps")
