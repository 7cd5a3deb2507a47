"""Assertions shared by the framework tests: what the mapping must extract from each script."""

from __future__ import annotations

from typing import Any

from tripwire.core.signature import signature_of

from .harness import DISTINCT_CALLS, INPUT_TOKENS, LOOP_ARGS, LOOP_CALLS, OUTPUT_TOKENS, Mapped


def check_loop(
    mapped: Mapped, *, args: Any = LOOP_ARGS, model_calls: int = LOOP_CALLS + 1, usage: bool = True
) -> None:
    """8 ``search_docs`` calls with one signature (not name-only); usage counted once per call.

    ``args`` is what the signature must equal: the arguments as a mapping, or the bare text an
    emitter recorded instead (OpenInference records a single string argument as text).
    """
    assert [c.tool for c in mapped.tools] == ["search_docs"] * LOOP_CALLS
    sigs = {signature_of(c.tool, c.arguments) for c in mapped.tools}
    assert len(sigs) == 1
    (sig,) = sigs
    assert not sig.name_only
    assert sig == signature_of("search_docs", args)
    assert len(mapped.trace_ids) == 1
    check_usage(mapped, model_calls=model_calls, usage=usage)


def check_distinct(
    mapped: Mapped, *, model_calls: int = DISTINCT_CALLS + 1, usage: bool = True
) -> None:
    """12 calls, alternating ``search_docs``/``fetch_page``, with 12 distinct signatures."""
    assert [c.tool for c in mapped.tools] == ["search_docs", "fetch_page"] * (DISTINCT_CALLS // 2)
    sigs = {signature_of(c.tool, c.arguments) for c in mapped.tools}
    assert len(sigs) == DISTINCT_CALLS
    assert not any(s.name_only for s in sigs)
    check_usage(mapped, model_calls=model_calls, usage=usage)


def check_usage(mapped: Mapped, *, model_calls: int, usage: bool = True) -> None:
    """One ModelCall per model call; tokens summed once (``usage=False``: the emitter has none)."""
    assert len(mapped.models) == model_calls
    expected_in = model_calls * INPUT_TOKENS if usage else 0
    expected_out = model_calls * OUTPUT_TOKENS if usage else 0
    assert sum(m.input_tokens for m in mapped.models) == expected_in
    assert sum(m.output_tokens for m in mapped.models) == expected_out
