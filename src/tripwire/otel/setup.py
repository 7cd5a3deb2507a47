"""One-line setup: :func:`instrument` attaches a :class:`TripwireSpanProcessor` to a provider.

::

    import tripwire.otel
    tripwire.otel.instrument()                      # settings from TRIPWIRE_* variables

    # or, to get the tripwire.* annotations on the spans your exporter sends:
    tripwire.otel.instrument(inner=BatchSpanProcessor(OTLPSpanExporter()))

    # or, to send the spans to `tripwire serve` fast enough for its verdict to stop the run:
    tripwire.otel.instrument(endpoint="http://127.0.0.1:4318", token=os.environ["TRIPWIRE_TOKEN"])

Settings are read by the one configuration loader, :func:`tripwire.config.load_config`:
keywords first, then ``TRIPWIRE_*`` environment variables, then the policy file
(``TRIPWIRE_POLICY``) and the configuration file (``TRIPWIRE_CONFIG``), then the preset
(``TRIPWIRE_PRESET``). ``docs/config.md`` lists every setting. A bad value raises
:class:`~tripwire.errors.ConfigError` naming the keyword, variable or file key. A ``limits=``
given in code is never overridden: the variables fill only the fields it leaves ``None``.
"""

from __future__ import annotations

import os
import threading
import warnings
import weakref
from collections.abc import Mapping
from typing import Any, Final

from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

from tripwire.config import OPTIONS, SETTINGS, env_name, load_config
from tripwire.core.budget import Limits
from tripwire.core.policy import LoopPolicy
from tripwire.errors import ConfigError
from tripwire.otel.processor import DEFAULT_IDLE_TTL_S, DEFAULT_MAX_TRACES, TripwireSpanProcessor

__all__ = ["ENV_VARS", "EXPORT_DELAY_MS", "export_processor", "instrument", "limits_from_env", "policy_from_env"]

EXPORT_DELAY_MS: Final = 25
"""How long :func:`export_processor`'s ``BatchSpanProcessor`` lets a finished span wait for
others before it sends them (the SDK's default is 5000 ms, so a flag from ``tripwire serve``
came about 5 s after the call that looped). Its worker wakes 40 times a second when idle."""

ENV_VARS: Final = (
    env_name("config"),
    env_name("policy"),
    env_name("preset"),
    *(s.env for s in SETTINGS.values()),
    env_name("volatile_keys"),
    env_name("polling_tools"),
    env_name("tool_caps"),
    env_name("digest_key"),
    env_name("digest_key_file"),
)
"""Every environment variable :func:`instrument` reads."""

_PROCESSOR_ONLY: Final = frozenset({"on_verdict", "flags", "clock", "tracer", "on_budget", "prices"})
"""Keywords that go to the processor as they are (not settings)."""

_attached: weakref.WeakKeyDictionary[TracerProvider, TripwireSpanProcessor] = (
    weakref.WeakKeyDictionary()
)
_warned: weakref.WeakSet[TracerProvider] = weakref.WeakSet()
_attach_lock = threading.Lock()


def policy_from_env(env: Mapping[str, str] | None = None, **overrides: Any) -> LoopPolicy:
    """The loop policy the settings describe (a thin wrapper of :func:`~tripwire.config.load_config`).

    Args:
        env: the environment to read (default ``os.environ``).
        overrides: settings that win over the environment (``window=6``, ``preset="seed"``,
            ``policy=`` a ``LoopPolicy``).

    Raises:
        ConfigError: a bad value, named.
    """
    return load_config(overrides, env=env).policy


def limits_from_env(
    env: Mapping[str, str] | None = None, limits: Limits | None = None
) -> Limits | None:
    """The budgets the settings describe on top of ``limits`` (code wins); ``None`` if none.

    A thin wrapper of :func:`~tripwire.config.load_config`.

    Raises:
        ConfigError: a bad value, named.
    """
    return load_config({"limits": limits}, env=env).limits


def export_processor(
    endpoint: str,
    *,
    token: str | None = None,
    env: Mapping[str, str] | None = None,
    schedule_delay_ms: float = EXPORT_DELAY_MS,
) -> SpanProcessor:
    """An OTLP/HTTP exporter to ``tripwire serve`` (or any OTLP/HTTP receiver) in a
    ``BatchSpanProcessor`` that sends each finished span within ``schedule_delay_ms``.

    The settings, for a pipeline you wire yourself::

        BatchSpanProcessor(
            OTLPSpanExporter(endpoint="http://127.0.0.1:4318/v1/traces",
                             headers={"Authorization": f"Bearer {token}"}),
            schedule_delay_millis=25,   # the SDK's default: 5000
        )

    Spans are sent from the processor's own thread: the agent never waits on the network.

    Args:
        endpoint: the service's base URL (``http://127.0.0.1:4318``) or its traces URL
            (``…/v1/traces``).
        token: the bearer token; default ``TRIPWIRE_TOKEN`` from ``env``; none: no header.
        env: the environment to read (default ``os.environ``).
        schedule_delay_ms: the longest a finished span waits before it is sent.

    Raises:
        ConfigError: ``endpoint`` is not an http(s) URL, ``schedule_delay_ms`` is not a
            number of milliseconds from 1 to 60000, or the OTLP/HTTP exporter package
            (``opentelemetry-exporter-otlp-proto-http``) is not installed.
    """
    if not isinstance(endpoint, str) or not endpoint.startswith(("http://", "https://")):
        raise ConfigError("endpoint", endpoint, "the service's http(s) URL, e.g. http://127.0.0.1:4318")
    if (
        isinstance(schedule_delay_ms, bool)
        or not isinstance(schedule_delay_ms, (int, float))
        or not 1 <= schedule_delay_ms <= 60_000
    ):
        raise ConfigError("schedule_delay_ms", schedule_delay_ms, "a number of milliseconds from 1 to 60000")
    try:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError:
        raise ConfigError(
            "endpoint", endpoint,
            "the OTLP/HTTP exporter installed: pip install opentelemetry-exporter-otlp-proto-http",
        ) from None
    url = endpoint.rstrip("/")
    if not url.endswith("/v1/traces"):
        url += "/v1/traces"
    if token is None:
        token = (os.environ if env is None else env).get("TRIPWIRE_TOKEN") or None
    headers = {"Authorization": f"Bearer {token}"} if token else None
    return BatchSpanProcessor(
        OTLPSpanExporter(endpoint=url, headers=headers),
        schedule_delay_millis=float(schedule_delay_ms),
    )


def instrument(
    *,
    provider: TracerProvider | None = None,
    inner: SpanProcessor | None = None,
    endpoint: str | None = None,
    token: str | None = None,
    env: Mapping[str, str] | None = None,
    **overrides: Any,
) -> TripwireSpanProcessor:
    """Attach a :class:`TripwireSpanProcessor` to the tracer provider and return it.

    Calling it again for the same provider attaches nothing more: it returns (and the first
    time warns) with
    the processor already attached (two would judge and report every span twice).

    Args:
        provider: the SDK ``TracerProvider`` to attach to (default: the global one). When the
            global provider is not an SDK provider (nothing configured yet: OpenTelemetry's
            proxy), a new SDK ``TracerProvider`` is created and installed globally. A
            provider of another SDK raises :class:`~tripwire.errors.ConfigError`.
        inner: a processor to wrap (your exporting ``BatchSpanProcessor``): spans reach it with
            the ``tripwire.*`` annotations. Without it the processor stands alone beside your
            processors and reports verdict changes as ``tripwire.verdict`` child spans.
        endpoint: send the spans to ``tripwire serve`` at this URL
            (``http://127.0.0.1:4318``): the inner processor is then
            :func:`export_processor`'s, which sends each span within
            :data:`EXPORT_DELAY_MS` (not with ``inner``).
        token: the service's bearer token for ``endpoint`` (default ``TRIPWIRE_TOKEN``).
        env: the environment to read (default ``os.environ``).
        overrides: settings (``window``, ``threshold``, ``preset``, ``policy=`` a
            ``LoopPolicy``, ``policy_file``, ``config``, ``limits=`` a
            :class:`~tripwire.core.budget.Limits`, ``max_tool_calls``, ``normalizer``,
            ``max_traces``, ``idle_ttl_s``…; see ``docs/config.md``) and processor options
            (``on_verdict``, ``flags``, ``clock``, ``tracer``, ``on_budget``, ``prices``).

    Returns:
        The processor (its ``stats``, ``verdict()`` and ``flags`` are useful in tests).

    Raises:
        ConfigError: a bad keyword or setting (named), or an unusable provider.
    """
    unknown = set(overrides) - _PROCESSOR_ONLY - OPTIONS
    if unknown:
        raise ConfigError(
            "instrument()", sorted(unknown),
            f"settings ({', '.join(sorted(OPTIONS))}) or processor options "
            f"({', '.join(sorted(_PROCESSOR_ONLY))})",
        )
    if endpoint is not None and inner is not None:
        raise ConfigError("endpoint", endpoint, "either endpoint= or inner=, not both")
    if token is not None and endpoint is None:
        raise ConfigError("token", "<set>", "a token only with endpoint= (the service it is for)")
    settings = {k: v for k, v in overrides.items() if k not in _PROCESSOR_ONLY}
    kwargs = {k: v for k, v in overrides.items() if k in _PROCESSOR_ONLY}
    if env is not None and not isinstance(env, Mapping):
        raise ConfigError("env", env, "a mapping of environment variables, or None")
    config = load_config(settings, env=env)
    sdk_provider = _sdk_provider(provider)
    with _attach_lock:
        existing = _attached.get(sdk_provider)
        if existing is not None:
            if sdk_provider in _warned:
                return existing
            _warned.add(sdk_provider)
            warnings.warn(
                "tripwire.otel.instrument() was already called for this TracerProvider; "
                "returning the processor it attached (its settings stand). Call it once, at "
                "start-up.",
                RuntimeWarning,
                stacklevel=2,
            )
            return existing
        if endpoint is not None:
            inner = export_processor(endpoint, token=token, env=env)
        if inner is None and "tracer" not in kwargs:
            kwargs["tracer"] = sdk_provider.get_tracer("tripwire")
        processor = TripwireSpanProcessor(
            inner,
            policy=config.policy,
            normalizer=config.normalizer,
            limits=config.limits,
            max_traces=config.max_traces if config.max_traces is not None else DEFAULT_MAX_TRACES,
            idle_ttl_s=config.idle_ttl_s if config.idle_ttl_s is not None else DEFAULT_IDLE_TTL_S,
            **kwargs,
        )
        sdk_provider.add_span_processor(processor)
        _attached[sdk_provider] = processor
    return processor


def _sdk_provider(provider: TracerProvider | None) -> TracerProvider:
    if provider is not None:
        if not isinstance(provider, TracerProvider):
            raise ConfigError("provider", provider, "an opentelemetry.sdk.trace.TracerProvider")
        return provider
    current = trace_api.get_tracer_provider()
    if isinstance(current, TracerProvider):
        return current
    if isinstance(current, (trace_api.ProxyTracerProvider, trace_api.NoOpTracerProvider)):
        created = TracerProvider()
        trace_api.set_tracer_provider(created)
        # set_tracer_provider refuses (with a warning) once a provider was set: use the winner.
        winner = trace_api.get_tracer_provider()
        if isinstance(winner, TracerProvider):
            return winner
        raise ConfigError(
            "global TracerProvider",
            type(winner).__name__,
            "an SDK TracerProvider; it was set to a no-op one. Pass "
            "instrument(provider=...) or set an SDK TracerProvider before instrumenting",
        )
    raise ConfigError(
        "global TracerProvider",
        type(current).__name__,
        "an opentelemetry.sdk.trace.TracerProvider (pass instrument(provider=...))",
    )
