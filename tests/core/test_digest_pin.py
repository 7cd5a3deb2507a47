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

VERSION = "n2r3+vk.e84487b5+cap.16384"

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
]

RESULTS: list[tuple[Any, str]] = [
    ("Found 3 documents", "c27bab765491195871e3c87e07fbd924"),
    ("Found 4 documents", "c27bab765491195871e3c87e07fbd924"),  # digits are not evidence
    ('{"status": "ok", "request_id": 99}', "cb984edc4c7f3114159c855e468fc956"),
    ({"rows": [1, 2], "timestamp": 5}, "8c5a3f8370d9f3a74d878c0386af9992"),
    (None, "2b2c981bca977f18b049805f5e27daa0"),
    ("x" * 739, "e8a9057a08cd579385c9163ea999c495"),
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
