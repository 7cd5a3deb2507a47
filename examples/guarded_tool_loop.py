"""A hand-written tool loop guarded end to end by tripwire, with a scripted fake model.

The "model" is a list of canned turns: it looks up a refund policy, sends one e-mail (twice,
the second time deduplicated by the idempotency wrapper), then gets stuck searching the same
query again and again. The guard shows budget advisories to the model, refuses the 4th
identical search before it runs (the loop), and the runner's partial-answer hook turns the work
done so far into an answer instead of losing it.

Run: python examples/guarded_tool_loop.py
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

from tripwire.core.budget import Limits
from tripwire.core.results import ToolResult
from tripwire.errors import RunStopped
from tripwire.guard import Guard, GuardSnapshot
from tripwire.idempotency import idempotent
from tripwire.store.memory import MemoryIdempotencyStore


@dataclass
class Turn:
    """One canned model reply: tool calls to make, or a final answer."""

    tool_calls: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
    answer: str | None = None
    input_tokens: int = 1200
    output_tokens: int = 80


SCRIPT = [
    Turn(tool_calls=[("search_docs", {"query": "refund policy"})]),
    Turn(tool_calls=[("read_doc", {"doc_id": "policy-7"}), ("read_doc", {"doc_id": "faq-2"})]),
    Turn(tool_calls=[("send_email", {"to": "ana@example.com", "subject": "Your refund"})]),
    Turn(tool_calls=[("send_email", {"to": "ana@example.com", "subject": "Your refund"})]),
    # from here on the model is stuck: the same search, the same empty result
    *[Turn(tool_calls=[("search_docs", {"query": "refund status ana"})]) for _ in range(8)],
    Turn(answer="(never reached)"),
]

sent_emails: list[str] = []
searches_run: list[str] = []


@idempotent(MemoryIdempotencyStore())
def send_email(to: str, subject: str) -> dict[str, str]:
    sent_emails.append(to)
    return {"message_id": f"msg-{len(sent_emails)}"}


def run_tool(name: str, args: dict[str, Any]) -> ToolResult:
    if name == "search_docs":
        searches_run.append(args["query"])
        hits = ["policy-7", "faq-2"] if args["query"] == "refund policy" else []
        return ToolResult.success({"hits": hits})
    if name == "read_doc":
        return ToolResult.success({"doc": args["doc_id"], "text": "Refunds within 30 days."})
    if name == "send_email":
        outcome = send_email(**args)
        return ToolResult.success({"status": outcome.status, **outcome.value})
    return ToolResult.error("unknown_tool", retryable=False, message=f"no tool {name}")


def main() -> int:
    facts: list[str] = []
    transcript: list[str] = []
    guard = Guard(
        Limits(max_steps=12, max_tool_calls=20, tool_caps={"send_email": 2}, max_cost_usd=0.12),
        prices=None,  # the fake model has no price; we report cost_usd ourselves
    )

    def partial_answer(snap: GuardSnapshot) -> str:
        return (
            f"Partial answer (stopped: {snap.reason.value if snap.reason else '?'} after "
            f"{snap.counters.tool_calls} tool calls): " + "; ".join(facts)
        )

    guard.partial_answer = partial_answer
    model = iter(SCRIPT)
    try:
        while True:
            advisory = guard.before_step()
            if not advisory.ok:
                transcript.append(f"[to model] {advisory.message}")
            turn = next(model)
            usage = guard.record_usage(
                model="fake-model",
                input_tokens=turn.input_tokens,
                output_tokens=turn.output_tokens,
                cost_usd=0.012,
            )
            if not usage.ok:  # shown with the next model call
                transcript.append(f"[to model] {usage.message}")
            if turn.answer is not None:
                guard.finish()
                print("answer:", turn.answer)
                break
            verdict = guard.before_tools(turn.tool_calls)
            if not verdict.allowed:
                transcript.append(f"[tool refused] {verdict.message}")
                continue
            if not verdict.ok:
                transcript.append(f"[to model] {verdict.message}")
            for name, args in turn.tool_calls:
                result = guard.timeout(run_tool, 5.0, name, args)
                transcript.append(f"{name}({args}) -> {result.value}")
                if result.ok and name == "read_doc":
                    facts.append(result.value["text"])
                if result.ok and name == "send_email":
                    facts.append(f"e-mail {result.value['status']} ({result.value['message_id']})")
                guard.after_tool(name, args, result)
    except RunStopped as stop:
        print("\n".join(transcript))
        print(f"\nstopped: {stop.reason.value}: {stop}")
        print(stop.partial)
        receipt = guard.receipt("refund-agent")
        print("receipt:", receipt.reason.value if receipt.reason else None, receipt.condition)
        assert stop.reason.value == "loop_detected"
        assert sent_emails == ["ana@example.com"], sent_emails  # acted once
        # the stuck search ran 3 times: the 4th was refused before its body ran
        assert searches_run.count("refund status ana") == 3, searches_run
        assert receipt.after_stop is not None and not receipt.after_stop.active
        return 0
    print("\n".join(transcript))
    return 1  # the script is built to end in a detected loop


if __name__ == "__main__":
    sys.exit(main())
