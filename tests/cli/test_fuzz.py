"""Hostile input at ``tripwire replay`` and ``tripwire explain``: a clean error, never a traceback.

Bounded by hypothesis settings (``max_examples``, no deadline), not by timing anything.
"""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from tripwire.cli import app

runner = CliRunner(env={"NO_COLOR": "1"})

GOOD = json.dumps({"resourceSpans": [{"scopeSpans": [{"spans": [{
    "traceId": "0" * 31 + "1", "spanId": "0" * 15 + "1", "name": "execute_tool lookup",
    "startTimeUnixNano": "1700000000000000000", "endTimeUnixNano": "1700000000000000001",
    "attributes": [
        {"key": "gen_ai.operation.name", "value": {"stringValue": "execute_tool"}},
        {"key": "gen_ai.tool.name", "value": {"stringValue": "lookup"}},
    ],
}]}]}]})  # fmt: skip


def _deep(depth: int, kind: str) -> bytes:
    if kind == "list":
        return b"[" * depth + b"]" * depth
    if kind == "object":
        return b'{"a":' * depth + b"1" + b"}" * depth
    return (b'{"arrayValue":{"values":[' * depth) + b'{"intValue":"1"}' + b"]}}" * depth


huge_number = st.integers(min_value=300, max_value=6000).map(lambda n: b"9" * n)
deep_json = st.tuples(st.integers(1, 3000), st.sampled_from(["list", "object", "otlp"])).map(
    lambda t: _deep(*t)
)
# A valid request with one span field or attribute value swapped for something hostile.
field = st.sampled_from(["startTimeUnixNano", "endTimeUnixNano", "traceId", "spanId", "name"])
payload = st.one_of(huge_number, deep_json, st.binary(max_size=64),
                    st.sampled_from([b'"\\ud800"', b'"\xff"', b"-1", b"1e999", b"null", b"[]"]))
mutated = st.tuples(field, payload).map(
    lambda t: GOOD.encode().replace(json.dumps(json.loads(GOOD)["resourceSpans"][0]["scopeSpans"][0]["spans"][0][t[0]]).encode(), t[1], 1)
)
hostile = st.one_of(
    st.binary(max_size=2048),
    deep_json,
    huge_number,
    mutated,
    mutated.map(gzip.compress),
    st.binary(max_size=256).map(lambda b: b"\xef\xbb\xbf" + b),
)


def _clean(result: Any, codes: set[int]) -> None:
    assert result.exit_code in codes, result.output
    # An exit goes through SystemExit; anything else is a crash CliRunner caught.
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert "Traceback" not in result.output


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=hostile)
def test_replay_never_crashes(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        bad = Path(tmp) / "bad.json"
        bad.write_bytes(data)
        good = Path(tmp) / "good.json"
        good.write_text(GOOD)
        result = runner.invoke(app, ["replay", str(bad), str(good), "--json"])
        # 2: the bad file was reported; 0 only if the bytes happened to be valid OTLP.
        _clean(result, {0, 2})
        assert "0" * 31 + "1" in result.stdout  # the good file's trace is always kept


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.one_of(st.binary(max_size=1024), deep_json, huge_number,
                      huge_number.map(lambda n: b'{"run_id": "r", "counters": {"steps": ' + n + b"}}")))
def test_explain_never_crashes(data: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "receipt.json"
        path.write_bytes(data)
        result = runner.invoke(app, ["explain", str(path)])
        _clean(result, {2})
