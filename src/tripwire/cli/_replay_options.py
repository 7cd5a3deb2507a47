"""Options and plumbing shared by ``tripwire replay`` and ``tripwire calibrate``.

Defaults are never written here: help texts read them from the presets, so a tuned default
in :class:`~tripwire.core.policy.LoopPolicy` shows up in ``--help`` without a CLI change.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Annotated, Any, Final, NoReturn

import typer
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeRemainingColumn

from tripwire.cli._common import EXIT_USAGE, abort, err_console
from tripwire.config import Config, load_config
from tripwire.core.policy import PRESETS, KeyMode, LoopPolicy
from tripwire.core.signature import Normalizer
from tripwire.errors import ConfigError
from tripwire.replay.reader import STDIN, Problem, expand_paths

__all__ = [
    "MAX_PROBLEMS_SHOWN",
    "PROGRESS_MIN_BYTES",
    "PROGRESS_MIN_FILES",
    "ConfigPath",
    "JsonOut",
    "MaxFileSize",
    "abort_plain",
    "parse_size",
    "reading_progress",
    "replay_progress",
    "report_problems",
    "resolve_config",
    "resolve_policy",
]

PROGRESS_MIN_BYTES = 8 * 1024 * 1024
"""Inputs above this many bytes get a progress bar (on a terminal)."""
PROGRESS_MIN_FILES = 200
"""Or above this many files."""
MAX_PROBLEMS_SHOWN = 20
"""Input problems printed one by one; the rest are counted."""

_DEFAULT = LoopPolicy()
_PRESETS = ", ".join(sorted(PRESETS))


def _mp(p: LoopPolicy) -> str:
    return "off" if p.max_period is None else str(p.max_period)


# -- option types (typer.Annotated, shared by both commands) ----------------------------------

Paths = Annotated[
    list[str],
    typer.Argument(
        metavar="PATH",
        help="OTLP trace files (JSON, JSON Lines or protobuf, optionally gzip-compressed), "
        "directories (walked recursively for *.json, *.jsonl, *.pb… and their .gz), or - "
        "for standard input.",
        show_default=False,
    ),
]
ConfigPath = Annotated[
    str | None,
    typer.Option(
        "--config",
        envvar="TRIPWIRE_CONFIG",
        metavar="FILE",
        help="A tripwire.toml configuration file ([policy], [normalizer], [limits]…; see "
        "docs/config.md). The policy file and the options below override it.",
        show_default=False,
    ),
]
PolicyPath = Annotated[
    str | None,
    typer.Option(
        "--policy",
        envvar="TRIPWIRE_POLICY",
        metavar="FILE",
        help="A versioned policy file (version, preset, [policy], [normalizer]; see "
        "docs/replay.md). Options below override its values.",
        show_default=False,
    ),
]
PolicyPreset = Annotated[
    str | None,
    typer.Option(
        "--preset",
        "--policy-preset",
        envvar="TRIPWIRE_PRESET",
        metavar="NAME",
        help=f"Start from a named preset ({_PRESETS}). Default: the policy file's preset, "
        "else 'default'. 'seed' is the plain rule: same tool + arguments 4 times in 10 calls.",
        show_default=False,
    ),
]
Window = Annotated[
    int | None,
    typer.Option(
        "--window", envvar="TRIPWIRE_WINDOW", min=1, show_default=False,
        help=f"Calls the repetition rule looks back over. Default: the preset's ({_DEFAULT.window} in 'default').",
    ),
]
Threshold = Annotated[
    int | None,
    typer.Option(
        "--threshold", envvar="TRIPWIRE_THRESHOLD", min=2, show_default=False,
        help=f"Identical calls within the window that trip the rule. Default: the preset's ({_DEFAULT.threshold} in 'default').",
    ),
]
Key = Annotated[
    KeyMode | None,
    typer.Option(
        "--key", envvar="TRIPWIRE_KEY", show_default=False, case_sensitive=False,
        help="What makes two calls the same: 'tool+args', or 'tool' (name only: for small "
        "catalogs, or traces recorded without arguments). Default: the preset's "
        f"({_DEFAULT.key.value} in 'default').",
    ),
]
MaxPeriod = Annotated[
    str | None,
    typer.Option(
        "--max-period", envvar="TRIPWIRE_MAX_PERIOD", metavar="N|off", show_default=False,
        help=f"Longest cycle (A B A B…) the period rule looks for, or 'off'. Default: the preset's ({_mp(_DEFAULT)} in 'default').",
    ),
]
MinRepeats = Annotated[
    int | None,
    typer.Option(
        "--min-repeats", envvar="TRIPWIRE_MIN_REPEATS", min=2, show_default=False,
        help=f"Back-to-back repetitions of a cycle that trip the period rule. Default: the preset's ({_DEFAULT.min_repeats} in 'default').",
    ),
]
VolatileKeys = Annotated[
    list[str] | None,
    typer.Option(
        "--volatile-key", envvar="TRIPWIRE_VOLATILE_KEYS", metavar="KEY", show_default=False,
        help="An argument key to ignore at every depth (a timestamp, a request id); "
        "repeatable. Prefix with '-' to stop ignoring a default one (--volatile-key=-now). "
        "The env var takes a space-separated list.",
    ),
]
PollingTools = Annotated[
    list[str] | None,
    typer.Option(
        "--polling-tool", envvar="TRIPWIRE_POLLING_TOOLS", metavar="TOOL", show_default=False,
        help="A tool that legitimately repeats while it waits (a job status check): a changed "
        "result counts as progress; repeatable. The env var takes a space-separated list.",
    ),
]
_SIZE_VARIABLE: Final = "TRIPWIRE_MAX_FILE_SIZE"
MaxFileSize = Annotated[
    str | None,
    typer.Option(
        "--max-file-size", envvar=_SIZE_VARIABLE, metavar="SIZE", show_default=False,
        help="The most one trace file may take, on disk and once decompressed (a gzip bomb "
        "stops there); a larger file is reported as a bad file. Bytes, or with K, M, G. "
        "Default: 1G.",
    ),
]
JsonOut = Annotated[
    bool,
    typer.Option(
        "--json", envvar="TRIPWIRE_JSON",
        help="Write JSON Lines to stdout instead of a table.",
    ),
]


def parse_size(option: str, text: str | None) -> int:
    """``--max-file-size``: bytes, or a number with K/M/G (powers of 1024); default the reader's."""
    from tripwire.replay.reader import DEFAULT_MAX_FILE_BYTES

    if text is None:
        return DEFAULT_MAX_FILE_BYTES
    import re

    match = re.fullmatch(r"\s*([0-9]{1,15})\s*([kKmMgGtT]?)(i?[bB])?\s*", text)
    if match is None:
        abort_plain(f"{option} (or {_SIZE_VARIABLE}) takes a size in bytes, or with K, M or G (512M, 2G); got {text[:40]!r}")
    number = int(match.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30, "t": 40}[match.group(2).lower()]
    if number < 1024:
        abort_plain(f"{option} (or {_SIZE_VARIABLE}) must be at least 1K, got {text[:40]!r}")
    return number


def abort_plain(text: str, code: int = EXIT_USAGE) -> NoReturn:
    """:func:`~tripwire.cli._common.abort` (which takes ``text`` literally too)."""
    abort(text, code)


_CLICK_PARAMS: Final = {
    "config": "config",
    "policy_file": "policy_file",
    "preset": "policy_preset",
    "window": "window",
    "threshold": "threshold",
    "key": "key",
    "max_period": "max_period",
    "min_repeats": "min_repeats",
    "volatile_keys": "volatile_key",
    "polling_tools": "polling_tool",
}
"""Setting name → the command's parameter name."""
_OPTION_NAMES: Final = {
    "config": "--config",
    "policy_file": "--policy",
    "preset": "--preset",
    "volatile_keys": "--volatile-key",
    "polling_tools": "--polling-tool",
}


def _option_name(setting: str) -> str:
    return _OPTION_NAMES.get(setting, "--" + setting.replace("_", "-"))


def resolve_config(ctx: typer.Context | None = None, **given: Any) -> Config:
    """The settings the command line, the environment and the files describe.

    ``given`` are the command's option values by setting name (``preset``, ``window``,
    ``volatile_keys``…). Values the command's ``ctx`` says came from an environment variable
    are left to the loader, which reads the environment itself and names the variable in its
    errors.

    Exits with code 2 (through :func:`abort`) on an invalid setting.
    """
    options: dict[str, Any] = {}
    for name, value in given.items():
        if value is None or value == []:
            continue
        if ctx is not None:
            source = ctx.get_parameter_source(_CLICK_PARAMS.get(name, name))
            if getattr(source, "name", None) == "ENVIRONMENT":
                continue
        options[name] = value
    try:
        return load_config(options, option_name=_option_name)
    except ConfigError as exc:
        abort_plain(f"invalid configuration: {exc}")


def resolve_policy(
    ctx: typer.Context | None = None,
    *,
    config: str | None = None,
    policy_file: str | None = None,
    preset: str | None = None,
    window: int | None = None,
    threshold: int | None = None,
    key: KeyMode | None = None,
    max_period: str | None = None,
    min_repeats: int | None = None,
    volatile_keys: Sequence[str] | None = None,
    polling_tools: Sequence[str] | None = None,
) -> tuple[LoopPolicy, Normalizer]:
    """The policy and normalizer of :func:`resolve_config` (the replay commands need these)."""
    loaded = resolve_config(
        ctx,
        config=config,
        policy_file=policy_file,
        preset=preset,
        window=window,
        threshold=threshold,
        key=key,
        max_period=max_period,
        min_repeats=min_repeats,
        volatile_keys=list(volatile_keys) if volatile_keys else None,
        polling_tools=list(polling_tools) if polling_tools else None,
    )
    return loaded.policy, loaded.normalizer


def report_problems(problems: Sequence[Problem], *, as_warnings: bool) -> int:
    """Print input problems on stderr; return how many are errors (skipped files are notes)."""
    errors = [p for p in problems if not p.skipped]
    for p in problems:
        if p.skipped:
            err_console.print(f"[dim]note: {p}[/]", highlight=False, markup=True)
    label = "[yellow]warning:[/]" if as_warnings else "[bold red]error:[/]"
    for p in errors[:MAX_PROBLEMS_SHOWN]:
        err_console.print(f"{label} {_escape(str(p))}", highlight=False)
    if len(errors) > MAX_PROBLEMS_SHOWN:
        err_console.print(f"{label} … and {len(errors) - MAX_PROBLEMS_SHOWN} more input problem(s)", highlight=False)
    return len(errors)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)


@contextmanager
def reading_progress(paths: Sequence[str]) -> Iterator[Callable[[str, int], None] | None]:
    """A progress bar on stderr while large inputs are read; yields the ``on_file`` callback.

    No bar for small inputs, for standard input, or when stderr is not a terminal.
    """
    with replay_progress(paths) as (on_file, _on_replayed):
        yield on_file


@contextmanager
def replay_progress(
    paths: Sequence[str],
) -> Iterator[tuple[Callable[[str, int], None] | None, Callable[[int, int], None] | None]]:
    """Progress bars on stderr while large inputs are read, then replayed; yields the
    ``on_file`` and ``on_replayed`` callbacks of :func:`~tripwire.replay.engine.replay_all`.

    No bar for small inputs, for standard input, or when stderr is not a terminal.
    """
    if STDIN in paths or not err_console.is_terminal:
        yield None, None
        return
    sizes: list[int] = []
    for path, _ in expand_paths(paths):
        try:
            sizes.append(os.path.getsize(path))
        except OSError:
            sizes.append(0)
    total = sum(sizes)
    if total < PROGRESS_MIN_BYTES and len(sizes) < PROGRESS_MIN_FILES:
        yield None, None
        return
    progress = Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.fields[amount]}"),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
    )
    read = progress.add_task("reading traces", total=total, amount="")
    replayed: list[TaskID] = []

    done_bytes = [0]

    def on_file(_path: str, nbytes: int) -> None:
        done_bytes[0] += nbytes
        progress.update(
            read, completed=done_bytes[0], amount=f"{done_bytes[0] / 2**20:,.0f}/{total / 2**20:,.0f} MiB"
        )

    def on_replayed(done: int, traces: int) -> None:
        if not replayed:
            progress.update(read, completed=total)
            replayed.append(progress.add_task("replaying traces", total=traces, amount=""))
        progress.update(replayed[0], completed=done, total=traces, amount=f"{done:,}/{traces:,} traces")

    with progress:
        yield on_file, on_replayed
