"""The mask of a short result's volatile values against its reference, ``_VOLATILE_TEXT_RE.sub``:
the compiled leaf (``tripwire/core/_resultmask.c``) and the Python twin (the prefiltered subs of
``tripwire/core/signature.py``), on hand-written cases, random bytes, text made of the patterns'
own pieces, and every result of the labelled corpus when it is at hand; and the leaf's digit
deletion for long results against ``bytes.translate``.

The compiled side skips, loudly, under ``TRIPWIRE_NO_EXTENSIONS=1`` or when it was not built
(under ``CI=true`` it must be built); the twin's tests run either way. The corpus is not in the
repository: ``TRIPWIRE_CORPUS`` names it (default ``../shared/corpus`` next to the repository),
and its test skips when it is absent.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corpus_files import corpus_files
from tripwire.core import signature as signature_module
from tripwire.core.signature import DEFAULT_NORMALIZER, Normalizer

try:
    from tripwire.core import _resultmask
except ImportError:  # pragma: no cover - depends on the build
    _resultmask = None  # type: ignore[assignment]

if os.environ.get("TRIPWIRE_NO_EXTENSIONS", "").strip() not in ("", "0"):
    _NOT_COMPILED = (
        "SKIPPED LOUDLY: TRIPWIRE_NO_EXTENSIONS is set, so the compiled mask is not in use; only "
        "the Python twin was tested"
    )
elif _resultmask is None:
    if os.environ.get("CI", "").lower() == "true":
        raise RuntimeError(
            "tripwire.core._resultmask was not built: the install must compile "
            "src/tripwire/core/_resultmask.c (is a C compiler missing?)"
        )
    _NOT_COMPILED = (
        "SKIPPED LOUDLY: the compiled mask tripwire.core._resultmask is not built (pip install -e . "
        "needs a C compiler); only the Python twin was tested"
    )
else:
    _NOT_COMPILED = ""

compiled = pytest.mark.skipif(bool(_NOT_COMPILED), reason=_NOT_COMPILED)

TOKEN = b"\x00v"


def reference(payload: bytes) -> bytes:
    return signature_module._VOLATILE_TEXT_RE.sub(TOKEN, payload)


def twin(payload: bytes) -> bytes:
    return signature_module._mask_volatile(payload)


def leaf(payload: bytes) -> bytes | None:
    assert _resultmask is not None
    return _resultmask.mask(payload)


# -- hand-written cases: the expected text is worked out from the patterns, not from the code ----

CASES = [
    # a shell's command counter, with digits after the first and without
    (b"bash: line 32619: cd: x", b"bash: line " + TOKEN + b": cd: x"),
    (b"sh: line 7: x", b"sh: line " + TOKEN + b": x"),
    (b"sh: line 7 x", b"sh: line 7 x"),
    # ISO dates and times, and the date-time of a file name (an underscore is no word byte here)
    (b"at 2026-12-01T10:00:00Z ok", b"at " + TOKEN + b" ok"),
    (b"at 2026-12-01 10:00:00.123+02:00.", b"at " + TOKEN + b"."),
    (b"at 2026-12-01 10:00+0200", b"at " + TOKEN),
    (b"at 2026-12-01 10:00+02:0x", b"at " + TOKEN + b"+02:0x"),
    (b"run_2026-12-01_10-00-00.log", b"run_" + TOKEN + b".log"),
    (b"x2026-12-01", b"x2026-12-01"),
    # dates with slashes
    (b"on 12/25/2026.", b"on " + TOKEN + b"."),
    (b"on 2026/1/5 at", b"on " + TOKEN + b" at"),
    (b"path a/12/25/2026", b"path a/12/25/" + TOKEN),  # no date after a slash; a 4-digit number
    # clock times
    (b"took until 9:05:33 today", b"took until " + TOKEN + b" today"),
    (b"at 12:30:01,5 sharp", b"at " + TOKEN + b" sharp"),
    (b"ratio 1:2", b"ratio 1:2"),
    # a UUID that starts with a digit, a hex id, a memory address
    (b"id 123e4567-e89b-12d3-a456-426614174000 x", b"id " + TOKEN + b" x"),
    (b"commit 3f9a2b1c0d", b"commit " + TOKEN),
    (b"commit 3f9a2b1c0d-1234-99", b"commit 3f9a2b1c0d-" + TOKEN + b"-99"),  # a short last group
    (b"at 0x7f3a2b1c4d50>", b"at " + TOKEN + b">"),
    (b"at 0x7f3a2>", b"at 0x7f3a2>"),
    # numbers of 4+ digits, with a fraction, and the numbers that stay
    (b"order 48213 shipped, 12 left", b"order " + TOKEN + b" shipped, 12 left"),
    (b"epoch 1764669600.25!", b"epoch " + TOKEN + b"!"),
    (b"page 3 of 12, line 3, 45% done", b"page 3 of 12, line 3, 45% done"),
    (b"v1.2025", b"v1.2025"),
    # durations: units, the space, the lookahead that sends the engine on (s, then secs), µs
    (b"done in 0.53s", b"done in " + TOKEN),
    (b"took 12 ms.", b"took " + TOKEN + b"."),
    (b"5 secs", TOKEN),
    (b"5 sex", b"5 sex"),
    ("3µs".encode(), TOKEN),
    (b"elapsed 1m23s", b"elapsed " + TOKEN),
    (b"2h5m left", TOKEN + b" left"),
    (b"2h5m3x", b"2h5m3x"),
    # random tokens that start with a digit: 15+ letters and digits, or 9+ mixing the cases
    (b"key 1abc2def3ghi4jkl5", b"key " + TOKEN),
    (b"ref 7aB3cD9efg", b"ref " + TOKEN),
    (b"ref 7ab3cdpqrs", b"ref 7ab3cdpqrs"),
    # words: a UUID, hex ids with and without digits, a random token
    (b"uuid abcdefab-abcd-abcd-abcd-abcdefabcdef.", b"uuid " + TOKEN + b"."),
    (b"deadbeefcafe", TOKEN),
    (b"deadbeefcaf", b"deadbeefcaf"),
    (b"id deadbeef-12ab ok", b"id " + TOKEN + b" ok"),
    (b"x_deadbeefcafe", b"x_" + TOKEN),
    (b"token reqK8fK2mZpQ1xL9 x", b"token " + TOKEN + b" x"),
    # request ids written out, in any case, and temporary file names
    (b'headers: {"X-Request-ID": "abc-123"}', b'headers: {"' + TOKEN + b'"}'),
    (b"trace_id=7f3a ok", TOKEN + b" ok"),
    (b"myrequest_id: 5", b"myrequest_id: 5"),
    (b"/tmp/tmpab12cd_3/x", b"/tmp/" + TOKEN + b"/x"),
    (b"/tmp/tmpab12cd_3x", b"/tmp/tmpab12cd_3x"),
]


@pytest.mark.parametrize(("payload", "expected"), CASES)
def test_the_reference_masks_what_the_patterns_say(payload: bytes, expected: bytes) -> None:
    assert reference(payload) == expected


@pytest.mark.parametrize(("payload", "expected"), CASES)
def test_the_twin_masks_what_the_patterns_say(payload: bytes, expected: bytes) -> None:
    assert twin(payload) == expected


@compiled
@pytest.mark.parametrize(("payload", "expected"), CASES)
def test_the_leaf_masks_what_the_patterns_say(payload: bytes, expected: bytes) -> None:
    assert leaf(payload) == expected


# -- differential: random bytes, and text made of the patterns' own pieces -------------------------

PIECES = [
    *"0123456789",
    *"0123456789",
    *"abcdefABCDEF",
    *"-:/._ x,TZ+",
    *"gqQ\t'\"=",
    "ms", "s", "sec", "secs", "seconds", "min", "minutes", "h", "hrs", "hours", "ns", "us", "µs",
    "m", "sh: line ", "request_id: ", "x-trace-id=", "Span ID", "correlation-id", "REQ_ID\"", "id",
    "tmp", "deadbeef", "abcdef" * 2, "7" * 6, "0x", "2026-12-01", "T10:00", ":00", "Kq",
    "9f8e7d6c5b4a3c2d1e0f", "aB3cD9efg", "12/", "/25/", "/2026", "1m", "h5m", "23s", ".5", "0x7f3a2b",
    "tmpab12cd_3", "e4567-", "-abcd", "-e89b-12d3", "-426614174000", "abcdefab-", "1h", "m5", "_",
    "12/25/2026", "1/5/26", "2026/1/5", "123e4567-e89b-12d3-a456-426614174000", "abcdefab-abcd-abcd-abcd-abcdef012345",
]
SEPARATORS = ["", "", "", " ", " ", "/", ":", "-", ".", "\n"]
"""Between pieces: often none, so that runs of letters and digits grow long, often a space, so
that they stay short enough for the dates, times and UUIDs."""
pieces_text = st.lists(st.tuples(st.sampled_from(PIECES), st.sampled_from(SEPARATORS)), max_size=50).map(
    lambda parts: "".join(piece + sep for piece, sep in parts).encode()
)
random_bytes = st.binary(max_size=300)


@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=pieces_text)
def test_the_twin_agrees_with_the_reference_on_pattern_pieces(payload: bytes) -> None:
    assert twin(payload) == reference(payload)


@settings(max_examples=1000, deadline=None)
@given(payload=random_bytes)
def test_the_twin_agrees_with_the_reference_on_random_bytes(payload: bytes) -> None:
    assert twin(payload) == reference(payload)


@compiled
@settings(max_examples=3000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(payload=pieces_text)
def test_the_leaf_agrees_with_the_reference_on_pattern_pieces(payload: bytes) -> None:
    assert leaf(payload) == reference(payload)


@compiled
@settings(max_examples=2000, deadline=None)
@given(payload=random_bytes)
def test_the_leaf_agrees_with_the_reference_on_random_bytes(payload: bytes) -> None:
    assert leaf(payload) == reference(payload)


@compiled
def test_the_leaf_declines_long_payloads_and_refuses_other_types() -> None:
    assert leaf(b"1234 " * 819) == reference(b"1234 " * 819)  # 4095 bytes
    assert leaf(b"x" * 4097) is None
    with pytest.raises(TypeError, match="bytes"):
        _resultmask.mask("1234")  # type: ignore[arg-type,union-attr]


@compiled
def test_result_digests_do_not_depend_on_the_leaf(monkeypatch: pytest.MonkeyPatch) -> None:
    samples = [case for case, _ in CASES] + [b"  " + case for case, _ in CASES] + [b"No matches found", b""]
    samples += [case * 20 for case, _ in CASES]  # long: their digits go
    keyed = Normalizer(key=b"k" * 16)
    with_leaf = [(DEFAULT_NORMALIZER.result_digest(s), keyed.result_digest(s)) for s in samples]
    texts = [s.decode("utf-8", "surrogateescape") for s in samples] + ["No results.", '{"a": 1}', "x" * 300]
    text_digests = [(Normalizer().result_digest(t), Normalizer(key=b"k" * 16).result_digest(t)) for t in texts]
    monkeypatch.setattr(signature_module, "_mask", None)
    monkeypatch.setattr(signature_module, "_strip_digits", None)
    monkeypatch.setattr(signature_module, "_prepare", None)
    assert [(DEFAULT_NORMALIZER.result_digest(s), keyed.result_digest(s)) for s in samples] == with_leaf
    assert [(Normalizer().result_digest(t), Normalizer(key=b"k" * 16).result_digest(t)) for t in texts] == text_digests


# -- prepare: the compiled common path of a result text's digest ------------------------------------

EMPTYISH = [
    "No results.", "no matches found", "NO RESULTS", "0 items", "0 rows returned", "zero records", "Zero hits",
    "Not found.", "not found!!", "File not found", "nothing found", "FOUND", "found it", "Found 3 results",
    "0", "00 ound", "none", "null", "[]", "{}", '""', "''", "n", "no", "ok", "done", "nope, ound later",
    '{"status": "ok"}', "[1, 2]", '"quoted"', "{not json", "x" * 150, "y" * 170, "z1" * 120,
]
result_texts = st.tuples(
    st.sampled_from(["", "", " ", "\t\n", "\x0b", "\x0c "]),
    st.one_of(
        st.sampled_from(EMPTYISH),
        pieces_text.map(lambda b: b.decode("utf-8", "surrogateescape")),
        st.text(max_size=260),
        st.text(alphabet=st.characters(min_codepoint=0xD7F0, max_codepoint=0xE010), max_size=8),
    ),
    st.sampled_from(["", "", ".", "!", "!.", " ", "\n", "  \t"]),
).map("".join)


def _python_path(normalizer: Normalizer, text: str) -> str:
    return normalizer._result_digest(text)


@compiled
@settings(max_examples=4000, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(text=result_texts)
def test_prepare_hashes_what_the_python_path_hashes_or_leaves_the_text_to_it(text: str) -> None:
    assert _resultmask is not None
    for normalizer in (DEFAULT_NORMALIZER, Normalizer(max_bytes=64)):
        prepared = _resultmask.prepare(text, normalizer.max_bytes)
        expected = _python_path(normalizer, text)
        if prepared is not None:
            assert normalizer._result_hash(prepared) == expected, (text, prepared)
        assert Normalizer(max_bytes=normalizer.max_bytes).result_digest(text) == expected


@compiled
def test_prepare_takes_plain_text_and_leaves_what_may_say_found_nothing_or_hold_json() -> None:
    assert _resultmask is not None
    prepare = _resultmask.prepare
    for taken in ("page about refund policy " * 4, "Found 3 results in 0.53s", "x" * 739, "  done.",
                  "sh: line 7: x", "résumé 2026-12-01T10:00:00Z"):
        assert prepare(taken, 4096) is not None, taken
    for left in ("No results.", "  no matches found\n", "0 rows", "Not found.", "File not found!", "[]",
                 '{"request_id": "x"}', ' ["a"]', '"s"', "abc", "\ud800 lone"):
        assert prepare(left, 4096) is None, left
    assert prepare('{"k": "' + "v" * 100 + '"}', 64) is not None  # above max_bytes: never parsed
    # At the lengths where the path changes (the found-nothing test up to 160 bytes, the mask up
    # to 200, digits stripped above), in ASCII and in two-byte characters.
    for unit in ("a1 ", "é1 ", "0 items found "):
        for n in range(150, 215):
            text = (unit * 100)[:n]
            expected = _python_path(DEFAULT_NORMALIZER, text)
            prepared = prepare(text, 4096)
            if prepared is not None:
                assert DEFAULT_NORMALIZER._result_hash(prepared) == expected, (unit, n)
    with pytest.raises(TypeError):
        prepare(b"bytes", 4096)  # type: ignore[arg-type]


# -- strip_digits: the digits a long result loses ---------------------------------------------------


@compiled
@settings(max_examples=2000, deadline=None)
@given(payload=random_bytes | pieces_text | st.binary(min_size=200, max_size=5000))
def test_strip_digits_is_translate(payload: bytes) -> None:
    assert _resultmask is not None
    assert _resultmask.strip_digits(payload) == payload.translate(None, b"0123456789")


@compiled
def test_strip_digits_by_hand() -> None:
    assert _resultmask is not None
    assert _resultmask.strip_digits(b"") == b""
    assert _resultmask.strip_digits(b"0123456789") == b""
    assert _resultmask.strip_digits(b"line 12 of 3400: /:x") == b"line  of : /:x"
    assert _resultmask.strip_digits("é٣".encode()) == "é٣".encode()  # ASCII digits only
    every_byte = bytes(range(256))
    kept = bytes(range(48)) + bytes(range(58, 256))
    for offset in range(9):  # each byte at each place of an eight-byte word, and in the tail
        assert _resultmask.strip_digits(b"x" * offset + every_byte) == b"x" * offset + kept
    with pytest.raises(TypeError, match="bytes"):
        _resultmask.strip_digits(bytearray(b"1"))  # type: ignore[arg-type]


# -- the corpus: every result text -------------------------------------------------------------------


def corpus_results() -> list[bytes]:
    results = []
    for path in corpus_files():
        data: Any = json.loads(path.read_text())
        for rs in data.get("resourceSpans", []):
            for ss in rs.get("scopeSpans", []):
                for span in ss.get("spans", []):
                    for a in span.get("attributes", []):
                        if a["key"] == "gen_ai.tool.call.result" and "stringValue" in a["value"]:
                            results.append(a["value"]["stringValue"].encode("utf-8", "surrogatepass"))
    assert results
    return results


def test_the_twin_and_the_leaf_agree_with_the_reference_on_the_corpus() -> None:
    results = corpus_results()
    for payload in results:
        expected = reference(payload)
        assert twin(payload) == expected, payload[:200]
        if not _NOT_COMPILED:
            got = leaf(payload)
            assert got == expected or (got is None and len(payload) > 4096), payload[:200]
            assert _resultmask.strip_digits(payload) == payload.translate(None, b"0123456789")


@compiled
def test_prepare_hashes_what_the_python_path_hashes_for_every_result_of_the_corpus() -> None:
    assert _resultmask is not None
    taken = 0
    for raw in corpus_results():
        text = raw.decode("utf-8", "surrogatepass")
        prepared = _resultmask.prepare(text, DEFAULT_NORMALIZER.max_bytes)
        if prepared is not None:
            taken += 1
            assert DEFAULT_NORMALIZER._result_hash(prepared) == _python_path(DEFAULT_NORMALIZER, text), text[:80]
    assert taken > 0
