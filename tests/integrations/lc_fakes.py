"""A scripted LangChain chat model (a real ``BaseChatModel`` subclass) and the tools, counted."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from langchain_core.callbacks import CallbackManagerForLLMRun
from langchain_core.language_models.chat_models import BaseChatModel
from langchain_core.messages import AIMessage, BaseMessage, ToolMessage
from langchain_core.outputs import ChatGeneration, ChatResult
from langchain_core.tools import BaseTool, tool
from pydantic import ConfigDict

from .scripts import Counters, run_body

Script = Callable[[int, list[str], bool], "list[tuple[str, dict[str, Any]]] | str"]
"""(model call index, tool results so far, tools offered) -> tool calls or an answer."""


class ScriptedChatModel(BaseChatModel):
    """Answers from a script; counts its calls; reports usage like a provider does."""

    model_config = ConfigDict(arbitrary_types_allowed=True)
    script: Any
    counters: Any
    bound_tools: int = 0
    """How many tools the model was bound with (0: none, e.g. the tool-less last step)."""

    @property
    def _llm_type(self) -> str:
        return "scripted"

    def bind_tools(self, tools: Sequence[Any], **kwargs: Any) -> Any:
        return self.model_copy(update={"bound_tools": len(tools)})

    def _generate(
        self,
        messages: list[BaseMessage],
        stop: list[str] | None = None,
        run_manager: CallbackManagerForLLMRun | None = None,
        **kwargs: Any,
    ) -> ChatResult:
        i = self.counters.model() - 1
        seen = [str(m.content) for m in messages if isinstance(m, ToolMessage)]
        reply = self.script(i, seen, self.bound_tools > 0)
        usage = {"input_tokens": 10, "output_tokens": 3, "total_tokens": 13}
        if isinstance(reply, str):
            message = AIMessage(content=reply, usage_metadata=usage)  # type: ignore[arg-type]
        else:
            calls = [
                {"name": name, "args": args, "id": f"call_{i}_{j}", "type": "tool_call"}
                for j, (name, args) in enumerate(reply)
            ]
            message = AIMessage(content="", tool_calls=calls, usage_metadata=usage)  # type: ignore[arg-type]
        message.response_metadata = {"model_name": "scripted-model"}
        return ChatResult(generations=[ChatGeneration(message=message)])


def make_tools(counters: Counters) -> list[BaseTool]:
    @tool
    def search_docs(query: str) -> str:
        """Search the documentation."""
        return run_body(counters, "search_docs", {"query": query})

    @tool
    def fetch_page(url: str) -> str:
        """Fetch one page."""
        return run_body(counters, "fetch_page", {"url": url})

    @tool
    def lookup_order(order_id: str) -> str:
        """Look up one order."""
        return run_body(counters, "lookup_order", {"order_id": order_id})

    return [search_docs, fetch_page, lookup_order]
