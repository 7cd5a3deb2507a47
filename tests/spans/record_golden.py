"""Record the golden spans of ``tests/spans/golden/`` from the real frameworks (run by hand).

Usage: ``PYTHONPATH=src:tests python tests/spans/record_golden.py`` (every framework extra
installed). Each framework's working agent (``harness.script(False)``: alternating
``search_docs`` and ``fetch_page`` with different arguments) runs offline on its own fake model
through its own instrumentation, and a small selection of the finished spans is written as
JSON: the first :data:`TOOLS` tool spans, the first :data:`MODELS` model spans, every run span,
and the first :data:`OTHERS` spans of no agent shape. Long text attributes of non-tool spans
(prompts, message lists) are cut to :data:`MAX_TEXT` characters to keep the files small: the
mapping reads none of them. Tool spans are kept whole.

The expected values in ``test_golden.py`` are written by hand from what each agent did, not
from this script's output; re-recording after a framework upgrade shows what changed.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

from frameworks import harness
from tripwire.spans import SpanRole, classify, view_from_readable_span

TOOLS = 4
MODELS = 2
OTHERS = 3
MAX_TEXT = 300
GOLDEN = Path(__file__).parent / "golden"

RUNS = {
    "pydantic_ai": lambda: harness.run_pydantic_ai(False),
    "langchain_openinference": lambda: harness.run_langchain(False),
    "langchain_openllmetry": lambda: harness.run_langchain(False, instrumentation="openllmetry"),
    "langgraph_react_openinference": lambda: harness.run_langchain(
        False, graph="create_react_agent"
    ),
    "langgraph_react_openllmetry": lambda: harness.run_langchain(
        False, instrumentation="openllmetry", graph="create_react_agent"
    ),
    "openai_agents_openinference": lambda: harness.run_openai_agents(False),
    "openai_agents_openllmetry": lambda: harness.run_openai_agents(False, bridge="openllmetry"),
    "smolagents": lambda: harness.run_smolagents(False),
    "google_adk": lambda: harness.run_adk(False),
    "google_adk_legacy": lambda: harness.run_adk(False, schema=1),
}


def _value(value: Any, keep: bool) -> Any:
    if isinstance(value, tuple):
        return [_value(v, keep) for v in value]
    if isinstance(value, str) and not keep and len(value) > MAX_TEXT:
        return value[:MAX_TEXT] + "…"
    return value


def record(name: str) -> dict[str, Any]:
    spans = RUNS[name]()
    counts = {SpanRole.TOOL: 0, SpanRole.MODEL: 0, SpanRole.OTHER: 0}
    limits = {SpanRole.TOOL: TOOLS, SpanRole.MODEL: MODELS, SpanRole.OTHER: OTHERS}
    out = []
    base = min(s.start_time for s in spans if s.start_time is not None)
    for span in spans:
        view = view_from_readable_span(span)
        role = classify(view.attributes, view.name, view.parent_span_id)
        if role is not SpanRole.RUN:
            if counts[role] >= limits[role]:
                continue
            counts[role] += 1
        keep = role is SpanRole.TOOL
        out.append(
            {
                "name": view.name,
                "trace_id": view.trace_id,
                "span_id": view.span_id,
                "parent_span_id": view.parent_span_id,
                # times relative to the run's first span, in seconds (stable files)
                "start_s": round((span.start_time - base) / 1e9, 6),
                "end_s": round((span.end_time - base) / 1e9, 6),
                "status_error": view.status_error,
                "status_message": view.status_message,
                "exception_type": view.exception_type,
                "scope_name": view.scope_name,
                "attributes": {k: _value(v, keep) for k, v in view.attributes.items()},
            }
        )
    return {"framework": name, "spans": out}


def main(names: list[str]) -> None:
    GOLDEN.mkdir(exist_ok=True)
    for name in names or list(RUNS):
        data = record(name)
        path = GOLDEN / f"{name}.json"
        path.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
        print(f"{path}: {len(data['spans'])} spans")


if __name__ == "__main__":
    main(sys.argv[1:])
