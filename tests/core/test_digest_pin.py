"""Pinned digests: a fixed set of arguments and results with their exact digests.

The rule: any change to what the normalizer computes (canonical arguments, result digests, the
hash, the seeds) must bump :attr:`Normalizer.version` (``NORMALIZER_SCHEME`` in
``core/signature.py``), because a changed signature looks like a run that suddenly stopped
repeating. This test fails on any such change; update the digests below only together with the
version it pins, never alone. The values were recorded with the normalizer of version
``n2r3+vk.e84487b5+cap.16384`` before the compiled canonical walk existed, and the whole suite
runs with and without the accelerator, so both implementations are held to them.
"""

from __future__ import annotations

from typing import Any

import pytest

from tripwire.core.signature import DEFAULT_NORMALIZER, signature_of

VERSION = "n3r5+vk.e84487b5+cap.16384"


class _Label(str):
    """A ``str`` subclass (n3: signs as its text)."""


class _Ratio(float):
    """A ``float`` subclass, as ``numpy.float64`` is (n3: signs as its number)."""


ARGUMENTS: list[tuple[str, Any, str, str]] = [
    ("search_docs", {"query": "refund policy"}, "json", "a39984e14262a6802dc4a7a6f82beea2"),
    ("search_docs", '{"query": "refund policy"}', "json", "a39984e14262a6802dc4a7a6f82beea2"),
    (
        "search_docs",
        {"query": "refund policy", "request_id": "r-17", "limit": 10},
        "json",
        "163e29ea7db6f7c483d2da491e765774",
    ),
    (
        "search_docs",
        '{"limit": 10.0, "query": "refund policy", "nonce": 5}',
        "json",
        "163e29ea7db6f7c483d2da491e765774",
    ),
    (
        "run_query",
        {"sql": "select 1", "params": [1, 2.5, None, True], "meta": {"timestamp": 1}},
        "json",
        "b52c0858597381815a51d9aecf5dea5f",
    ),
    ("bash", {"command": "python reproduce.py"}, "json", "288f20dd4553093a55a4faf18695c37e"),
    ("bash", "ls -la", "text", "7fa65e7c84e29468968f753f1cb9b248"),
    ("read_page", None, "absent", "e8bc61faffab05b981f8ee2fa25d11bb"),
    ("big", {"n": 2**70}, "json", "d0d36f0976a0397d6f15d5e82baee6e9"),
    ("é", [1, "two", {"three": 3}], "json", "10d3207b03d46a21b64aaa2d706bfb77"),
    # n3: subclasses sign as the plain values (n2 wrote them through the stdlib's JSON); the
    # same digest as '{"label": "a", "threshold": 0.25}'.
    ("compute", {"threshold": _Ratio(0.25), "label": _Label("a")}, "json", "237a70bf3ce243bbca567b49c30a703d"),
    ("compute", '{"label": "a", "threshold": 0.25}', "json", "237a70bf3ce243bbca567b49c30a703d"),
]

RESULTS: list[tuple[Any, str]] = [
    # n2r4: a short result keeps its small numbers (they are the news), masking only ids, times
    # and durations; a long one still loses every digit; "found nothing" is one digest.
    ("Found 3 documents", "cc52e2030123e1168b72b1c15820252c"),
    ("Found 4 documents", "f835c5b16ffb4ef0f5a122ce07979902"),
    ('{"status": "ok", "request_id": 99}', "cb984edc4c7f3114159c855e468fc956"),
    ({"rows": [1, 2], "timestamp": 5}, "2227e7c954f6268c320f60c2e4ff0b4a"),
    (None, "bfc3bb240a7a93b05b3d7a47d0ffc391"),
    ("x" * 739, "e8a9057a08cd579385c9163ea999c495"),
    # n2r5: hex ids that start with a letter, compound durations and request ids written out
    # are masked too (these three digested differently under n2r4); the six above are unchanged.
    ("job abcdefab-1234-4abc-8def-0123456789ab queued", "670dad651dc9ba548b6770bb2b389ae1"),
    ("suite failed after 1m23s", "5bf62ace4f9027be6c031c838a642326"),
    ("declined (request id: 7f3a-91bc)", "1c8cb8abec6b5952a00b2e99b42d825e"),
]


def test_the_version_is_the_one_these_digests_belong_to() -> None:
    assert DEFAULT_NORMALIZER.version == VERSION


@pytest.mark.parametrize(("tool", "arguments", "kind", "digest"), ARGUMENTS)
def test_argument_digests_are_pinned(tool: str, arguments: Any, kind: str, digest: str) -> None:
    sig = signature_of(tool, arguments)
    assert (sig.kind.value, sig.digest) == (kind, digest)


@pytest.mark.parametrize(("result", "digest"), RESULTS)
def test_result_digests_are_pinned(result: Any, digest: str) -> None:
    assert DEFAULT_NORMALIZER.result_digest(result) == digest


def test_the_name_only_key_is_pinned() -> None:
    assert DEFAULT_NORMALIZER.tool_signature("search_docs").digest == "16ed588c6f748af4455e503587c5939c"
