"""Result digests: progress evidence that ignores volatile values and keys."""

from __future__ import annotations

from tripwire.core.signature import DEFAULT_NORMALIZER as N
from tripwire.core.signature import EMPTY_RESULT


def test_a_shells_command_counter_is_not_new_evidence() -> None:
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


def test_none_and_empty_results_are_the_one_empty_result() -> None:
    assert N.result_digest(None) == N.result_digest("") == N.result_digest("none") == EMPTY_RESULT
    assert N.result_digest("x") != EMPTY_RESULT
    assert len(N.result_digest("x")) == 32


def test_result_digests_are_kept_apart_from_argument_digests() -> None:
    assert N.result_digest("abc") != N.digest("abc")
    assert N.result_digest({"a": "x"}) != N.digest({"a": "x"})
    assert int(N.result_digest("abc"), 16) < 2**128


def test_volatile_keys_at_any_depth_of_json_result_text_are_dropped() -> None:
    a = N.result_digest('{"hits": [{"id": "a", "trace_id": "t1"}], "meta": {"nonce": "x"}}')
    b = N.result_digest('{"meta": {"nonce": "y"}, "hits": [{"trace_id": "t2", "id": "a"}]}')
    assert a == b
    assert a == N.result_digest({"hits": [{"id": "a"}], "meta": {"timestamp": 1}})


def test_result_text_above_the_cap_is_hashed_as_is_and_in_full() -> None:
    head = '{"request_id": "ra", "out": "'
    big = head + "x" * (1024 * 1024) + '"}'
    # Above the cap the text is not parsed: the volatile key counts, like any other text.
    assert N.result_digest(big) != N.result_digest(big.replace("ra", "rb"))
    assert N.result_digest(big) != N.result_digest(big[:-3] + 'y"}')
    assert N.result_digest(big) == N.result_digest(big.encode())
