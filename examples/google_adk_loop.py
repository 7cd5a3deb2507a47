"""A Google ADK agent stuck on one search, stopped by tripwire's plugin (offline, no key).

The model is ADK's own ``MockModel``, scripted to ask for ``search_docs(query="refund
policy")`` every turn. The plugin refuses the 4th identical call before it runs and ends the
invocation through ADK's own final event; ``run`` hands back a ``StoppedRun``.

Run: python examples/google_adk_loop.py
"""

from __future__ import annotations

import asyncio

from google.adk.agents import Agent
from google.adk.cli.agent_test_runner import MockModel
from google.adk.models.llm_response import LlmResponse
from google.adk.runners import Runner
from google.adk.sessions import InMemorySessionService
from google.genai import types

from tripwire import Limits
from tripwire.integrations import StoppedRun
from tripwire.integrations.google_adk import TripwirePlugin, run

ran: list[str] = []


def search_docs(query: str) -> str:
    """Search the documentation."""
    ran.append(query)
    return "no results"


usage = types.GenerateContentResponseUsageMetadata(prompt_token_count=120, candidates_token_count=12)
call = types.FunctionCall(name="search_docs", args={"query": "refund policy"})
stuck = LlmResponse(content=types.Content(role="model", parts=[types.Part(function_call=call)]),
                    usage_metadata=usage)  # fmt: skip
model = MockModel(responses=[stuck] * 50, requests=[])
agent = Agent(name="support", model=model, instruction="Answer from the docs.", tools=[search_docs])


async def main() -> None:
    sessions = InMemorySessionService()
    runner = Runner(app_name="support", agent=agent, session_service=sessions,
                    plugins=[TripwirePlugin(Limits(max_steps=20))])  # fmt: skip
    session = await sessions.create_session(app_name="support", user_id="ana")
    question = types.Content(role="user", parts=[types.Part.from_text(text="Refund policy?")])
    result = await run(runner, user_id="ana", session_id=session.id, new_message=question)
    assert isinstance(result, StoppedRun)
    print(f"stopped: {result.reason.value}")
    print(f"tool bodies run: {len(ran)}, model calls: {len(model.requests)}")
    print(f"receipt: {result.receipt.reason.value}, {result.receipt.counters.steps} steps")


asyncio.run(main())
