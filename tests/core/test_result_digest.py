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


# -- volatile values in short results (n2r5) ------------------------------------------------

import pytest  # noqa: E402
from hypothesis import assume, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from tripwire.core import signature  # noqa: E402

VOLATILE_PAIRS = [
    # a hex id or UUID that starts with a letter, whatever its first group holds
    ("deploy queued as deadbeefcafe", "deploy queued as feedfacebeef"),
    ("job abcdefab-1234-4abc-8def-0123456789ab queued", "job fedcbaab-9876-4abc-8def-0123456789ab queued"),
    ("job abcdefab-cdef-abcd-efab-cdefabcdefab queued", "job bcdefabc-fedc-abcd-efab-cdefabcdefab queued"),
    ("job ABCDEFAB-CDEF-ABCD-EFAB-CDEFABCDEFAB queued", "job BCDEFABC-CDEF-ABCD-EFAB-CDEFABCDEFAB queued"),
    ("lock deadbeef-12ab held", "lock cafebabe-34cd held"),
    # timestamps in other formats
    ("at 01/12/2026 10:00", "at 02/12/2026 11:30"),
    ("at 2026/12/01 10:00:00", "at 2026/12/02 10:00:01"),
    ("wrote run_2026-12-01_10-00-00.log", "wrote run_2026-12-01_10-00-07.log"),
    ("at Tue Dec  1 10:00:03 UTC 2026", "at Tue Dec  1 10:00:04 UTC 2026"),
    # durations
    ("took 1m23s", "took 2m5s"),
    ("took 1h2m3s", "took 1h2m4s"),
    # request ids and other fresh tokens
    ("accepted req_8fK2mZpQ1xL9", "accepted req_Zx81Lm2PQa7c"),
    ("declined (request id: 7f3a-91bc)", "declined (request id: 1c2e-4a0f)"),
    ("X-Request-Id: a1b2c3d4", "X-Request-Id: e5f6a7b8"),
    ('{"error": "busy", "detail": "trace_id=4bf92f35"}', '{"error": "busy", "detail": "trace_id=00f067aa"}'),
    ("object at 0x7f3a2b1c4d50", "object at 0x7f3a2b1c9e60"),
    ("wrote /tmp/tmpab3k9x_q/out.txt", "wrote /tmp/tmpzz81qq_w/out.txt"),
]


@pytest.mark.parametrize(("a", "b"), VOLATILE_PAIRS)
def test_a_volatile_value_is_not_new_evidence(a: str, b: str) -> None:
    assert N.result_digest(a) == N.result_digest(b)
    assert N.result_digest(a) != N.result_digest(a.split()[0] + " something else")


NEWS_PAIRS = [
    ("numpy 1.26.4 installed", "numpy 1.26.5 installed"),
    ("Step 1/3", "Step 2/3"),
    ("12/20 passed", "13/20 passed"),
    ("a.py:12: error", "a.py:13: error"),
    ("exit code 1", "exit code 2"),
    ("user_id: 42", "user_id: 43"),
    ("status: accepted", "status: deceased"),  # words made of hex letters
    ("defaced", "effaced"),
    ("Encoding base64Encoder3x", "Encoding base64Decoder3x"),
    ("flag 0x7fa", "flag 0x7fb"),  # a short hex constant is a value, not an address
]


@pytest.mark.parametrize(("a", "b"), NEWS_PAIRS)
def test_a_small_number_or_word_that_changed_is_news(a: str, b: str) -> None:
    assert N.result_digest(a) != N.result_digest(b)


_PIECES = st.one_of(
    st.sampled_from(
        ["deadbeefcafe", "abcdefab", "-1234", "-cdef", "request_id", "Trace-Id", ": ", "=", '"',
         "tmp", "ab3k9x_q", "8fK2mZpQ1xL9", "0x7f3a2b1c", "2026-12-01", "12:03", " ", "-", "_"]
    ),
    st.text(alphabet="abcdefxyzABCDEFQZ0123456789-_:=/. ", max_size=6),
)


@settings(max_examples=600, deadline=None)
@given(st.lists(_PIECES, max_size=8).map("".join))
@example("lock abcdefab-1234 held")  # no letter before a digit: 8 hex letters say it may match
@example("wrote /tmp/tmpqzxkywvu/a")  # a temporary name without a digit
@example("Trace-Id: 12")  # an id key in upper case
@example("rejected, request id=77")
def test_the_cheap_scans_never_skip_a_volatile_word(text: str) -> None:
    # The digest skips the regex of words when a few byte scans say no word can match; the full
    # regex must then find nothing that the digit-only one does not.
    raw = text.encode()
    full = signature._VOLATILE_TEXT_RE.sub(b"\x00v", raw)
    digits = any(c.isdigit() for c in text)
    if not signature._may_hold_words(raw, digits):
        assert full == signature._VOLATILE_DIGITS_RE.sub(b"\x00v", raw)
    if not digits:
        assert full == signature._VOLATILE_WORDS_RE.sub(b"\x00v", raw)


_EMPTY_PIECES = st.one_of(
    st.sampled_from(
        ["no", "No", "NO", "not", "found", "Found", "FOUND", "foUnd", "nothing", "was", "0", "zero",
         "Zero", "ze", "results", "match", "matches", "hits", "rows", "files", " ", "\t", "\n",
         "\x0b", ".", "!", "ound", "[", "]", "{}", "null", "none", "''", "x", "Not Found!"]
    ),
    st.text(alphabet="abfnotuxzNOF0 .!\t", max_size=5),
)


@settings(max_examples=1500, deadline=None)
@given(st.lists(_EMPTY_PIECES, max_size=9).map("".join))
@example("0\tmatches found")  # a zero not followed by a space
@example("Found 3 results")
@example("Not Found!")
@example("x not FOUND")  # no lower-case "ound": never a found-nothing message
def test_the_cheap_test_before_the_found_nothing_regex_skips_no_match(text: str) -> None:
    # The regex decides, and it only runs where the cheap test said it might match: the cheap
    # test must keep every text the regex and the test's first form (any lower-case "ound",
    # a short value, or a known start) let through.
    bare = text.encode().strip()
    assume(bare[:1] not in (b"{", b"[", b'"'))  # JSON is canonicalized first
    first_form = len(bare) <= 4 or b"ound" in bare or bare[:2].lower() in (b"no", b"0 ", b"ze")
    expected = first_form and signature._EMPTY_RE.match(bare) is not None
    assert (N.result_digest(text) == EMPTY_RESULT) is expected
