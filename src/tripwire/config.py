"""One configuration loader: loop policy, budgets, digest key and engine settings.

Every entry point reads its settings through :func:`load_config`: ``tripwire.otel.instrument()``,
``tripwire replay`` / ``tripwire calibrate`` and ``tripwire serve``. The same name means the
same thing everywhere, and a value comes from the first of these that gives it:

1. a command-line option or a keyword argument (``--window 6``, ``instrument(window=6)``);
2. an environment variable (``TRIPWIRE_WINDOW=6``);
3. a file: the policy file (``--policy`` / ``TRIPWIRE_POLICY``) over the configuration file
   (``--config`` / ``TRIPWIRE_CONFIG``); both are ``tripwire.toml`` files;
4. the preset (``--preset`` / ``TRIPWIRE_PRESET`` / the file's ``preset``, else ``default``)
   and the built-in defaults.

``TRIPWIRE_POLICY`` is always a file path, ``TRIPWIRE_PRESET`` always a preset name.

A ``tripwire.toml``::

    version = 1
    preset = "default"          # the preset the settings below change

    [policy]                    # LoopPolicy fields; "off" (or false) turns a rule off
    window = 10
    threshold = 4

    [normalizer]                # volatile_keys_add, volatile_keys_remove, max_bytes

    [limits]                    # Limits fields; tool_caps and levels are tables
    max_tool_calls = 40
    [limits.tool_caps]
    send_email = 1

    [digest]                    # the keyed-digest secret, read from a file
    key_file = "/run/secrets/tripwire-digest-key"

    [engine]                    # max_traces, idle_ttl_s

    [serve]                     # tripwire serve: host, port, store, redis_url… (SERVE_SETTINGS)
    port = 4318

A policy file holds only ``version``, ``preset``, ``[policy]`` and ``[normalizer]``. Unknown
sections and keys are refused with a :class:`~tripwire.errors.ConfigError` that names them and
lists the accepted ones: a typo must not silently give the default. Every value is checked
when it is loaded (range included), and the error names the variable, key or option it came
from. ``docs/config.md`` lists every setting.
"""

from __future__ import annotations

import math
import os
import re
import stat
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from enum import Enum
from types import MappingProxyType
from typing import Any, Final

from tripwire.core.budget import Levels, Limits
from tripwire.core.policy import MAX_COUNT as POLICY_MAX_COUNT
from tripwire.core.policy import (
    MAX_WINDOW,
    PRESETS,
    KeyMode,
    LoopPolicy,
    Poll,
    ResultEvidence,
    RetryPolicy,
)
from tripwire.core.signature import DEFAULT_NORMALIZER, Normalizer
from tripwire.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib  # type: ignore[import-not-found, unused-ignore]

__all__ = [
    "ENV_PREFIX",
    "FILE_VERSIONS",
    "MAX_COUNT",
    "OPTIONS",
    "SERVE_SETTINGS",
    "SETTINGS",
    "Config",
    "ServeSetting",
    "Setting",
    "config_from_file",
    "env_name",
    "load_config",
    "load_serve_config",
    "read_toml",
]

ENV_PREFIX: Final = "TRIPWIRE_"
"""Every environment variable is this prefix and the setting's name in upper case."""
FILE_VERSIONS: Final = (1,)
"""``tripwire.toml`` versions this tripwire reads."""
MAX_COUNT: Final = 1 << 28
"""The largest loop-policy count (window, threshold, cycle length…) the watcher supports."""
_MAX_BUDGET: Final = 1 << 62
"""The largest count budget (tool calls, tokens): shared ledgers count in 64-bit integers."""
_MAX_SECONDS: Final = 1e9
"""The longest duration (about 31 years; beyond, timers of the standard library overflow)."""
_MAX_USD: Final = 1e9
"""The largest cost budget (ledgers count cost in integer nano-dollars)."""
_MAX_KEY_FILE_BYTES: Final = 4096
_MIN_KEY_BYTES: Final = 16


def env_name(name: str) -> str:
    """The environment variable of a setting: ``window`` → ``TRIPWIRE_WINDOW``."""
    return ENV_PREFIX + name.upper()


# -- settings: one parser per value, shared by files, variables and options -------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Setting:
    """One scalar setting: where it lives, what it accepts, what it means."""

    name: str
    """The key in its file section, the keyword, and (upper-cased) the variable's suffix."""
    section: str
    """The ``tripwire.toml`` section: ``policy``, ``limits`` or ``engine``."""
    kind: str
    """``int``, ``float``, ``share``, ``bool`` or ``choice``."""
    minimum: float = 0
    """The smallest value accepted (numbers)."""
    maximum: float = MAX_COUNT
    """The largest value accepted (numbers)."""
    off: bool = False
    """``off`` (or ``false`` in a file) turns the setting off."""
    choices: tuple[str, ...] = ()
    """The accepted values (``choice``)."""
    help: str = ""
    """What it means, in a few words."""

    @property
    def env(self) -> str:
        """The environment variable."""
        return env_name(self.name)

    def expected(self) -> str:
        """What the setting accepts, in words (for errors and the docs table)."""
        if self.kind == "bool":
            text = "true or false"
        elif self.kind == "choice":
            text = " or ".join(repr(c) for c in self.choices)
        elif self.kind == "share":
            text = "a share above 0 and at most 1"
        elif self.kind == "int":
            text = f"an integer from {self.minimum:g} to {_number(self.maximum)}"
        else:
            text = f"a number above {self.minimum:g} and at most {_number(self.maximum)}"
        return f"{text}, or 'off'" if self.off else text

    def parse(self, value: Any, origin: str) -> Any:
        """The checked value (``None`` for off); strings are parsed (variables, options).

        Raises:
            ConfigError: the value is not accepted; ``field`` is ``origin``.
        """
        if isinstance(value, Enum):
            value = value.value
        if isinstance(value, str):
            text = value.strip()
            if self.off and text.lower() in ("off", "none"):
                return None
            try:
                return self._check(self._from_text(text, origin), origin)
            except ConfigError as exc:  # quote what was written, not what it parsed to
                raise ConfigError(origin, _short(text), exc.expected) from None
        if value is None or (value is False and self.off):
            if self.off:
                return None
            raise ConfigError(origin, value, self.expected())
        return self._check(value, origin)

    def _from_text(self, text: str, origin: str) -> Any:
        if self.kind == "bool":
            lowered = text.lower()
            if lowered in ("1", "true", "yes", "on"):
                return True
            if lowered in ("0", "false", "no", "off"):
                return False
            raise ConfigError(origin, text, self.expected())
        if self.kind == "choice":
            return text
        if self.kind == "int":
            if not re.fullmatch(r"[+-]?[0-9]{1,30}", text):
                raise ConfigError(origin, _short(text), self.expected())
            return int(text)
        if len(text) > 40:
            raise ConfigError(origin, _short(text), self.expected())
        try:
            return float(text)
        except ValueError:
            raise ConfigError(origin, text, self.expected()) from None

    def _check(self, value: Any, origin: str) -> Any:
        if self.kind == "bool":
            if not isinstance(value, bool):
                raise ConfigError(origin, value, self.expected())
            return value
        if self.kind == "choice":
            if not isinstance(value, str) or value.lower() not in self.choices:
                raise ConfigError(origin, _short(value), self.expected())
            return value.lower()
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(origin, _short(value), self.expected())
        if self.kind == "int":
            if not isinstance(value, int) or not self.minimum <= value <= self.maximum:
                raise ConfigError(origin, _short(value), self.expected())
            return value
        if self.kind == "share":
            if not (math.isfinite(value) and 0 < value <= 1):
                raise ConfigError(origin, value, self.expected())
            return float(value)
        if not (math.isfinite(value) and self.minimum < value <= self.maximum):
            raise ConfigError(origin, _short(value), self.expected())
        return float(value)


def _number(n: float) -> str:
    if n == int(n) and int(n).bit_count() == 1 and n >= 1 << 20:
        return f"2**{int(n).bit_length() - 1}"
    return f"{int(n):,}" if n == int(n) and n >= 100_000 else f"{n:g}"


def _short(value: Any) -> Any:
    """``value``, or a short stand-in when it is too big to quote in a message."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"<an integer of about {int(value.bit_length() * 0.30103) + 1} digits>"
    if isinstance(value, str) and len(value) > 40:
        return value[:37] + "..."
    return value


def _int(name: str, section: str, minimum: int, help: str, *, off: bool = False,
         maximum: float = POLICY_MAX_COUNT) -> Setting:
    return Setting(name=name, section=section, kind="int", minimum=minimum, maximum=maximum,
                   off=off, help=help)


def _num(name: str, section: str, help: str, *, maximum: float, off: bool = True) -> Setting:
    return Setting(name=name, section=section, kind="float", maximum=maximum, off=off, help=help)


_P, _L, _E = "policy", "limits", "engine"

SETTINGS: Final[Mapping[str, Setting]] = MappingProxyType({s.name: s for s in (
    _int("window", _P, 1, "calls the repetition rule looks back over", maximum=MAX_WINDOW),
    _int("threshold", _P, 2, "identical calls within the window that trip the repetition rule"),
    Setting(name="key", section=_P, kind="choice", choices=tuple(k.value for k in KeyMode),
            help="what makes two calls the same: tool and arguments, or the tool name only"),
    _int("max_period", _P, 2, "longest cycle (A B A B…) the period rule looks for", off=True),
    _int("min_repeats", _P, 2, "back-to-back repetitions of a cycle that trip the period rule"),
    _int("same_error", _P, 2, "consecutive failures with one error class that trip", off=True),
    _int("same_result", _P, 2, "consecutive calls of one tool with one result that trip", off=True),
    _int("revisit", _P, 2, "consecutive calls repeating an earlier call and its result that trip",
         off=True),
    _int("revisit_memory", _P, 1, "distinct earlier calls the revisit rule remembers", maximum=MAX_WINDOW),
    Setting(name="revisit_share", section=_P, kind="share", off=True,
            help="share of the window of revisits that trips"),
    Setting(name="failure_share", section=_P, kind="share", off=True,
            help="share of the window of failed calls that trips"),
    _int("mute_failures", _P, 2, "calls failing with nothing to say (command not found) within "
         "twice the window that trip", off=True),
    Setting(name="result_evidence", section=_P, kind="choice",
            choices=tuple(r.value for r in ResultEvidence),
            help="whose changed results count as progress"),
    Setting(name="require_evidence", section=_P, kind="bool",
            help="a repetition without any evidence is uncertain, not stuck"),
    Setting(name="name_only", section=_P, kind="choice", choices=("uncertain", "stuck"),
            help="the verdict of a trip on calls recorded without arguments"),
    _int("max_lease_renewals", _P, 0, "lease renewals honoured before a lease is ignored"),
    _int("confirm", _P, 1, "consecutive tripped evaluations before stuck"),
    _int("max_steps", _L, 0, "model calls per run", off=True, maximum=_MAX_BUDGET),
    _int("max_tool_calls", _L, 0, "tool calls per run, all tools together", off=True,
         maximum=_MAX_BUDGET),
    _int("default_tool_cap", _L, 0, "calls per tool not listed in tool_caps", off=True,
         maximum=_MAX_BUDGET),
    _int("max_duplicate_calls", _L, 0, "calls with one signature per run", off=True,
         maximum=_MAX_BUDGET),
    _int("max_input_tokens", _L, 1, "input tokens per run", off=True, maximum=_MAX_BUDGET),
    _int("max_output_tokens", _L, 1, "output tokens per run", off=True, maximum=_MAX_BUDGET),
    _int("max_total_tokens", _L, 1, "input + output tokens per run", off=True,
         maximum=_MAX_BUDGET),
    _num("max_cost_usd", _L, "cost per run, in USD", maximum=_MAX_USD),
    _num("max_duration_s", _L, "wall-clock seconds per run", maximum=_MAX_SECONDS),
    _num("tool_timeout_s", _L, "default timeout of one tool call, in seconds",
         maximum=_MAX_SECONDS),
    _int("max_no_progress_steps", _L, 1, "consecutive steps without progress", off=True,
         maximum=_MAX_BUDGET),
    _int("max_subagents", _L, 0, "sub-agents a run may start", off=True, maximum=_MAX_BUDGET),
    _int("max_traces", _E, 1, "runs (traces) watched at once; the least recent is dropped",
         maximum=MAX_COUNT),
    _num("idle_ttl_s", _E, "seconds without a span before a run's state is dropped",
         maximum=_MAX_SECONDS, off=False),
)})
"""Every scalar setting, by name; its variable is ``TRIPWIRE_`` + the name in upper case."""

_POLICY_TABLES: Final = ("polling_tools", "retry", "retry_per_tool", "polls")
_LIMIT_TABLES: Final = ("tool_caps", "levels")
_NORMALIZER_KEYS: Final = ("volatile_keys_add", "volatile_keys_remove", "max_bytes")
_SECTIONS: Final = ("policy", "normalizer", "limits", "digest", "engine", "serve")
_POLICY_FILE_TOP: Final = ("version", "preset", "policy", "normalizer")
_RETRY_KEYS: Final = tuple(f.name for f in fields(RetryPolicy) if f.init)
_POLL_KEYS: Final = tuple(f.name for f in fields(Poll) if f.init)
_LEVEL_KEYS: Final = tuple(f.name for f in fields(Levels) if f.init)
_LIST_VARS: Final = ("volatile_keys", "polling_tools", "tool_caps")
"""Settings given as space-separated lists in variables (``TRIPWIRE_POLLING_TOOLS="a b"``)."""


def _section_keys(section: str) -> tuple[str, ...]:
    if section == "policy":
        extra = tuple(f.name for f in fields(LoopPolicy) if f.init and f.name not in SETTINGS
                      and f.name not in _POLICY_TABLES and f.name != "name")
        return (*(s.name for s in SETTINGS.values() if s.section == "policy"), *_POLICY_TABLES,
                *extra)
    if section == "limits":
        return (*(s.name for s in SETTINGS.values() if s.section == "limits"), *_LIMIT_TABLES)
    if section == "engine":
        return tuple(s.name for s in SETTINGS.values() if s.section == "engine")
    if section == "normalizer":
        return _NORMALIZER_KEYS
    if section == "digest":
        return ("key_file",)
    return ()


# -- the result -------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class Config:
    """Everything the settings describe, checked, ready for the component that reads it."""

    policy: LoopPolicy
    """The loop policy."""
    normalizer: Normalizer
    """The signature normalizer (with the digest key, when this tripwire takes one)."""
    limits: Limits | None
    """The run budgets; ``None`` when no setting turns one on."""
    digest_key: bytes | None
    """The keyed-digest secret (``TRIPWIRE_DIGEST_KEY`` / ``_FILE``, ``[digest] key_file``)."""
    max_traces: int | None
    """Runs watched at once; ``None``: the component's default."""
    idle_ttl_s: float | None
    """Idle seconds before a run's state is dropped; ``None``: the component's default."""
    serve: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))
    """The ``[serve]`` section as written (:func:`load_serve_config` checks it)."""
    files: tuple[str, ...] = ()
    """The files read, configuration file first."""


# -- layers -----------------------------------------------------------------------------------


@dataclass(slots=True)
class _Layer:
    """What one source (a file, the environment, the options) says; values keep their origin."""

    preset: tuple[str, str] | None = None
    policy_object: tuple[LoopPolicy, str] | None = None
    policy: dict[str, tuple[Any, str]] = field(default_factory=dict)
    polling_add: list[str] = field(default_factory=list)
    volatile_add: list[str] = field(default_factory=list)
    volatile_remove: list[str] = field(default_factory=list)
    max_bytes: tuple[Any, str] | None = None
    normalizer_object: Normalizer | None = None
    limits_object: Limits | None = None
    limits: dict[str, tuple[Any, str]] = field(default_factory=dict)
    digest_key: tuple[bytes, str] | None = None
    engine: dict[str, tuple[Any, str]] = field(default_factory=dict)
    serve: dict[str, Any] = field(default_factory=dict)
    source: str | None = None
    """The file, for a file's layer."""


def _unknown(where: str, data: Mapping[str, Any], allowed: Sequence[str], source: str) -> None:
    for key in data:
        if key not in allowed:
            name = f"{where}.{key}" if where else key
            kind = "section" if not where and key not in ("version", "preset") else "key"
            raise ConfigError(
                name, data[key], f"one of {', '.join(allowed)}",
                message=f"{source}: unknown {kind} {name!r}; accepted here: {', '.join(allowed)}",
            )


def _table(where: str, value: Any, source: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(where, _short(value), "a table")
    return value


def _strings(origin: str, value: Any) -> list[str]:
    if not isinstance(value, list) or not all(isinstance(v, str) and v for v in value):
        raise ConfigError(origin, _short(value), "a list of non-empty strings")
    return value


def _retry(origin: str, data: Any, source: str) -> RetryPolicy:
    table = _table(origin, data, source)
    _unknown(origin, table, _RETRY_KEYS, source)
    kwargs = dict(table)
    if "errors" in kwargs:
        kwargs["errors"] = frozenset(_strings(f"{origin}.errors", kwargs["errors"]))
    try:
        return RetryPolicy(**kwargs)
    except ConfigError as exc:
        name = exc.field.removeprefix("RetryPolicy.")
        raise ConfigError(f"{origin}.{name}", exc.value, exc.expected) from None
    except TypeError as exc:  # a wrongly typed value the dataclass could not take
        raise ConfigError(origin, _short(data), f"valid RetryPolicy settings ({exc})") from None


def _poll(origin: str, data: Any, source: str) -> Poll:
    table = _table(origin, data, source)
    _unknown(origin, table, _POLL_KEYS, source)
    for key in _POLL_KEYS:
        if key not in table:
            raise ConfigError(
                f"{origin}.{key}", None, "a number of seconds (interval_s and max_wait_s are both required)"
            )
    try:
        return Poll(**table)
    except ConfigError as exc:
        raise ConfigError(f"{origin}.{exc.field.removeprefix('Poll.')}", exc.value, exc.expected) from None


def read_toml(path: str | os.PathLike[str], origin: str, what: str = "the file") -> Mapping[str, Any]:
    """Read a TOML file; every failure is a :class:`ConfigError` whose ``field`` is ``origin``.

    ``what`` names the file in the message (``the policy file``).

    A file that is not UTF-8, not TOML, not a regular file or larger than 1 MiB is refused.
    """
    text_path = os.fspath(path)
    try:
        info = os.stat(text_path)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(origin, text_path, "a regular file",
                              message=f"{what} {text_path} ({origin}) is not a regular file")
        if info.st_size > 1 << 20:
            raise ConfigError(origin, text_path, "a TOML file of at most 1 MiB",
                              message=f"{what} {text_path} ({origin}) is larger than 1 MiB; is it the right file?")
        with open(text_path, "rb") as fh:
            raw = fh.read(1 << 20)
    except OSError as exc:
        raise ConfigError(origin, text_path, "a readable TOML file",
                          message=f"cannot read {what} {text_path} ({origin}): {exc.strerror or exc}; check the path") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ConfigError(origin, text_path, "a UTF-8 TOML file",
                          message=f"{what} {text_path} ({origin}) is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None
    try:
        data: dict[str, Any] = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(origin, text_path, "valid TOML",
                          message=f"{what} {text_path} ({origin}) is not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(origin, text_path, "valid TOML",
                          message=f"{what} {text_path} ({origin}) is nested too deeply to be a tripwire file") from None
    return data


def _file_layer(data: Mapping[str, Any], source: str, *, policy_only: bool) -> _Layer:
    """One file's layer; every error's ``field`` is the dotted key, its message names the file."""
    try:
        layer = _parse_file(data, source, policy_only=policy_only)
    except ConfigError as exc:
        raise _in_file(exc, source) from None
    layer.source = source
    return layer


def _in_file(exc: ConfigError, source: str) -> ConfigError:
    if exc.message.startswith(f"{source}: "):
        return exc
    return ConfigError(exc.field, exc.value, exc.expected, message=f"{source}: {exc.message}")


def _parse_file(data: Mapping[str, Any], source: str, *, policy_only: bool) -> _Layer:
    top = _POLICY_FILE_TOP if policy_only else ("version", "preset", *_SECTIONS)
    if policy_only:
        for key in data:
            if key in _SECTIONS and key not in top:
                raise ConfigError(
                    key, data[key], "version, preset, [policy] or [normalizer]",
                    message=f"{source}: a policy file holds only version, preset, [policy] "
                    f"and [normalizer]; put [{key}] in the configuration file "
                    "(--config / TRIPWIRE_CONFIG)",
                )
    _unknown("", data, top, source)
    version = data.get("version")
    if isinstance(version, bool) or version not in FILE_VERSIONS:
        if version is None:
            message = f"{source}: the file needs a version key (version = 1)"
        elif isinstance(version, str) and version.strip() in {str(v) for v in FILE_VERSIONS}:
            message = (f"{source}: version must be a number, not a string: write "
                       f"version = {version.strip()} (without quotes)")
        else:
            message = (f"{source}: file version {_short(version)!r} is not supported by this "
                       f"tripwire (supported: {list(FILE_VERSIONS)}); upgrade tripwire")
        raise ConfigError("version", _short(version), f"one of {list(FILE_VERSIONS)}",
                          message=message)
    layer = _Layer()
    if "preset" in data:
        preset = data["preset"]
        if not isinstance(preset, str) or preset not in PRESETS:
            expected = f"a preset name (one of {sorted(PRESETS)})"
            raise ConfigError("preset", _short(preset), expected,
                              message=f"{source}: preset must be {expected}, got {_short(preset)!r}")
        layer.preset = (preset, "preset")

    policy = _table("policy", data.get("policy", {}), source)
    _unknown("policy", policy, _section_keys("policy"), source)
    for key, value in policy.items():
        origin = f"policy.{key}"
        if key in SETTINGS:
            layer.policy[key] = (SETTINGS[key].parse(value, origin), origin)
        elif key == "polling_tools":
            layer.policy[key] = (frozenset(_strings(origin, value)), origin)
        elif key == "retry":
            is_off = value is False or value == "off"
            layer.policy[key] = (None if is_off else _retry("policy.retry", value, source), origin)
        elif key == "retry_per_tool":
            table = _table(f"policy.{key}", value, source)
            layer.policy[key] = (
                {t: _retry(f"policy.{key}.{t}", rp, source) for t, rp in table.items()}, origin
            )
        elif key == "polls":
            table = _table(f"policy.{key}", value, source)
            layer.policy[key] = (
                {t: _poll(f"policy.{key}.{t}", poll, source) for t, poll in table.items()}, origin
            )
        else:  # a LoopPolicy field without a parser here: the policy checks it
            layer.policy[key] = (value, origin)

    norm = _table("normalizer", data.get("normalizer", {}), source)
    _unknown("normalizer", norm, _NORMALIZER_KEYS, source)
    layer.volatile_add = _strings("normalizer.volatile_keys_add",
                                  norm.get("volatile_keys_add", []))
    layer.volatile_remove = _strings("normalizer.volatile_keys_remove",
                                     norm.get("volatile_keys_remove", []))
    if "max_bytes" in norm:
        layer.max_bytes = (norm["max_bytes"], "normalizer.max_bytes")

    limits = _table("limits", data.get("limits", {}), source)
    _unknown("limits", limits, _section_keys("limits"), source)
    for key, value in limits.items():
        origin = f"limits.{key}"
        if key == "tool_caps":
            table = _table("limits.tool_caps", value, source)
            layer.limits[key] = ({t: _cap(f"{origin}.{t}", c) for t, c in table.items()}, origin)
        elif key == "levels":
            table = _table("limits.levels", value, source)
            _unknown("limits.levels", table, _LEVEL_KEYS, source)
            try:
                layer.limits[key] = (Levels(**table), origin)
            except ConfigError as exc:
                name = exc.field.removeprefix("Levels.")
                raise ConfigError(f"{origin}.{name}", exc.value, exc.expected) from None
        else:
            layer.limits[key] = (SETTINGS[key].parse(value, origin), origin)

    digest = _table("digest", data.get("digest", {}), source)
    _unknown("digest", digest, ("key_file",), source)
    if "key_file" in digest:
        origin = "digest.key_file"
        path = digest["key_file"]
        if not isinstance(path, str) or not path:
            raise ConfigError(origin, _short(path), "a file path")
        base = os.path.dirname(source)
        layer.digest_key = (_read_key_file(os.path.join(base, path), origin), origin)

    engine = _table("engine", data.get("engine", {}), source)
    _unknown("engine", engine, _section_keys("engine"), source)
    for key, value in engine.items():
        origin = f"engine.{key}"
        layer.engine[key] = (SETTINGS[key].parse(value, origin), origin)

    layer.serve = dict(_table("serve", data.get("serve", {}), source))
    return layer


def _cap(origin: str, value: Any) -> int:
    if isinstance(value, str) and re.fullmatch(r"[0-9]{1,19}", value.strip()):
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= _MAX_BUDGET:
        raise ConfigError(origin, _short(value), f"an integer from 0 to {_MAX_BUDGET}")
    return value


def _read_key_file(path: str, origin: str) -> bytes:
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError(origin, path, "a regular file holding the digest key")
        with open(path, "rb") as fh:
            raw = fh.read(_MAX_KEY_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError(origin, path, "a readable file holding the digest key",
                          message=f"{origin}: cannot read the digest key file {path} "
                          f"({exc.strerror or exc})") from None
    if len(raw) > _MAX_KEY_FILE_BYTES:
        raise ConfigError(origin, path, f"a key file of at most {_MAX_KEY_FILE_BYTES} bytes")
    return _check_key(raw.strip(), origin)


def _check_key(key: bytes, origin: str) -> bytes:
    if len(key) < _MIN_KEY_BYTES:
        # Never quote the secret: name its length only.
        raise ConfigError(
            origin, f"<a secret of {len(key)} bytes>", f"a secret of at least {_MIN_KEY_BYTES} bytes",
            message=f"{origin} holds a secret of {len(key)} bytes; a digest key needs at least "
            f"{_MIN_KEY_BYTES} (make one with: python -c \"import secrets; "
            "print(secrets.token_hex(32))\")",
        )
    return key


def _env_layer(env: Mapping[str, str]) -> tuple[_Layer, str | None, str | None]:
    """The environment's layer, and the configuration / policy file paths it names."""
    layer = _Layer()
    preset = env.get(env_name("preset"), "").strip()
    if preset:
        layer.preset = (preset, env_name("preset"))
    for setting in SETTINGS.values():
        var = setting.env
        if var not in env:
            continue
        raw = env[var]
        if not raw.strip():
            continue  # an empty variable is not set (shells make unsetting awkward)
        target = {"policy": layer.policy, "limits": layer.limits, "engine": layer.engine}
        target[setting.section][setting.name] = (setting.parse(raw, var), var)
    volatile = env.get(env_name("volatile_keys"), "").split()
    layer.volatile_add = [k for k in volatile if not k.startswith("-")]
    layer.volatile_remove = [k[1:] for k in volatile if k.startswith("-") and len(k) > 1]
    layer.polling_add = env.get(env_name("polling_tools"), "").split()
    caps = env.get(env_name("tool_caps"), "").split()
    if caps:
        layer.limits["tool_caps"] = (_parse_caps(caps, env_name("tool_caps")), env_name("tool_caps"))
    key_var, file_var = env_name("digest_key"), env_name("digest_key_file")
    if env.get(key_var) and env.get(file_var):
        raise ConfigError(key_var, "<hidden>", f"either {key_var} or {file_var}, not both",
                          message=f"both {key_var} and {file_var} are set; set one of them")
    if env.get(key_var):
        layer.digest_key = (_check_key(env[key_var].strip().encode("utf-8", "surrogateescape"),
                                       key_var), key_var)
    elif env.get(file_var):
        layer.digest_key = (_read_key_file(env[file_var], file_var), file_var)
    config_path = env.get(env_name("config"), "").strip() or None
    policy_path = env.get(env_name("policy"), "").strip() or None
    return layer, config_path, policy_path


def _parse_caps(items: Iterable[str], origin: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for item in items:
        tool, sep, cap = item.partition("=")
        if not sep or not tool:
            raise ConfigError(origin, _short(item), "tool=cap pairs, space-separated (send_email=1)")
        out[tool] = _cap(f"{origin} ({tool})", cap)
    return out


_OPTION_TABLES: Final = frozenset(
    {"config", "policy_file", "preset", "policy", "volatile_keys", "polling_tools", "normalizer",
     "limits", "tool_caps", "digest_key", "digest_key_file"}
)
OPTIONS: Final = frozenset(SETTINGS) | _OPTION_TABLES


def _options_layer(options: Mapping[str, Any], name: Callable[[str], str]) -> _Layer:
    layer = _Layer()
    for key, value in options.items():
        if value is None:
            continue
        origin = name(key)
        if key in SETTINGS:
            setting = SETTINGS[key]
            target = {"policy": layer.policy, "limits": layer.limits, "engine": layer.engine}
            target[setting.section][key] = (setting.parse(value, origin), origin)
        elif key == "preset":
            if not isinstance(value, str):
                raise ConfigError(origin, _short(value), f"a preset name (one of {sorted(PRESETS)})")
            layer.preset = (value, origin)
        elif key == "policy":
            if isinstance(value, LoopPolicy):
                layer.policy_object = (value, origin)
            elif isinstance(value, str) and value in PRESETS:
                layer.preset = (value, origin)
            else:
                raise ConfigError(
                    origin, _short(value),
                    f"a LoopPolicy or a preset name (one of {sorted(PRESETS)}); a policy file "
                    "goes in policy_file=",
                )
        elif key == "volatile_keys":
            keys = _strings(origin, list(value))
            layer.volatile_add = [k for k in keys if not k.startswith("-")]
            layer.volatile_remove = [k[1:] for k in keys if k.startswith("-") and len(k) > 1]
        elif key == "polling_tools":
            layer.polling_add = _strings(origin, list(value))
        elif key == "normalizer":
            if not isinstance(value, Normalizer):
                raise ConfigError(origin, _short(value), "a tripwire Normalizer")
            layer.normalizer_object = value
        elif key == "limits":
            if not isinstance(value, Limits):
                raise ConfigError(origin, _short(value), "a tripwire Limits, or None")
            layer.limits_object = value
        elif key == "tool_caps":
            if not isinstance(value, Mapping):
                raise ConfigError(origin, _short(value), "a mapping of tool name to cap")
            layer.limits["tool_caps"] = ({t: _cap(f"{origin}[{t!r}]", c) for t, c in value.items()},
                                         origin)
        elif key == "digest_key":
            if isinstance(value, str):
                value = value.encode("utf-8", "surrogateescape")
            if not isinstance(value, bytes):
                raise ConfigError(origin, "<hidden>", "the digest key as bytes or text")
            layer.digest_key = (_check_key(value, origin), origin)
        elif key == "digest_key_file":
            layer.digest_key = (_read_key_file(os.fspath(value), origin), origin)
        elif key not in ("config", "policy_file"):
            raise ConfigError(origin, _short(value), f"one of {', '.join(sorted(OPTIONS))}",
                              message=f"unknown setting {origin}; accepted: {', '.join(sorted(OPTIONS))}")
    return layer


def _keyword(key: str) -> str:
    return f"{key}="


# -- merging ----------------------------------------------------------------------------------


def load_config(
    options: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    option_name: Callable[[str], str] = _keyword,
) -> Config:
    """Load every setting: options > environment > policy file > configuration file > preset.

    Args:
        options: settings given in code or on the command line, by setting name (``window``,
            ``preset``, ``max_tool_calls``…); ``None`` values count as not given. Also
            ``config`` and ``policy_file`` (paths), ``policy`` (a ``LoopPolicy`` that replaces
            the preset and files' policy), ``normalizer`` (a ``Normalizer``), ``limits`` (a
            ``Limits``: its fields that are not ``None`` win), ``volatile_keys`` (keys to add;
            ``-key`` removes one), ``polling_tools``, ``tool_caps``, ``digest_key``,
            ``digest_key_file``.
        env: the environment (default ``os.environ``).
        option_name: how errors name an option (``--window`` on the command line).

    Raises:
        ConfigError: a file cannot be read or holds an unknown key, or a value is out of range;
            ``field`` names the option, the variable or the file and key it came from.
    """
    env = os.environ if env is None else env
    options = dict(options or {})
    env_layer, config_path, policy_path = _env_layer(env)
    origin_of_config = option_name("config")
    origin_of_policy = option_name("policy_file")
    if options.get("config") is not None:
        config_path = os.fspath(options["config"])
    else:
        origin_of_config = env_name("config")
    if options.get("policy_file") is not None:
        policy_path = os.fspath(options["policy_file"])
    else:
        origin_of_policy = env_name("policy")
    layers: list[_Layer] = []
    files: list[str] = []
    if config_path is not None:
        data = read_toml(config_path, origin_of_config, "the configuration file")
        layers.append(_file_layer(data, config_path, policy_only=False))
        files.append(config_path)
    if policy_path is not None:
        if policy_path in PRESETS and not os.path.exists(policy_path):
            raise ConfigError(
                origin_of_policy, policy_path, "a policy file path",
                message=f"{origin_of_policy} is a policy file path, and {policy_path!r} is a "
                f"preset name: set {env_name('preset')}={policy_path} (or --preset "
                f"{policy_path}) instead",
            )
        data = read_toml(policy_path, origin_of_policy, "the policy file")
        layers.append(_file_layer(data, policy_path, policy_only=True))
        files.append(policy_path)
    layers.append(env_layer)
    layers.append(_options_layer(options, option_name))
    return _merge(layers, tuple(files))


def config_from_file(data: Mapping[str, Any], source: str, *, policy_only: bool = False) -> Config:
    """The settings one parsed ``tripwire.toml`` describes, alone (no environment, no options).

    Raises:
        ConfigError: an unknown section or key, a missing version or a bad value; ``field`` is
            the dotted key (``policy.window``) and the message names ``source``.
    """
    return _merge([_file_layer(data, source, policy_only=policy_only)], (source,))


def _last(values: Iterable[tuple[Any, str] | None]) -> tuple[Any, str] | None:
    found = None
    for v in values:
        if v is not None:
            found = v
    return found


def _merge(layers: Sequence[_Layer], files: tuple[str, ...]) -> Config:
    # The policy: a LoopPolicy given in code replaces everything below it.
    start = 0
    base: LoopPolicy | None = None
    for i, layer in enumerate(layers):
        if layer.policy_object is not None:
            start, base = i, layer.policy_object[0]
    if base is None:
        chosen = _last(layer.preset for layer in layers)
        name, origin = chosen if chosen is not None else ("default", "the default preset")
        if name not in PRESETS:
            raise ConfigError(origin, _short(name), f"a preset name (one of {sorted(PRESETS)})")
        base = PRESETS[name]
    changes: dict[str, tuple[Any, str]] = {}
    polling: frozenset[str] | None = None
    files_of: dict[str, str] = {}
    """origin → the file it is a key of"""
    for layer in layers[start:] if layers[start].policy_object is not None else layers:
        for key, entry in layer.policy.items():
            changes[key] = entry
            if layer.source is not None:
                files_of[entry[1]] = layer.source
        if layer.polling_add:
            current = polling if polling is not None else changes.get(
                "polling_tools", (base.polling_tools, ""))[0]
            polling = frozenset(current) | frozenset(layer.polling_add)
            changes["polling_tools"] = (polling, "polling_tools")
    try:
        policy = _evolve(base, changes)
    except ConfigError as exc:
        raise _in_file(exc, files_of[exc.field]) if exc.field in files_of else exc from None

    try:
        normalizer = _normalizer(layers)
    except ConfigError as exc:
        source = next((la.source for la in layers if la.max_bytes and la.max_bytes[1] == exc.field), None)
        raise _in_file(exc, source) if source is not None else exc from None
    digest = _last(layer.digest_key for layer in layers)
    digest_key = digest[0] if digest is not None else None
    if digest_key is not None and "key" in {f.name for f in fields(Normalizer) if f.init}:
        normalizer = replace(normalizer, **{"key": digest_key})

    limit_changes: dict[str, tuple[Any, str]] = {}
    code_limits: Limits | None = None
    for layer in layers:
        limit_changes.update(layer.limits)
        if layer.source is not None:
            files_of.update((origin, layer.source) for _, origin in layer.limits.values())
        if layer.limits_object is not None:
            code_limits = layer.limits_object
    try:
        limits = _limits(code_limits, limit_changes)
    except ConfigError as exc:
        raise _in_file(exc, files_of[exc.field]) if exc.field in files_of else exc from None

    engine: dict[str, Any] = {}
    serve: dict[str, Any] = {}
    for layer in layers:
        engine.update({k: v for k, (v, _) in layer.engine.items()})
        serve.update(layer.serve)
    return Config(
        policy=policy,
        normalizer=normalizer,
        limits=limits,
        digest_key=digest_key,
        max_traces=engine.get("max_traces"),
        idle_ttl_s=engine.get("idle_ttl_s"),
        serve=MappingProxyType(serve),
        files=files,
    )


def _evolve(base: LoopPolicy, changes: Mapping[str, tuple[Any, str]]) -> LoopPolicy:
    if not changes:
        return base
    try:
        return base.evolve(**{k: v for k, (v, _) in changes.items()})
    except ConfigError as exc:
        # Name the setting that was given: threshold > window may come from either.
        field_name = exc.field.removeprefix("LoopPolicy.")
        given = changes.get(field_name)
        if given is None and field_name == "threshold" and "window" in changes:
            window, origin = changes["window"]
            raise ConfigError(
                origin, window, f"at least the threshold ({base.threshold})",
                message=f"{origin} {window} is below the policy's threshold ({base.threshold}), "
                "so the repetition rule could never trip; set the threshold too",
            ) from None
        if given is None:
            raise
        raise ConfigError(given[1], _short(exc.value), exc.expected) from None
    except TypeError as exc:  # a wrongly typed value in a file (a list for an integer...)
        raise ConfigError(", ".join(o for _, o in changes.values()), None,
                          f"valid LoopPolicy settings ({exc})") from None


def _normalizer(layers: Sequence[_Layer]) -> Normalizer:
    normalizer = DEFAULT_NORMALIZER
    max_bytes: tuple[Any, str] | None = None
    add: list[str] = []
    remove: list[str] = []
    for layer in layers:
        if layer.normalizer_object is not None:
            normalizer, add, remove, max_bytes = layer.normalizer_object, [], [], None
        if layer.max_bytes is not None:
            max_bytes = layer.max_bytes
        # a key removed by a later layer wins over one added by an earlier one, and back
        add = [k for k in add if k not in layer.volatile_remove] + layer.volatile_add
        remove = [k for k in remove if k not in layer.volatile_add] + layer.volatile_remove
    if max_bytes is not None:
        value, origin = max_bytes
        if isinstance(value, bool) or not isinstance(value, int) or not 64 <= value <= MAX_COUNT:
            raise ConfigError(origin, _short(value), f"an integer from 64 to {MAX_COUNT}")
        normalizer = replace(normalizer, max_bytes=value)
    if add or remove:
        normalizer = normalizer.with_volatile_keys(add=add, remove=remove)
    return normalizer


def _limits(code: Limits | None, changes: Mapping[str, tuple[Any, str]]) -> Limits | None:
    if code is not None:
        # Code wins: a field set in the Limits given in code is never overridden.
        changes = {
            k: v for k, v in changes.items()
            if (k == "tool_caps" and not code.tool_caps)
            or (k not in ("tool_caps", "levels") and getattr(code, k) is None)
        }
    values = {k: v for k, (v, _) in changes.items() if v is not None}
    if not values:
        return code
    try:
        return replace(code, **values) if code is not None else Limits(**values)
    except ConfigError as exc:
        given = changes.get(exc.field)
        if given is None:
            raise
        raise ConfigError(given[1], _short(exc.value), exc.expected) from None


# -- tripwire serve ---------------------------------------------------------------------------


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeSetting:
    """One setting of ``tripwire serve``: the ``[serve]`` key, its variable and its option."""

    name: str
    """The key in ``[serve]``; the variable is ``TRIPWIRE_`` + the name in upper case."""
    option: str
    """The command-line option (``--redis`` for ``redis_url``)."""
    kind: str
    """``str``, ``path`` (relative to the file it is written in), ``list`` (of strings; the
    variable is space-separated), ``int``, ``float``, ``bool`` or ``choice``."""
    default: Any = None
    minimum: float = 0
    maximum: float = MAX_COUNT
    choices: tuple[str, ...] = ()
    help: str = ""

    @property
    def env(self) -> str:
        """The environment variable."""
        return env_name(self.name)

    def _scalar(self) -> Setting:
        return Setting(name=self.name, section="serve", kind=self.kind, minimum=self.minimum,
                       maximum=self.maximum, choices=self.choices, help=self.help)

    def expected(self) -> str:
        """What the setting accepts, in words (for errors and the docs table)."""
        if self.kind in ("str", "path"):
            return "a non-empty string" if self.kind == "str" else "a file path"
        if self.kind == "list":
            return "a list of non-empty strings"
        return self._scalar().expected()

    def parse(self, value: Any, origin: str) -> Any:
        """The checked value; strings from variables and options are parsed.

        Raises:
            ConfigError: the value is not accepted; ``field`` is ``origin``.
        """
        if self.kind in ("str", "path"):
            if isinstance(value, os.PathLike):
                value = os.fspath(value)
            if not isinstance(value, str) or not value.strip() or len(value) > 4096:
                raise ConfigError(origin, _short(value) if self.kind == "path" else _hidden(value),
                                  self.expected())
            return value.strip()
        if self.kind == "list":
            if isinstance(value, str):
                value = value.split()
            if isinstance(value, tuple):
                value = list(value)
            return tuple(_strings(origin, value))
        return self._scalar().parse(value, origin)


def _hidden(value: Any) -> Any:
    """What an error quotes of a string setting: URLs and keys may carry secrets."""
    return _short(value) if not isinstance(value, str) else f"<a string of {len(value)} characters>"


SERVE_SETTINGS: Final[Mapping[str, ServeSetting]] = MappingProxyType({s.name: s for s in (
    ServeSetting(name="host", option="--host", kind="str", default="127.0.0.1",
                 help="the address to bind"),
    ServeSetting(name="port", option="--port", kind="int", default=4318, minimum=1,
                 maximum=65535, help="the port (4318 is OTLP/HTTP's)"),
    ServeSetting(name="store", option="--store", kind="str",
                 help="the run store: sqlite:///path or postgresql://user@host/db"),
    ServeSetting(name="redis_url", option="--redis", kind="str",
                 help="Redis for the kill channel (pub/sub and keys) and --state redis"),
    ServeSetting(name="state", option="--state", kind="choice", default="memory",
                 choices=("memory", "redis"),
                 help="where per-trace state lives (redis: stateless receivers; needs a Redis URL)"),
    ServeSetting(name="token_file", option="--token-file", kind="path",
                 help="a file of accepted bearer tokens, one per line, each alone or after its name (NAME TOKEN: an operator's Kill is recorded under it), beside TRIPWIRE_TOKEN"),
    ServeSetting(name="no_auth", option="--no-auth", kind="bool", default=False,
                 help="accept requests without a token (a trusted loopback only)"),
    ServeSetting(name="store_raw", option="--store-raw", kind="bool", default=False,
                 help="keep raw tool arguments in the run store (off: digests only)"),
    ServeSetting(name="reorder_ms", option="--reorder-ms", kind="int", default=200,
                 maximum=10_000, help="how long a span waits for the earlier spans of its trace"),
    ServeSetting(name="max_body_mb", option="--max-body-mb", kind="int", default=16, minimum=1,
                 maximum=1024, help="the largest request body, before and after gzip (413 above)"),
    ServeSetting(name="max_inflight", option="--max-inflight", kind="int", default=4,
                 minimum=1, maximum=4096,
                 help="export requests processed at once; more get 503 with Retry-After"),
    ServeSetting(name="max_buffered_spans", option="--max-buffered-spans", kind="int",
                 default=200_000, minimum=1, maximum=100_000_000,
                 help="spans waiting in the reorder buffer at most; more get 503 with Retry-After"),
    ServeSetting(name="spool", option="--spool", kind="path",
                 help="the write-ahead spool directory: accepted requests survive a crash of "
                 "the process and are replayed at the next start; 'off' turns it off"),
    ServeSetting(name="webhook_url", option="--webhook", kind="list", default=(),
                 help="POST each transition as JSON to these URLs"),
    ServeSetting(name="slack_webhook_url", option="--slack-webhook", kind="str",
                 help="a Slack incoming-webhook URL"),
    ServeSetting(name="pagerduty_routing_key", option="--pagerduty-key", kind="str",
                 help="a PagerDuty Events API v2 routing key"),
    ServeSetting(name="pagerduty_url", option="--pagerduty-url", kind="str",
                 default="https://events.pagerduty.com/v2/enqueue",
                 help="the PagerDuty Events API URL"),
    ServeSetting(name="dashboard_url", option="--dashboard-url", kind="str",
                 help="the public URL of this service, for links in alerts"),
    ServeSetting(name="log_format", option="--log-format", kind="choice", default="json",
                 choices=("json", "text"), help="log lines as JSON objects or text, on stderr"),
)})
"""Every setting of ``tripwire serve`` (the ``[serve]`` section), by name."""

def _serve_option(key: str) -> str:
    setting = SERVE_SETTINGS.get(key)
    return setting.option if setting is not None else "--" + key.replace("_", "-")


def load_serve_config(
    options: Mapping[str, Any] | None = None,
    *,
    env: Mapping[str, str] | None = None,
    option_name: Callable[[str], str] = _serve_option,
) -> tuple[Config, dict[str, Any]]:
    """``tripwire serve``'s settings: options > environment > ``[serve]`` > defaults.

    The loop policy, budgets, digest key and engine settings come from :func:`load_config`
    (same files, same variables); the serve settings (:data:`SERVE_SETTINGS`) from the
    configuration file's ``[serve]``, their variables (``TRIPWIRE_PORT``…) and ``options``.
    A ``path`` setting written in the file is relative to the file.

    Returns:
        The :class:`Config` and every serve setting by name (defaults filled in).

    Raises:
        ConfigError: an unknown ``[serve]`` key or a bad value; ``field`` is ``serve.port``,
            ``TRIPWIRE_PORT`` or ``--port``.
    """
    env = os.environ if env is None else env
    options = dict(options or {})
    general = {k: v for k, v in options.items() if k not in SERVE_SETTINGS}
    config = load_config(general, env=env, option_name=option_name)
    values: dict[str, Any] = {name: s.default for name, s in SERVE_SETTINGS.items()}
    if config.serve:
        source = config.files[0]
        try:
            _unknown("serve", config.serve, tuple(SERVE_SETTINGS), source)
            for key, raw in config.serve.items():
                setting = SERVE_SETTINGS[key]
                if setting.kind == "path" and raw == "off":
                    values[key] = "off"
                    continue
                value = setting.parse(raw, f"serve.{key}")
                if setting.kind == "path":
                    value = os.path.join(os.path.dirname(source), value)
                values[key] = value
        except ConfigError as exc:
            raise _in_file(exc, source) from None
    for setting in SERVE_SETTINGS.values():
        raw = env.get(setting.env, "")
        if raw.strip():
            values[setting.name] = setting.parse(raw, setting.env)
    for key, value in options.items():
        if key in SERVE_SETTINGS and value is not None:
            values[key] = SERVE_SETTINGS[key].parse(value, option_name(key))
    return config, values
