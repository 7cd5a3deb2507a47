"""One-line setup: :func:`instrument` attaches a :class:`TripwireSpanProcessor` to a provider.

::

    import tripwire.otel
    tripwire.otel.instrument()                      # policy from TRIPWIRE_* env vars

    # or, to get the tripwire.* annotations on the spans your exporter sends:
    tripwire.otel.instrument(inner=BatchSpanProcessor(OTLPSpanExporter()))

Settings come from keywords first, then environment variables, then the preset:

=========================  ===================================  ==========================
variable                   meaning                              accepted values
=========================  ===================================  ==========================
``TRIPWIRE_POLICY``        the preset the others modify         ``default``, ``seed``
``TRIPWIRE_WINDOW``        calls the repetition rule looks at   integer >= 1
``TRIPWIRE_THRESHOLD``     identical calls that trip it         integer >= 2, <= window
``TRIPWIRE_KEY``           what makes two calls the same        ``tool+args``, ``tool``
``TRIPWIRE_MAX_PERIOD``    longest cycle looked for             integer >= 2, or ``off``
``TRIPWIRE_MIN_REPEATS``   cycle repetitions that trip it       integer >= 2
``TRIPWIRE_MAX_TRACES``    active traces watched at most        integer >= 1
``TRIPWIRE_IDLE_TTL_S``    idle seconds before a trace is       number > 0
                           dropped
``TRIPWIRE_MAX_TOOL_CALLS`` tool calls per trace                integer >= 0, or ``off``
``TRIPWIRE_MAX_TOTAL_TOKENS`` input + output tokens per trace   integer >= 1, or ``off``
``TRIPWIRE_MAX_COST_USD``  cost per trace in USD                number > 0, or ``off``
=========================  ===================================  ==========================

The budget variables fill the fields a ``limits=`` keyword leaves unset (``None``): a value set
in code is never overridden. A bad value raises :class:`~tripwire.errors.ConfigError` naming
the variable.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any, Final

from opentelemetry import trace as trace_api
from opentelemetry.sdk.trace import SpanProcessor, TracerProvider

from tripwire.core.budget import Limits
from tripwire.core.policy import LoopPolicy
from tripwire.errors import ConfigError
from tripwire.otel.processor import DEFAULT_IDLE_TTL_S, DEFAULT_MAX_TRACES, TripwireSpanProcessor

__all__ = ["ENV_VARS", "instrument", "limits_from_env", "policy_from_env"]

_POLICY_ENV: Final = {
    "TRIPWIRE_WINDOW": "window",
    "TRIPWIRE_THRESHOLD": "threshold",
    "TRIPWIRE_KEY": "key",
    "TRIPWIRE_MAX_PERIOD": "max_period",
    "TRIPWIRE_MIN_REPEATS": "min_repeats",
}
_LIMITS_ENV: Final = {
    "TRIPWIRE_MAX_TOOL_CALLS": ("max_tool_calls", "an integer >= 0, or 'off'"),
    "TRIPWIRE_MAX_TOTAL_TOKENS": ("max_total_tokens", "an integer >= 1, or 'off'"),
    "TRIPWIRE_MAX_COST_USD": ("max_cost_usd", "a number > 0, or 'off'"),
}
ENV_VARS: Final = (
    "TRIPWIRE_POLICY",
    *_POLICY_ENV,
    "TRIPWIRE_MAX_TRACES",
    "TRIPWIRE_IDLE_TTL_S",
    *_LIMITS_ENV,
)
"""Every environment variable :func:`instrument` reads."""


def _env_int(env: Mapping[str, str], var: str, *, allow_off: bool = False) -> int | None:
    raw = env[var].strip()
    if allow_off and raw.lower() in ("off", "none", ""):
        return None
    try:
        return int(raw)
    except ValueError:
        expected = "an integer, or 'off'" if allow_off else "an integer"
        raise ConfigError(var, raw, expected) from None


def policy_from_env(
    env: Mapping[str, str] | None = None, **overrides: Any
) -> LoopPolicy:
    """The loop policy the ``TRIPWIRE_*`` variables describe, with keyword ``overrides`` on top.

    Args:
        env: the environment to read (default ``os.environ``).
        overrides: :class:`~tripwire.core.policy.LoopPolicy` fields; they win over the
            variables. ``policy=`` (a preset name or a ``LoopPolicy``) replaces the preset.

    Raises:
        ConfigError: a variable holds a bad value (``field`` is the variable's name), or the
            resulting policy is invalid.
    """
    env = os.environ if env is None else env
    base = overrides.pop("policy", None)
    if base is None:
        name = env.get("TRIPWIRE_POLICY", "").strip() or "default"
        try:
            base = LoopPolicy.preset(name)
        except ConfigError as exc:
            raise ConfigError("TRIPWIRE_POLICY", name, exc.expected) from None
    elif isinstance(base, str):
        base = LoopPolicy.preset(base)
    elif not isinstance(base, LoopPolicy):
        raise ConfigError("policy", base, "a LoopPolicy or a preset name")

    changes: dict[str, Any] = {}
    for var, fname in _POLICY_ENV.items():
        if var not in env or fname in overrides:
            continue
        if fname == "key":
            changes[fname] = env[var].strip()
        else:
            changes[fname] = _env_int(env, var, allow_off=fname == "max_period")
    try:
        policy = base.evolve(**changes) if changes else base
    except ConfigError as exc:
        env_var = next((v for v, f in _POLICY_ENV.items() if f == exc.field), None)
        if env_var is None:
            raise
        raise ConfigError(env_var, env[env_var], exc.expected) from None
    return policy.evolve(**overrides) if overrides else policy


def limits_from_env(
    env: Mapping[str, str] | None = None, limits: Limits | None = None
) -> Limits | None:
    """The budgets the ``TRIPWIRE_MAX_*`` variables describe, on top of ``limits``.

    A variable only fills a field that ``limits`` leaves ``None`` (code wins); ``off`` (or an
    empty value) leaves it off.

    Args:
        env: the environment to read (default ``os.environ``).
        limits: the limits given in code, if any.

    Returns:
        ``limits`` with the variables applied; ``None`` when neither sets anything.

    Raises:
        ConfigError: a variable holds a bad value (``field`` is the variable's name).
    """
    env = os.environ if env is None else env
    changes: dict[str, Any] = {}
    for var, (fname, expected) in _LIMITS_ENV.items():
        if var not in env or (limits is not None and getattr(limits, fname) is not None):
            continue
        raw = env[var].strip()
        if raw.lower() in ("off", "none", ""):
            continue
        try:
            changes[fname] = float(raw) if fname == "max_cost_usd" else int(raw)
        except ValueError:
            raise ConfigError(var, raw, expected) from None
    if not changes:
        return limits
    try:
        return dataclasses.replace(limits, **changes) if limits is not None else Limits(**changes)
    except ConfigError as exc:
        named = next((v for v, (f, _) in _LIMITS_ENV.items() if f == exc.field), None)
        if named is None:
            raise
        raise ConfigError(named, env[named], _LIMITS_ENV[named][1]) from None


def instrument(
    *,
    provider: TracerProvider | None = None,
    inner: SpanProcessor | None = None,
    env: Mapping[str, str] | None = None,
    **overrides: Any,
) -> TripwireSpanProcessor:
    """Attach a :class:`TripwireSpanProcessor` to the tracer provider and return it.

    Args:
        provider: the SDK ``TracerProvider`` to attach to (default: the global one). When the
            global provider is not an SDK provider (nothing configured yet: OpenTelemetry's
            proxy), a new SDK ``TracerProvider`` is created and installed globally. A
            provider of another SDK raises :class:`~tripwire.errors.ConfigError`.
        inner: a processor to wrap (your exporting ``BatchSpanProcessor``): spans reach it with
            the ``tripwire.*`` annotations. Without it the processor stands alone beside your
            processors and reports verdict changes as ``tripwire.verdict`` child spans.
        env: the environment to read (default ``os.environ``).
        overrides: loop-policy fields (``window``, ``threshold``, ``key``, ``max_period``,
            ``min_repeats``…, or ``policy=`` a preset name / ``LoopPolicy``) and processor
            options (``on_verdict``, ``max_traces``, ``idle_ttl_s``, ``normalizer``,
            ``flags``, ``clock``, ``tracer``, ``limits``, ``on_budget``, ``prices``).
            ``limits=`` (a :class:`~tripwire.core.budget.Limits`) turns budgets on; the
            ``TRIPWIRE_MAX_*`` variables fill the fields it leaves unset.

    Returns:
        The processor (its ``stats``, ``verdict()`` and ``flags`` are useful in tests).

    Raises:
        ConfigError: a bad keyword or environment value (named), or an unusable provider.
    """
    env = os.environ if env is None else env
    policy_kw = {
        k: overrides.pop(k) for k in list(overrides) if k in _LOOP_POLICY_FIELDS or k == "policy"
    }
    unknown = set(overrides) - _PROCESSOR_OPTIONS
    if unknown:
        raise ConfigError(
            "instrument()", sorted(unknown), f"LoopPolicy fields or one of {sorted(_PROCESSOR_OPTIONS)}"
        )
    policy = policy_from_env(env, **policy_kw)
    if "max_traces" not in overrides and "TRIPWIRE_MAX_TRACES" in env:
        overrides["max_traces"] = _env_int(env, "TRIPWIRE_MAX_TRACES")
    if "idle_ttl_s" not in overrides and "TRIPWIRE_IDLE_TTL_S" in env:
        raw = env["TRIPWIRE_IDLE_TTL_S"].strip()
        try:
            overrides["idle_ttl_s"] = float(raw)
        except ValueError:
            raise ConfigError("TRIPWIRE_IDLE_TTL_S", raw, "a number > 0") from None
    limits = overrides.get("limits")
    if limits is not None and not isinstance(limits, Limits):
        raise ConfigError("limits", limits, "a tripwire Limits, or None")
    overrides["limits"] = limits_from_env(env, limits)
    overrides.setdefault("max_traces", DEFAULT_MAX_TRACES)
    overrides.setdefault("idle_ttl_s", DEFAULT_IDLE_TTL_S)

    sdk_provider = _sdk_provider(provider)
    if inner is None and "tracer" not in overrides:
        overrides["tracer"] = sdk_provider.get_tracer("tripwire")
    try:
        processor = TripwireSpanProcessor(inner, policy=policy, **overrides)
    except ConfigError as exc:
        var = {"max_traces": "TRIPWIRE_MAX_TRACES", "idle_ttl_s": "TRIPWIRE_IDLE_TTL_S"}.get(exc.field)
        if var is not None and var in env:
            raise ConfigError(var, env[var], exc.expected) from None
        raise
    sdk_provider.add_span_processor(processor)
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


_PROCESSOR_OPTIONS: Final = frozenset(
    {
        "on_verdict",
        "max_traces",
        "idle_ttl_s",
        "normalizer",
        "flags",
        "clock",
        "tracer",
        "limits",
        "on_budget",
        "prices",
    }
)
_LOOP_POLICY_FIELDS: Final = frozenset(
    f for f in LoopPolicy.__dataclass_fields__ if f not in ("version",)
)
