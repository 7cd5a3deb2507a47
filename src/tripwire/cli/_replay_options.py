"""Options and plumbing shared by ``tripwire replay`` and ``tripwire calibrate``.

Defaults are never written here: help texts read them from the presets, so a tuned default
in :class:`~tripwire.core.policy.LoopPolicy` shows up in ``--help`` without a CLI change.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from types import EllipsisType
from typing import Annotated, Any, NoReturn

import typer
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn

from tripwire.cli._common import EXIT_USAGE, abort, err_console
from tripwire.core.policy import PRESETS, KeyMode, LoopPolicy
from tripwire.core.signature import DEFAULT_NORMALIZER, Normalizer
from tripwire.errors import ConfigError
from tripwire.replay.policyfile import apply_overrides, load_policy_file
from tripwire.replay.reader import STDIN, Problem, expand_paths

__all__ = [
    "MAX_PROBLEMS_SHOWN",
    "PROGRESS_MIN_BYTES",
    "PROGRESS_MIN_FILES",
    "abort_plain",
    "parse_off_int",
    "reading_progress",
    "report_problems",
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
        help="OTLP trace files (JSON, JSON Lines or protobuf, optionally gzip-compressed), "
        "directories (walked recursively for *.json, *.jsonl, *.pb… and their .gz), or - "
        "for standard input.",
        show_default=False,
    ),
]
PolicyPath = Annotated[
    str | None,
    typer.Option(
        "--policy",
        envvar="TRIPWIRE_POLICY",
        metavar="FILE",
        help="A versioned policy file (tripwire.toml, see docs/replay.md). Options below "
        "override its values.",
        show_default=False,
    ),
]
PolicyPreset = Annotated[
    str | None,
    typer.Option(
        "--policy-preset",
        envvar="TRIPWIRE_POLICY_PRESET",
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
JsonOut = Annotated[
    bool,
    typer.Option(
        "--json", envvar="TRIPWIRE_JSON",
        help="Write JSON Lines to stdout instead of a table.",
    ),
]


def abort_plain(text: str, code: int = EXIT_USAGE) -> NoReturn:
    """:func:`~tripwire.cli._common.abort` with ``text`` taken literally (no rich markup).

    Messages carry paths, option values and hints like ``pip install 'tripwire[plot]'``,
    whose square brackets rich would otherwise read as markup and drop.
    """
    from rich.markup import escape

    abort(escape(text), code)


def parse_off_int(option: str, value: str | None, minimum: int) -> int | EllipsisType | None:
    """``None`` → ``...`` (not given), ``off`` → ``None``, else an int >= ``minimum``."""
    if value is None:
        return ...
    if value.strip().lower() in ("off", "none"):
        return None
    try:
        number = int(value)
    except ValueError:
        abort_plain(f"{option} must be an integer >= {minimum} or 'off', got {value!r}")
    if number < minimum:
        abort_plain(f"{option} must be an integer >= {minimum} or 'off', got {value!r}")
    return number


def resolve_policy(
    *,
    policy_file: str | None,
    preset: str | None,
    window: int | None = None,
    threshold: int | None = None,
    key: KeyMode | None = None,
    max_period: str | None = None,
    min_repeats: int | None = None,
    volatile_keys: Sequence[str] | None = None,
    polling_tools: Sequence[str] | None = None,
) -> tuple[LoopPolicy, Normalizer]:
    """The policy and normalizer the options describe: preset → policy file → options.

    Exits with code 2 (through :func:`abort`) on an invalid combination.
    """
    try:
        if policy_file is not None:
            loaded = load_policy_file(policy_file)
            policy, normalizer = loaded.policy, loaded.normalizer
            if preset is not None and preset != loaded.policy.name:
                base = LoopPolicy.preset(preset)
                abort_plain(
                    f"--policy-preset {preset} conflicts with the policy file {policy_file} "
                    f"(preset {loaded.policy.name!r}); set 'preset = \"{base.name}\"' in the file "
                    "or drop the option"
                )
        else:
            policy = LoopPolicy.preset(preset or "default")
            normalizer = DEFAULT_NORMALIZER
        changes: dict[str, Any] = {
            "window": window,
            "threshold": threshold,
            "key": key,
            "min_repeats": min_repeats,
        }
        mp = parse_off_int("--max-period", max_period, 2)
        add = [k for k in volatile_keys or () if not k.startswith("-")]
        remove = [k[1:] for k in volatile_keys or () if k.startswith("-") and len(k) > 1]
        if mp is not ...:
            policy = policy.evolve(max_period=mp)
        if window is not None and threshold is None and policy.threshold > window:
            abort_plain(
                f"--window {window} is below the policy's threshold ({policy.threshold}), so "
                "the repetition rule could never trip; pass --threshold too"
            )
        return apply_overrides(
            policy,
            normalizer,
            policy_changes=changes,
            volatile_add=add,
            volatile_remove=remove,
            polling_tools=polling_tools or (),
        )
    except ConfigError as exc:
        abort_plain(f"invalid policy: {exc}")


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
    if STDIN in paths or not err_console.is_terminal:
        yield None
        return
    sizes: list[int] = []
    for path, _ in expand_paths(paths):
        try:
            sizes.append(os.path.getsize(path))
        except OSError:
            sizes.append(0)
    total = sum(sizes)
    if total < PROGRESS_MIN_BYTES and len(sizes) < PROGRESS_MIN_FILES:
        yield None
        return
    progress = Progress(
        TextColumn("reading traces"),
        BarColumn(),
        DownloadColumn(),
        TimeRemainingColumn(),
        console=err_console,
        transient=True,
    )
    task = progress.add_task("read", total=total)

    def on_file(_path: str, nbytes: int) -> None:
        progress.advance(task, nbytes)

    with progress:
        yield on_file
