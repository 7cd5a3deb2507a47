"""Result digests: progress evidence that ignores numbers and volatile keys."""

from __future__ import annotations

from tripwire.core.signature import DEFAULT_NORMALIZER as N


def test_results_that_differ_only_in_numbers_are_the_same_result() -> None:
    a = N.result_digest("/bin/bash: line 16521: javac: command not found")
    b = N.result_digest("/bin/bash: line 36254: javac: command not found")
    assert a == b


def test_a_new_order_id_is_not_new_evidence() -> None:
    assert N.result_digest({"status": "created", "order": 1001}) == N.result_digest(
        {"order": 1002, "status": "created"}
    )


def test_results_that_differ_in_words_differ() -> None:
    assert N.result_digest("3 tests failed: test_refund") != N.result_digest(
        "3 tests failed: test_invoice"
    )


def test_volatile_keys_in_json_result_text_are_dropped() -> None:
    a = N.result_digest('{"hits": ["a"], "request_id": "r-abc"}')
    b = N.result_digest('{"request_id": "r-xyz", "hits": ["a"]}')
    assert a == b


def test_none_and_empty_are_distinct_from_text() -> None:
    assert N.result_digest(None) != N.result_digest("none")
    assert len(N.result_digest("x")) == 32
