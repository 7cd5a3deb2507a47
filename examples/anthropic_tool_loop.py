"""The plain Anthropic tool loop, guarded by tripwire (no framework).

A scripted stand-in for ``anthropic.Anthropic()`` answers with the anthropic package's own
Message type, so this runs offline with no key. The model repeats a search (it would answer
only after a nudge naming the repetition); tripwire stops it at the 4th identical call.
Run: ``python examples/anthropic_tool_loop.py``.
"""

from __future__ import annotations

from typing import Any

from anthropic.types import Message

from tripwire.integrations.loop import run_anthropic


class Messages:
    """Repeats one search; answers once a tool result says it repeated itself."""

    def create(self, *, model: str, messages: list[Any], **kwargs: Any) -> Message:
        results = [b["content"] for m in messages if isinstance(m["content"], list)
                   for b in m["content"] if b.get("type") == "tool_result"]  # fmt: skip
        if any("same arguments" in r for r in results) or len(results) >= 6:
            content: list[dict[str, Any]] = [{"type": "text", "text": "I could not find it."}]
        else:
            content = [{"type": "tool_use", "id": f"toolu_{len(results)}", "name": "search_docs",
                        "input": {"query": "refund policy"}}]  # fmt: skip
        return Message.model_validate({
            "id": "msg", "type": "message", "role": "assistant", "model": model,
            "content": content, "stop_reason": "end_turn", "stop_sequence": None,
            "usage": {"input_tokens": 120, "output_tokens": 20},
        })  # fmt: skip


class Client:
    """What ``anthropic.Anthropic()`` looks like to the loop: ``client.messages.create``."""

    messages = Messages()


def search_docs(query: str) -> str:
    return "no results"


out = run_anthropic(
    Client(),
    model="claude-haiku-4-5",
    messages=[{"role": "user", "content": "What is the refund policy?"}],
    tools=[{"name": "search_docs", "input_schema": {"type": "object"}}],
    functions={"search_docs": search_docs},
    prices=None,
)
print(
    type(out).__name__,
    "-",
    out.receipt.reason.value,
    "after",
    out.receipt.counters.tool_calls,
    "calls",
)
