"""Model scripts shared by the framework tests: (call index, tool results, tools offered)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .scripts import LOOP_ARGS, LOOP_TOOL, NUDGE_TEXT_START

Reply = "list[tuple[str, dict[str, Any]]] | str"
Script = Callable[[int, list[str], bool], Any]


def looping(i: int, seen: list[str], tools: bool) -> Any:
    return [(LOOP_TOOL, dict(LOOP_ARGS))]


def obeys_nudge(i: int, seen: list[str], tools: bool) -> Any:
    if any(s.startswith(NUDGE_TEXT_START) for s in seen):
        return "I could not find the refund policy."
    return [(LOOP_TOOL, dict(LOOP_ARGS))]


def scripted(calls: list[tuple[str, dict[str, Any]]]) -> Script:
    """The calls one by one, then "done"; on a tool-less step, a partial answer."""

    def script(i: int, seen: list[str], tools: bool) -> Any:
        if not tools:
            return f"partial: {len(seen)} results"
        return [calls[i]] if i < len(calls) else "done"

    return script


def stubborn(calls: list[tuple[str, dict[str, Any]]]) -> Script:
    """Calls tools even when none are offered (ignores the wrap-up)."""
    return lambda i, seen, tools: [calls[i]]
