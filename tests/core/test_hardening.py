"""Issue 16, the core's items: keyed digests, hostile keys, ranges and types, bounded caches."""

from __future__ import annotations

import pickle
import sys
from typing import Any

import pytest

from tripwire.core import signature as signature_module
from tripwire.core.events import ToolCall
from tripwire.core.policy import LoopPolicy, RetryPolicy
from tripwire.core.signature import DEFAULT_NORMALIZER, Normalizer, signature_of
from tripwire.detector import LoopDetector, LoopWatcher
from tripwire.errors import ConfigError

KEY = b"fleet-secret-0123456789abcdef"


# -- keyed digests ---------------------------------------------------------------------------------


def test_a_keyed_digest_differs_from_the_unkeyed_one_and_from_another_key() -> None:
    pin = {"pin": "123456"}
    unkeyed = signature_of("check_pin", pin)
    keyed = Normalizer(key=KEY).signature("check_pin", pin)
    other = Normalizer(key=b"another-secret-key-0000").signature("check_pin", pin)
    assert len({unkeyed.key, keyed.key, other.key}) == 3
    # Without the key, guessing the PIN and hashing it unkeyed finds nothing.
    guesses = {signature_of("check_pin", {"pin": f"{i:06d}"}).key for i in range(123_400, 123_500)}
    assert unkeyed.key in guesses and keyed.key not in guesses


def test_one_key_gives_the_same_signatures_in_every_process() -> None:
    a, b = Normalizer(key=KEY), Normalizer(key=bytearray(KEY))
    args = {"query": "refund policy", "request_id": 7}
    assert a.signature("search", args) == b.signature("search", '{"query": "refund policy"}')
    assert a.result_digest("done in 12 ms") == b.result_digest("done in 15 ms")  # durations masked
    assert a.tool_signature("search") == b.tool_signature("search")
    assert a.version == b.version
    assert pickle.loads(pickle.dumps(a)).signature("search", args) == a.signature("search", args)


def test_keyed_result_digests_and_name_only_keys_are_keyed_too() -> None:
    keyed = Normalizer(key=KEY)
    assert keyed.result_digest("123456") != DEFAULT_NORMALIZER.result_digest("123456")
    assert keyed.tool_signature("search") != DEFAULT_NORMALIZER.tool_signature("search")
    assert keyed.digest({"a": 1}) != DEFAULT_NORMALIZER.digest({"a": 1})


def test_the_version_says_keyed_but_never_shows_the_key() -> None:
    keyed = Normalizer(key=KEY)
    assert "+keyed." in keyed.version and "+keyed" not in DEFAULT_NORMALIZER.version
    assert Normalizer(key=b"another-secret-key-0000").version != keyed.version
    for text in (keyed.version, repr(keyed), str(keyed)):
        assert KEY.decode() not in text and KEY.hex() not in text


@pytest.mark.parametrize("key", [b"short", "a str key of enough length", 12345, b"x" * 65])
def test_a_bad_key_is_a_config_error_that_does_not_echo_it(key: Any) -> None:
    with pytest.raises(ConfigError) as info:
        Normalizer(key=key)
    assert info.value.field == "key"
    if isinstance(key, (str, bytes)) and len(key) > 6:
        assert str(key) not in str(info.value) and repr(key) not in str(info.value)


# -- hostile dict keys -------------------------------------------------------------------------------


class Unprintable:
    def __str__(self) -> str:
        raise RuntimeError("no str for you")

    def __hash__(self) -> int:
        return 1


def test_a_huge_integer_key_or_a_key_whose_str_raises_still_gets_a_signature() -> None:
    huge = 10**5000
    assert sys.get_int_max_str_digits() and len(str(10**10)) == 11  # the limit is in force
    one = signature_of("t", {huge: 1})
    assert one == signature_of("t", {huge: 1}) and one != signature_of("t", {huge + 1: 1})
    two = signature_of("t", {Unprintable(): 1})
    assert two.kind.value == "json" and two != one


# -- ranges and types ---------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("window", 10**9),
        ("window", 10**22),
        ("max_period", 10**6),
        ("min_repeats", 10**9),
        ("same_error", 10**12),
        ("same_result", 10**12),
        ("revisit", 10**12),
        ("revisit_memory", 10**9),
        ("confirm", 10**9),
        ("max_lease_renewals", 10**12),
        ("window", "10"),
        ("window", 10.0),
        ("threshold", None),
        ("revisit_share", float("nan")),
        ("polling_tools", 5),
        ("retry_per_tool", ["a"]),
    ],
)
def test_out_of_range_and_wrong_type_policy_values_are_refused_by_name(field: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        LoopPolicy(**{field: value})
    assert info.value.field == field


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_attempts", 10**12), ("interval_s", float("inf")), ("interval_s", float("nan")), ("backoff_rate", float("inf")), ("tolerance_s", 1e300), ("errors", 5)],
)
def test_out_of_range_retry_values_are_refused_by_name(field: str, value: Any) -> None:
    with pytest.raises(ConfigError) as info:
        RetryPolicy(**{field: value})
    assert info.value.field == f"RetryPolicy.{field}"


def test_the_largest_accepted_window_still_builds_a_state() -> None:
    policy = LoopPolicy(window=10_000, threshold=4)
    watcher = LoopWatcher(policy)
    assert watcher.call("t", {"a": 1}) is not None


@pytest.mark.parametrize(
    "call",
    [
        lambda: signature_of(5, {"a": 1}),  # type: ignore[arg-type]
        lambda: signature_of(None, {"a": 1}),  # type: ignore[arg-type]
        lambda: DEFAULT_NORMALIZER.tool_signature(b"t"),  # type: ignore[arg-type]
        lambda: Normalizer(volatile_keys=5),  # type: ignore[arg-type]
        lambda: Normalizer(volatile_keys="nonce"),  # type: ignore[arg-type]
        lambda: Normalizer(max_bytes="16"),  # type: ignore[arg-type]
        lambda: Normalizer(max_bytes=True),  # type: ignore[arg-type]
        lambda: LoopWatcher(policy="default"),  # type: ignore[arg-type]
        lambda: LoopWatcher(normalizer="n"),  # type: ignore[arg-type]
        lambda: LoopWatcher().observe({"tool": "t"}),  # type: ignore[arg-type]
        lambda: LoopWatcher().call(7, {"a": 1}),  # type: ignore[arg-type]
        lambda: LoopDetector(window="10"),  # type: ignore[arg-type]
        lambda: LoopDetector(key="args"),
        lambda: LoopDetector(normalizer=3),  # type: ignore[arg-type]
        lambda: LoopDetector().observe(None, {"a": 1}),  # type: ignore[arg-type]
        lambda: LoopPolicy.preset(3),  # type: ignore[arg-type]
    ],
)
def test_wrong_types_in_the_public_core_api_are_config_errors(call: Any) -> None:
    with pytest.raises(ConfigError):
        call()


# -- caches bounded in bytes --------------------------------------------------------------------------


def test_huge_tool_names_are_never_kept_by_the_module_caches() -> None:
    caches = [
        signature_module._JSON_SEEDS,
        signature_module._TEXT_SEEDS,
        signature_module._RAW_SEEDS,
        signature_module._ABSENT_SEEDS,
        signature_module._TOOL_KEYS,
    ]
    for i in range(20):
        name = f"{i}" + "t" * 1_000_000
        signature_of(name, {"a": 1})
        signature_of(name, '{"a": 1}')
        signature_of(name, "text")
        DEFAULT_NORMALIZER.tool_signature(name)
        LoopWatcher(LoopPolicy(key="tool")).observe(ToolCall(tool=name, arguments={"a": 1}))  # type: ignore[arg-type]
    for cache in caches:
        assert len(cache) <= signature_module._SEEDS_MAX
        assert all(len(name) <= signature_module._CACHED_NAME_MAX for name in cache)
    # The normalizer's own cache of argument texts is keyed by the tool name too.
    text_cache = DEFAULT_NORMALIZER._text_signatures
    assert all(len(tool) <= signature_module._CACHED_NAME_MAX for tool, _ in text_cache)


def test_the_argument_text_cache_is_bounded_in_bytes_for_non_ascii_text() -> None:
    """Texts of as many characters as the cache takes, but four bytes each (emoji), are not
    kept: the bound is on the string's storage, not on its length in characters."""
    normalizer = Normalizer()
    cache = normalizer._text_signatures
    limit = signature_module._CACHED_TEXT_MAX
    wide = '{"q": "' + "😀" * (limit - 20) + '"}'
    normalizer.signature("search_docs", wide)
    assert ("search_docs", wide) not in cache
    ascii_text = '{"q": "' + "x" * (limit - 20) + '"}'
    narrow = '{"q": "' + "é" * (limit // 4 - 20) + '"}'
    sig = normalizer.signature("search_docs", ascii_text)
    normalizer.signature("search_docs", narrow)
    assert ("search_docs", ascii_text) in cache and ("search_docs", narrow) in cache
    assert normalizer.signature("search_docs", wide) == normalizer._text_signature("search_docs", wide)
    assert normalizer.signature("search_docs", ascii_text) is sig
    kept = sum(sys.getsizeof(text) + sys.getsizeof(tool) for tool, text in cache)
    assert kept <= len(cache) * (limit + 1024 + 100)


def test_a_mapping_or_list_that_raises_while_read_still_gets_a_signature() -> None:
    # Never hurt the agent: a hostile container in the arguments signs as its type instead of
    # raising RuntimeError out of the detector.
    from collections.abc import Mapping

    class Exploding(dict):  # type: ignore[type-arg]
        def items(self) -> Any:
            raise RuntimeError("boom")

    class Unreadable(Mapping):  # type: ignore[type-arg]
        def __getitem__(self, key: Any) -> Any:
            raise KeyError(key)

        def __iter__(self) -> Any:
            raise RuntimeError("no iteration")

        def __len__(self) -> int:
            return 1

    class Jumpy(list):  # type: ignore[type-arg]
        def __iter__(self) -> Any:
            raise ValueError("nope")

    for hostile in (Exploding(a=1), {"q": Unreadable()}, {"q": Jumpy([1])}):
        first = signature_of("search", hostile)
        assert first == signature_of("search", hostile)  # defined, and the same each time
    assert signature_of("search", Exploding(a=1)) != signature_of("search", {"a": 1})
    detector = LoopDetector()
    for _ in range(3):
        detector.observe("search", Exploding(a=1))
    with pytest.raises(Exception) as caught:
        detector.observe("search", Exploding(a=1))
    assert type(caught.value).__name__ == "LoopDetected"  # the 4th identical call, as any other


def test_limits_refuse_numbers_past_a_float_and_unprintable_values_by_name() -> None:
    from tripwire.core.budget import Limits

    for value, shown in ((10**400, "<an int of 1329 bits>"), (-(10**5000), "<an int of 16610 bits>")):
        field = "max_cost_usd" if value > 0 else "max_steps"
        with pytest.raises(ConfigError) as caught:
            Limits(**{field: value})
        assert caught.value.field == field and shown in str(caught.value)

    class Opaque:
        def __repr__(self) -> str:
            raise RuntimeError("no repr")

    with pytest.raises(ConfigError) as caught:
        Limits(max_steps=Opaque())  # type: ignore[arg-type]
    assert "max_steps" in str(caught.value) and "Opaque" in str(caught.value)
