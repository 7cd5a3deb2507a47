"""tripwire.otel.instrument(): attach to a provider, configure by keyword and environment."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from typing import Any

import pytest
from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import tripwire.otel as tw
from tripwire.core.policy import SEED_POLICY, KeyMode
from tripwire.errors import ConfigError


@pytest.fixture
def provider() -> Iterator[TracerProvider]:
    p = TracerProvider()
    yield p
    p.shutdown()


def loop(provider: TracerProvider, n: int = 4) -> None:
    tracer = provider.get_tracer("app")
    with tracer.start_as_current_span("invoke_agent a", attributes={"gen_ai.operation.name": "invoke_agent"}):
        for i in range(n):
            with tracer.start_as_current_span(
                "execute_tool search_docs",
                attributes={
                    "gen_ai.operation.name": "execute_tool",
                    "gen_ai.tool.name": "search_docs",
                    "gen_ai.tool.call.arguments": json.dumps({"query": "q"}),
                    "gen_ai.tool.call.id": f"c{i}",
                },
            ):
                pass


def test_defaults_attach_and_report_verdict_spans(provider: TracerProvider) -> None:
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    processor = tw.instrument(provider=provider, env={}, flags=tw.KillFlags())
    assert processor.policy.window == 10 and processor.policy.threshold == 4
    assert processor.max_traces == tw.DEFAULT_MAX_TRACES
    loop(provider)
    assert processor.stats.flags_raised == 1
    assert [s.name for s in exporter.get_finished_spans()].count("tripwire.verdict") == 1


def test_inner_processor_gets_annotated_spans(provider: TracerProvider) -> None:
    exporter = InMemorySpanExporter()
    processor = tw.instrument(
        provider=provider, inner=SimpleSpanProcessor(exporter), env={}, flags=tw.KillFlags()
    )
    loop(provider)
    assert processor.inner is not None
    flagged = [s for s in exporter.get_finished_spans() if "tripwire.verdict" in (s.attributes or {})]
    assert len(flagged) == 1 and flagged[0].name == "execute_tool search_docs"


def test_environment_variables_configure_the_policy(provider: TracerProvider) -> None:
    env = {
        "TRIPWIRE_PRESET": "seed",
        "TRIPWIRE_WINDOW": "6",
        "TRIPWIRE_THRESHOLD": "3",
        "TRIPWIRE_KEY": "tool",
        "TRIPWIRE_MIN_REPEATS": "4",
        "TRIPWIRE_MAX_PERIOD": "off",
        "TRIPWIRE_MAX_TRACES": "50",
        "TRIPWIRE_IDLE_TTL_S": "30",
    }
    p = tw.instrument(provider=provider, env=env, flags=tw.KillFlags())
    assert (p.policy.name, p.policy.window, p.policy.threshold) == ("seed", 6, 3)
    assert p.policy.key is KeyMode.TOOL and p.policy.max_period is None
    assert p.policy.min_repeats == 4
    assert (p.max_traces, p.idle_ttl_s) == (50, 30.0)


def test_keywords_win_over_environment(provider: TracerProvider) -> None:
    env = {"TRIPWIRE_WINDOW": "6", "TRIPWIRE_THRESHOLD": "5", "TRIPWIRE_MAX_TRACES": "50"}
    p = tw.instrument(provider=provider, env=env, threshold=3, max_traces=7, flags=tw.KillFlags())
    assert (p.policy.window, p.policy.threshold, p.max_traces) == (6, 3, 7)
    other = TracerProvider()
    assert tw.instrument(provider=other, env={}, policy=SEED_POLICY).policy is SEED_POLICY


@pytest.mark.parametrize(
    ("env", "var"),
    [
        ({"TRIPWIRE_WINDOW": "ten"}, "TRIPWIRE_WINDOW"),
        ({"TRIPWIRE_WINDOW": "0"}, "TRIPWIRE_WINDOW"),
        ({"TRIPWIRE_THRESHOLD": "40"}, "TRIPWIRE_THRESHOLD"),
        ({"TRIPWIRE_THRESHOLD": "1.5"}, "TRIPWIRE_THRESHOLD"),
        ({"TRIPWIRE_KEY": "args"}, "TRIPWIRE_KEY"),
        ({"TRIPWIRE_MAX_PERIOD": "1"}, "TRIPWIRE_MAX_PERIOD"),
        ({"TRIPWIRE_MAX_PERIOD": "x"}, "TRIPWIRE_MAX_PERIOD"),
        ({"TRIPWIRE_MIN_REPEATS": "-2"}, "TRIPWIRE_MIN_REPEATS"),
        ({"TRIPWIRE_PRESET": "paranoid"}, "TRIPWIRE_PRESET"),
        ({"TRIPWIRE_POLICY": "seed"}, "TRIPWIRE_POLICY"),  # a preset name where a file goes
        ({"TRIPWIRE_POLICY": "/no/such/tripwire.toml"}, "TRIPWIRE_POLICY"),
        ({"TRIPWIRE_CONFIG": "/no/such/tripwire.toml"}, "TRIPWIRE_CONFIG"),
        ({"TRIPWIRE_WINDOW": "1" + "0" * 22}, "TRIPWIRE_WINDOW"),  # accepted, then broke the watcher
        ({"TRIPWIRE_MAX_PERIOD": str(2**40)}, "TRIPWIRE_MAX_PERIOD"),
        ({"TRIPWIRE_WINDOW": "1_000"}, "TRIPWIRE_WINDOW"),
        ({"TRIPWIRE_IDLE_TTL_S": "inf"}, "TRIPWIRE_IDLE_TTL_S"),
        ({"TRIPWIRE_TOOL_TIMEOUT_S": "1e10"}, "TRIPWIRE_TOOL_TIMEOUT_S"),
        ({"TRIPWIRE_DIGEST_KEY": "123456"}, "TRIPWIRE_DIGEST_KEY"),
        ({"TRIPWIRE_MAX_TRACES": "0"}, "TRIPWIRE_MAX_TRACES"),
        ({"TRIPWIRE_MAX_TRACES": "many"}, "TRIPWIRE_MAX_TRACES"),
        ({"TRIPWIRE_IDLE_TTL_S": "soon"}, "TRIPWIRE_IDLE_TTL_S"),
        ({"TRIPWIRE_IDLE_TTL_S": "-5"}, "TRIPWIRE_IDLE_TTL_S"),
    ],
)
def test_bad_environment_values_name_the_variable(
    provider: TracerProvider, env: dict[str, str], var: str
) -> None:
    with pytest.raises(ConfigError) as info:
        tw.instrument(provider=provider, env=env)
    assert info.value.field == var


def test_a_second_instrument_attaches_nothing_and_warns_once(provider: TracerProvider) -> None:
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    first = tw.instrument(provider=provider, env={}, flags=tw.KillFlags())
    with pytest.warns(RuntimeWarning, match="already called"):
        second = tw.instrument(provider=provider, env={}, flags=tw.KillFlags())
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        third = tw.instrument(provider=provider, env={})  # no second warning
    assert second is first and third is first
    loop(provider)
    # One processor judged the loop: one verdict span, not two.
    assert [s.name for s in exporter.get_finished_spans()].count("tripwire.verdict") == 1
    assert first.stats.flags_raised == 1


def test_the_digest_key_secret_never_reaches_the_error(provider: TracerProvider) -> None:
    with pytest.raises(ConfigError) as info:
        tw.instrument(provider=provider, env={"TRIPWIRE_DIGEST_KEY": "pin-1234"})
    assert "pin-1234" not in str(info.value) and "pin-1234" not in repr(info.value.value)


def test_unknown_keyword_is_a_config_error(provider: TracerProvider) -> None:
    with pytest.raises(ConfigError):
        tw.instrument(provider=provider, env={}, windw=5)


def test_not_an_sdk_provider_is_a_config_error() -> None:
    with pytest.raises(ConfigError):
        tw.instrument(provider=trace_api.NoOpTracerProvider(), env={})  # type: ignore[arg-type]


def _run(code: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True, timeout=60
    )


def test_global_proxy_provider_is_replaced_by_an_sdk_provider() -> None:
    result = _run(
        """
        from opentelemetry import trace
        from opentelemetry.sdk.trace import TracerProvider
        import tripwire.otel as tw
        assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
        p = tw.instrument(env={})
        assert isinstance(trace.get_tracer_provider(), TracerProvider)
        print("ok", type(p).__name__)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok TripwireSpanProcessor"


def test_import_without_the_extra_says_what_to_install() -> None:
    result = _run(
        """
        import sys
        class Block:
            def find_spec(self, name, path=None, target=None):
                if name == "opentelemetry" or name.startswith("opentelemetry."):
                    raise ImportError(f"No module named {name!r}")
                return None
        sys.meta_path.insert(0, Block())
        import tripwire.spans  # the pure span mapping imports without the extra
        print("mapping", tripwire.spans.MAPPING_VERSION)
        try:
            import tripwire.otel
        except ImportError as exc:
            print(exc)
        """
    )
    assert result.returncode == 0, result.stderr
    assert "mapping m3" in result.stdout
    assert "pip install 'tripwire[otel]'" in result.stdout


def test_public_names(provider: Any) -> None:
    assert {"TripwireSpanProcessor", "check", "clear", "instrument", "KillFlags"} <= set(tw.__all__)
    assert all(hasattr(tw, name) for name in tw.__all__)
