"""The scripts every integration test runs, whatever the framework.

- the looping model: ``search_docs(query="refund policy")`` forever, the same result each time;
- the healthy model: 30 different calls (searches and page fetches), then an answer;
- the orders batch: 30 different ``lookup_order`` calls that all come back "shipped".

:class:`Counters` counts what actually ran: tool bodies by (tool, arguments) and model calls,
so a test measures the stop instead of trusting a flag.
"""

from __future__ import annotations

import json
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

LOOP_TOOL = "search_docs"
LOOP_ARGS: dict[str, Any] = {"query": "refund policy"}
LOOP_RESULT = "no results"
NUDGE_TEXT_START = "You called search_docs with the same arguments"
HEALTHY_CALLS = 30
WORDS = [
    "billing",
    "shipping",
    "returns",
    "warranty",
    "invoices",
    "accounts",
    "refunds",
    "taxes",
    "coupons",
    "gifts",
    "pricing",
    "contact",
    "terms",
    "privacy",
    "status",
    "careers",
    "press",
    "partners",
    "security",
    "support",
    "alpha",
    "bravo",
    "charlie",
    "delta",
    "echo",
    "foxtrot",
    "golf",
    "hotel",
    "india",
    "juliet",
]
"""Distinct words for the healthy script (words, not numbers: result digests mask digits)."""


def healthy_calls(n: int = HEALTHY_CALLS) -> list[tuple[str, dict[str, Any]]]:
    """``n`` different calls, alternating ``search_docs`` and ``fetch_page``."""
    calls: list[tuple[str, dict[str, Any]]] = []
    for i in range(n):
        word = WORDS[i % len(WORDS)]
        if i % 2 == 0:
            calls.append(("search_docs", {"query": f"{word} policy"}))
        else:
            calls.append(("fetch_page", {"url": f"https://docs.example/{word}"}))
    return calls


ORDER_IDS = [f"ORD-{w.upper()}" for w in WORDS[:HEALTHY_CALLS]]


def order_calls() -> list[tuple[str, dict[str, Any]]]:
    """30 different ``lookup_order`` calls (each order id is different)."""
    return [("lookup_order", {"order_id": oid}) for oid in ORDER_IDS]


def search_docs_body(query: str) -> str:
    return LOOP_RESULT if query == LOOP_ARGS["query"] else f"results about {query}"


def fetch_page_body(url: str) -> str:
    return f"<html>{url}</html>"


def lookup_order_body(order_id: str) -> str:
    return "shipped"


@dataclass
class Counters:
    """What really ran, counted at the tool bodies and at the fake model (thread-safe)."""

    tools: Counter[tuple[str, str]] = field(default_factory=Counter)
    model_calls: int = 0
    model_calls_at_stop: int | None = None
    saw_nudge: bool = False
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def tool(self, name: str, args: dict[str, Any]) -> None:
        with self._lock:
            self.tools[(name, json.dumps(args, sort_keys=True))] += 1

    def model(self) -> int:
        with self._lock:
            self.model_calls += 1
            return self.model_calls

    @property
    def loop_bodies(self) -> int:
        """How many times the looping call's body ran."""
        return self.tools[(LOOP_TOOL, json.dumps(LOOP_ARGS, sort_keys=True))]

    @property
    def tool_bodies(self) -> int:
        return sum(self.tools.values())


def run_body(counters: Counters, name: str, args: dict[str, Any]) -> str:
    """Run one scripted tool body, counted."""
    counters.tool(name, args)
    if name == "search_docs":
        return search_docs_body(**args)
    if name == "fetch_page":
        return fetch_page_body(**args)
    if name == "lookup_order":
        return lookup_order_body(**args)
    raise KeyError(name)
