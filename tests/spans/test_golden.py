"""The span mapping on spans recorded from the real frameworks (``golden/``, see
``record_golden.py``), against values written by hand from what each agent did.

Every agent ran the same script: ``search_docs(query="billing")``,
``fetch_page(url="https://docs.example/faq")``, ``search_docs(query="shipping")``,
``fetch_page(url="https://docs.example/pricing")``, …, each model call reporting 10 input and 3
output tokens, under the agent name ``researcher``. The second test pins a digest of everything
the mapping and the default normalizer make of these spans: a change to either fails it until
:data:`~tripwire.spans.MAPPING_VERSION` (or the normalizer's version) is bumped.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import msgspec
import pytest

from tripwire.core.events import ModelCall, ToolCall
from tripwire.core.signature import DEFAULT_NORMALIZER
from tripwire.spans import MAPPING_VERSION, MappingStats, RunBoundary, SpanView, map_span

GOLDEN = Path(__file__).parent / "golden"

CALLS = [
    ("search_docs", "query", "billing"),
    ("fetch_page", "url", "https://docs.example/faq"),
    ("search_docs", "query", "shipping"),
    ("fetch_page", "url", "https://docs.example/pricing"),
]
"""The first four calls of the script: (tool, argument name, value)."""


def load(name: str) -> list[SpanView]:
    data = json.loads((GOLDEN / f"{name}.json").read_text())
    fields = ("name", "trace_id", "span_id", "parent_span_id", "start_s", "end_s",
              "status_error", "status_message", "exception_type", "scope_name")  # fmt: skip
    return [
        SpanView(**{k: s[k] for k in fields}, attributes=s["attributes"]) for s in data["spans"]
    ]


def mapped(name: str) -> tuple[list[ToolCall], list[ModelCall], list[RunBoundary], MappingStats]:
    stats = MappingStats()
    tools, models, runs = [], [], []
    for view in load(name):
        event = map_span(view, stats=stats)
        if isinstance(event, ToolCall):
            tools.append(event)
        elif isinstance(event, ModelCall):
            models.append(event)
        elif isinstance(event, RunBoundary):
            runs.append(event)
    return tools, models, runs, stats


# How each emitter records the arguments: "json" text, a "dict" (unwrapped envelope), or the
# single argument as bare "text" (OpenInference's LangChain tracer).
# (framework, arguments as, call ids recorded, model name, tokens reported, outermost agent,
#  every boundary's agent name, inner first)
EXPECTED: dict[str, tuple[str, bool, str | None, int, str, list[str]]] = {
    "pydantic_ai": ("json", True, "function:model_fn:", 10, "researcher", ["researcher"]),
    "langchain_openinference": ("text", True, None, 10, "researcher", ["researcher"]),
    "langchain_openllmetry": (
        "dict", True, "unknown", 10, "researcher", ["researcher", "researcher"]
    ),
    # create_react_agent: the model node is an OpenInference AGENT span once per step; none of
    # them is a run boundary, only the root CHAIN is.
    "langgraph_react_openinference": ("text", True, None, 10, "researcher", ["researcher"]),
    "langgraph_react_openllmetry": (
        "dict", True, "unknown", 10, "researcher", ["researcher", "researcher"]
    ),
    "openai_agents_openinference": (
        "json", False, "scripted-model", 10, "Agent workflow", ["researcher", "Agent workflow"]
    ),
    # OpenLLMetry records usage for Responses-API calls only: zero tokens here.
    "openai_agents_openllmetry": (
        "json", False, None, 0, "Agent Workflow", ["researcher", "Agent Workflow"]
    ),
    "smolagents": ("dict", False, "scripted-model", 10, "researcher.run", ["researcher.run"]),
    "google_adk": ("json", True, "mock", 10, "researcher", ["researcher", "researcher"]),
    "google_adk_legacy": ("json", True, "mock", 10, "researcher", ["researcher"]),
    # The Vercel AI SDK (npm `ai` 6, clients/typescript/test/record_golden.ts), functionId
    # "researcher": the run span is ai.generateText / ai.streamText, its aggregate usage unread.
    "ai_sdk_generate_text": ("json", True, "mock-model-id", 10, "researcher", ["researcher"]),
    "ai_sdk_stream_text": ("json", True, "mock-model-id", 10, "researcher", ["researcher"]),
}  # fmt: skip


def _arguments(call: ToolCall, form: str) -> Any:
    if form == "json":
        assert isinstance(call.arguments, str)
        return json.loads(call.arguments)
    return call.arguments


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_mapping_reads_what_each_framework_recorded(name: str) -> None:
    form, ids, model, tokens, outermost, agents = EXPECTED[name]
    tools, models, runs, stats = mapped(name)

    assert [c.tool for c in tools] == [t for t, _, _ in CALLS]
    for call, (_, key, value) in zip(tools, CALLS, strict=True):
        if form == "text":
            assert call.arguments == value
        else:
            assert _arguments(call, form) == {key: value}
        assert call.error_type is None and call.attempt is None
        assert call.start_s is not None and call.end_s is not None and call.end_s >= call.start_s
    assert [c.call_id for c in tools] == ([f"call_{i}" for i in range(4)] if ids else [None] * 4)
    # Results are recorded by every one of these emitters, and differ call to call.
    digests = [c.result_digest for c in tools]
    assert None not in digests and len(set(digests)) == 4

    assert len(models) == 2
    assert {(m.model, m.input_tokens, m.output_tokens) for m in models} == {
        (model, tokens, 3 if tokens else 0)
    }
    assert [r.agent for r in runs] == agents
    root = [r for r in runs if r.parent_span_id is None]
    assert [r.agent for r in root] == [outermost] or (name == "google_adk_legacy" and not root)
    assert stats.malformed == 0


# What the mapping (MAPPING_VERSION) and the default normalizer make of each golden file. A
# change to either changes these digests: bump the version that changed, then re-pin with the
# digest the failure prints.
PINNED: dict[str, str] = {
    "ai_sdk_generate_text": "d1c175e95fdeec8b",
    "ai_sdk_stream_text": "7886eef2c8406ec7",
    "google_adk": "b0b36e662d66cfcc",
    "google_adk_legacy": "598e9494ff9ad6c6",
    "langchain_openinference": "1583396274502b2f",
    "langchain_openllmetry": "2ca211bb3a38e1f8",
    "langgraph_react_openinference": "d6155101febc5d47",
    "langgraph_react_openllmetry": "2faece4b05c8a0b4",
    "openai_agents_openinference": "debc4d73eccdff94",
    "openai_agents_openllmetry": "65c1acc5dabd85e2",
    "pydantic_ai": "06588f245a6b4226",
    "smolagents": "14d8d9d810e4ab11",
}
PIN_VERSIONS = ("m3", "n3r5+vk.e84487b5+cap.16384")


def _digest(name: str) -> str:
    normalizer = DEFAULT_NORMALIZER
    out: list[Any] = []
    for view in load(name):
        event = map_span(view)
        if isinstance(event, ToolCall):
            sig = normalizer.signature(event.tool, event.arguments)
            out.append(["tool", msgspec.to_builtins(event), sig.digest, sig.kind.value])
        elif isinstance(event, (ModelCall, RunBoundary)):
            out.append([type(event).__name__, msgspec.to_builtins(event)])
        else:
            out.append(None)
    return hashlib.sha256(msgspec.json.encode(out)).hexdigest()[:16]


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_mapping_output_is_pinned_to_its_version(name: str) -> None:
    versions = (MAPPING_VERSION, DEFAULT_NORMALIZER.version)
    got = _digest(name)
    assert versions == PIN_VERSIONS and got == PINNED[name], (
        f"the mapping or the normalizer changed what {name}'s spans map to (digest {got}): "
        f"bump MAPPING_VERSION or the normalizer version, then re-pin PINNED[{name!r}] = "
        f"{got!r} and PIN_VERSIONS = {versions!r}"
    )
