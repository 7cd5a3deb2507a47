"""The plain OpenAI tool loop, guarded by tripwire (no framework).

A scripted stand-in for ``openai.OpenAI()`` answers with the openai package's own
ChatCompletion type, so this runs offline with no key. Run: ``python examples/openai_tool_loop.py``.
"""

from __future__ import annotations

import json
from typing import Any

from openai.types.chat import ChatCompletion

from tripwire import Limits
from tripwire.integrations.loop import run_openai


class StuckCompletions:
    """Always asks for the same search (a model stuck in a loop)."""

    def create(self, *, model: str, messages: list[Any], **kwargs: Any) -> ChatCompletion:
        call = {"id": f"call_{len(messages)}", "type": "function",
                "function": {"name": "search_docs", "arguments": json.dumps({"query": "refund policy"})}}  # fmt: skip
        return ChatCompletion.model_validate({
            "id": "cmpl", "object": "chat.completion", "created": 0, "model": model,
            "choices": [{"index": 0, "finish_reason": "tool_calls",
                         "message": {"role": "assistant", "content": None, "tool_calls": [call]}}],
            "usage": {"prompt_tokens": 120, "completion_tokens": 20, "total_tokens": 140},
        })  # fmt: skip


class Client:
    """What ``openai.OpenAI()`` looks like to the loop: ``client.chat.completions.create``."""

    class chat:  # the client's own attribute name
        completions = StuckCompletions()


def search_docs(query: str) -> str:
    return "no results"


out = run_openai(
    Client(),
    model="gpt-4o-mini",
    messages=[{"role": "user", "content": "What is the refund policy?"}],
    tools=[{"type": "function", "function": {"name": "search_docs", "parameters": {}}}],
    functions={"search_docs": search_docs},
    limits=Limits(max_steps=20),
    prices=None,
)
print(type(out).__name__, out.reason.value if hasattr(out, "reason") else out.output)
print(out.receipt.reason.value, "after", out.receipt.counters.tool_calls, "tool calls")
