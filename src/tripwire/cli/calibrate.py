"""``tripwire calibrate PATH... --labels FILE``: which window and threshold fit your history."""

from __future__ import annotations

import os
from typing import Annotated

import typer

from tripwire.cli import app
from tripwire.cli._common import (
    EXIT_DETECTED,
    EXIT_NO_INPUT,
    EXIT_USAGE,
    err_console,
    out_console,
    print_table,
)
from tripwire.cli._replay_options import (
    ConfigPath,
    JsonOut,
    MaxFileSize,
    Paths,
    PolicyPath,
    PolicyPreset,
    PollingTools,
    VolatileKeys,
    abort_plain,
    parse_size,
    reading_progress,
    report_problems,
    resolve_policy,
)
from tripwire.core.policy import KeyMode

__all__ = ["calibrate"]

_HELP = "\n\n".join(
    (
        "Measure catches, false alarms and detection delay for a grid of loop policies on "
        "labelled traces, and recommend one.",
        "Labels (JSON Lines) say per trace whether it was an incident: "
        '{"trace_id": …, "incident": true, "incident_from": 12} or, per trace file, '
        '{"file": "relative/to/labels.json", "label": "runaway"}. The traces are read once; '
        "every policy of the grid (window x threshold x key x max period, around the base "
        "policy from --policy-preset / --policy) is replayed over them.",
        "Per policy: incidents caught, healthy traces flagged (false alarms), median delay in "
        "calls after the incident began (call 1 when not labelled), median first flag as a "
        "share of the trace, and the share of the incidents' calls after the first flag (what "
        "stopping there saves). ★ marks the Pareto front, → the recommendation: the most "
        "catches with false alarms under --max-false-alarms, among the settings that keep "
        "tripwire's promises (the 4th identical call is the one stopped; a batch of different "
        "calls to one tool is not a loop). ✗ marks a row that breaks one, with why; it is "
        "recommended only with --any-setting.",
        "With --line-alpha, it also learns a step line per agent (or per source, --line-per): "
        "the tool-call count that healthy runs exceed with probability at most alpha "
        "(split-conformal over the labelled healthy runs), and --write-limits writes it as "
        "[limits] max_tool_calls in a tripwire.toml, to apply beside the loop rules.",
        "Exit codes: 0 OK; 1 no policy meets the false-alarm cap; 2 a usage error or "
        "unreadable input (unless --keep-going); 3 no trace at all in the input.",
    )
)


def _ints(option: str, text: str | None, minimum: int) -> list[int] | None:
    if text is None:
        return None
    out: list[int] = []
    for part in text.split(","):
        part = part.strip()
        try:
            value = int(part)
        except ValueError:
            abort_plain(f"{option} takes a comma-separated list of integers >= {minimum}, got {part!r}")
        if value < minimum:
            abort_plain(f"{option} takes integers >= {minimum}, got {value}")
        out.append(value)
    return sorted(set(out))


def _periods(text: str | None) -> list[int | None] | None:
    if text is None:
        return None
    out: list[int | None] = []
    for part in text.split(","):
        part = part.strip().lower()
        if part in ("off", "none"):
            value: int | None = None
        else:
            try:
                value = int(part)
            except ValueError:
                abort_plain(f"--max-periods takes integers >= 2 or 'off', comma-separated; got {part!r}")
            if value < 2:
                abort_plain(f"--max-periods takes integers >= 2 or 'off', got {value}")
        if value not in out:
            out.append(value)
    return out


def _keys(text: str | None) -> list[KeyMode] | None:
    if text is None:
        return None
    out: list[KeyMode] = []
    for part in text.split(","):
        try:
            key = KeyMode(part.strip().lower())
        except ValueError:
            abort_plain(f"--keys takes 'tool+args' and/or 'tool', comma-separated; got {part.strip()!r}")
        if key not in out:
            out.append(key)
    return out


@app.command(
    "calibrate",
    help=_HELP,
    short_help="Pick window/threshold from labelled traces: catches vs false alarms.",
)
def calibrate(
    ctx: typer.Context,
    paths: Paths,
    labels: Annotated[
        str,
        typer.Option(
            "--labels", envvar="TRIPWIRE_LABELS", metavar="FILE", show_default=False,
            help="Labels, JSON Lines: per trace id ('incident': true/false, optional "
            "'incident_from') or per file ('file' relative to the labels file, 'label').",
        ),
    ],
    incident_label: Annotated[
        list[str] | None,
        typer.Option(
            "--incident-label", envvar="TRIPWIRE_INCIDENT_LABELS", metavar="VALUE",
            show_default=False,
            help="A 'label' value that marks an incident; repeatable. Default: runaway.",
        ),
    ] = None,
    healthy_label: Annotated[
        list[str] | None,
        typer.Option(
            "--healthy-label", envvar="TRIPWIRE_HEALTHY_LABELS", metavar="VALUE",
            show_default=False,
            help="A 'label' value that marks a healthy run (must not be flagged); repeatable. "
            "Default: healthy. Other values are ignored.",
        ),
    ] = None,
    windows: Annotated[
        str | None,
        typer.Option(
            "--windows", envvar="TRIPWIRE_WINDOWS", metavar="N,N…", show_default=False,
            help="Windows to try, comma-separated. Default: 6,10,15,20,30 and the base policy's.",
        ),
    ] = None,
    thresholds: Annotated[
        str | None,
        typer.Option(
            "--thresholds", envvar="TRIPWIRE_THRESHOLDS", metavar="N,N…", show_default=False,
            help="Thresholds to try, comma-separated. Default: 3,4,5,6 and the base policy's.",
        ),
    ] = None,
    keys: Annotated[
        str | None,
        typer.Option(
            "--keys", envvar="TRIPWIRE_KEYS", metavar="KEY,…", show_default=False,
            help="Key modes to try: tool+args, tool. Default: both.",
        ),
    ] = None,
    max_periods: Annotated[
        str | None,
        typer.Option(
            "--max-periods", envvar="TRIPWIRE_MAX_PERIODS", metavar="N|off,…", show_default=False,
            help="Longest cycles to try, or 'off'. Default: off,3,6 and the base policy's.",
        ),
    ] = None,
    config: ConfigPath = None,
    policy_file: PolicyPath = None,
    policy_preset: PolicyPreset = None,
    volatile_key: VolatileKeys = None,
    polling_tool: PollingTools = None,
    max_false_alarms: Annotated[
        float,
        typer.Option(
            "--max-false-alarms", envvar="TRIPWIRE_MAX_FALSE_ALARMS", min=0.0, max=1.0,
            help="The highest share of healthy traces the recommended policy may flag.",
        ),
    ] = 0.02,
    any_setting: Annotated[
        bool,
        typer.Option(
            "--any-setting", envvar="TRIPWIRE_ANY_SETTING",
            help="Also recommend a setting that breaks a promise of the loop rules (a threshold "
            "other than 4, the 'tool' key); such rows are marked ✗ either way.",
        ),
    ] = False,
    json_out: JsonOut = False,
    max_file_size: MaxFileSize = None,
    plot: Annotated[
        str | None,
        typer.Option(
            "--plot", envvar="TRIPWIRE_PLOT", metavar="FILE.png", show_default=False,
            help="Draw catch rate vs false-alarm rate, Pareto front highlighted, to a .png, "
            ".svg or .pdf file (needs pip install 'tripwire[plot]').",
        ),
    ] = None,
    workers: Annotated[
        int,
        typer.Option(
            "--workers", envvar="TRIPWIRE_WORKERS", min=0,
            help="Processes for the grid (0 = one per CPU, at most 4). Results do not depend on it.",
        ),
    ] = 0,
    line_alpha: Annotated[
        float | None,
        typer.Option(
            "--line-alpha", envvar="TRIPWIRE_LINE_ALPHA", metavar="ALPHA", show_default=False,
            help="Also learn a step line with this false-stop rate (e.g. 0.05: at most about 5% "
            "of healthy runs go over it); needs at least (1-ALPHA)/ALPHA healthy runs per group.",
        ),
    ] = None,
    line_per: Annotated[
        str,
        typer.Option(
            "--line-per", envvar="TRIPWIRE_LINE_PER", metavar="agent|source|all",
            help="Learn one line per agent (the trace's agent name), per source (the label's "
            "'source'), or one for all runs.",
        ),
    ] = "agent",
    write_limits: Annotated[
        str | None,
        typer.Option(
            "--write-limits", envvar="TRIPWIRE_WRITE_LIMITS", metavar="FILE.toml", show_default=False,
            help="Write the learned line as [limits] max_tool_calls to this new file; with more "
            "than one group, one file per group (FILE.<group>.toml). Needs --line-alpha.",
        ),
    ] = None,
    keep_going: Annotated[
        bool,
        typer.Option(
            "--keep-going", envvar="TRIPWIRE_KEEP_GOING",
            help="Report unreadable traces or labels as warnings instead of exiting with code 2.",
        ),
    ] = False,
) -> None:
    """Calibrate a loop policy on labelled traces (see _HELP)."""
    from tripwire.errors import ConfigError
    from tripwire.replay.calibrate import (
        DEFAULT_HEALTHY_LABELS,
        DEFAULT_INCIDENT_LABELS,
        assign_labels,
        default_grid_axes,
        load_labels,
        policy_grid,
    )
    from tripwire.replay.calibrate import calibrate as run_grid
    from tripwire.replay.engine import load_traces

    if plot is not None:
        _check_plot(plot)  # before the grid runs, not after
    max_bytes = parse_size("--max-file-size", max_file_size)
    if line_per not in ("agent", "source", "all"):
        abort_plain(f"--line-per takes agent, source or all; got {line_per!r}")
    if line_alpha is not None and not 0 < line_alpha < 1:
        abort_plain(f"--line-alpha takes a false-stop rate above 0 and below 1 (e.g. 0.05); got {line_alpha:g}")
    if write_limits is not None and line_alpha is None:
        abort_plain("--write-limits writes a learned step line: pass --line-alpha too (e.g. --line-alpha 0.05)")
    base, normalizer = resolve_policy(
        ctx,
        config=config,
        policy_file=policy_file,
        preset=policy_preset,
        volatile_keys=volatile_key,
        polling_tools=polling_tool,
    )
    axes = default_grid_axes(base)
    try:
        grid = policy_grid(
            base,
            windows=_ints("--windows", windows, 1) or list(axes["window"]),
            thresholds=_ints("--thresholds", thresholds, 2) or list(axes["threshold"]),
            keys=_keys(keys) or list(axes["key"]),
            max_periods=_periods(max_periods) or list(axes["max_period"]),
        )
    except ConfigError as exc:  # a grid value out of the policy's range (--windows 300000000)
        option = {"window": "--windows", "threshold": "--thresholds", "max_period": "--max-periods"}.get(exc.field)
        abort_plain(f"{option or 'a grid value'}: {exc}")
    if not grid:
        abort_plain("the grid is empty: every threshold is above every window; widen --windows or lower --thresholds")

    try:
        label_set = load_labels(
            labels,
            incident_labels=incident_label or DEFAULT_INCIDENT_LABELS,
            healthy_labels=healthy_label or DEFAULT_HEALTHY_LABELS,
        )
    except ConfigError as exc:
        abort_plain(str(exc))
    with reading_progress(paths) as on_file:
        loaded = load_traces(paths, normalizer, on_file=on_file, max_file_bytes=max_bytes)
    n_errors = report_problems([*label_set.problems, *loaded.problems], as_warnings=keep_going)
    if not loaded.traces:
        abort_plain(
            "no trace could be read; check the paths and formats above" if n_errors else
            f"no traces in the input ({loaded.files} file(s) read); check the paths",
            code=EXIT_USAGE if n_errors else EXIT_NO_INPUT,
        )
    labelled, unmatched = assign_labels(loaded.traces, label_set)
    n_inc = sum(1 for x in labelled if x.label.incident)
    n_ok = len(labelled) - n_inc
    err_console.print(
        f"[dim]{len(loaded.traces)} trace(s) read; {n_inc} incident(s) and {n_ok} healthy "
        f"labelled; {label_set.ignored} label(s) with other values ignored; {unmatched} "
        f"label(s) matched no trace; {len(grid)} policies[/]",
        highlight=False,
    )
    if n_inc == 0:
        abort_plain(
            "no labelled incident among the traces, so nothing can be caught; check --labels, "
            "--incident-label and that the label paths point at the trace files"
        )
    if n_ok == 0:
        err_console.print("[yellow]warning:[/] no healthy trace is labelled: false alarms cannot be measured")

    n_workers = workers or min(4, os.cpu_count() or 1)
    if sum(len(x.trace.calls) for x in labelled) * len(grid) < 200_000:
        n_workers = 1  # not worth a pool

    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn

    progress = Progress(
        TextColumn("replaying policies"), BarColumn(), MofNCompleteColumn(),
        console=err_console, transient=True, disable=not err_console.is_terminal,
    )
    with progress:
        task = progress.add_task("grid", total=len(grid))
        try:
            result = run_grid(
                labelled,
                grid,
                max_false_alarms=max_false_alarms,
                workers=n_workers,
                on_policy=lambda done: progress.update(task, completed=done),
                shippable_only=not any_setting,
            )
        except ConfigError as exc:
            abort_plain(str(exc))

    order = sorted(
        range(len(result.scores)),
        key=lambda i: (result.scores[i].false_alarm_rate, -result.scores[i].catch_rate, i),
    )
    if json_out:
        import msgspec

        for i in order:
            typer.echo(msgspec.json.encode(result.scores[i].to_json()).decode())
    else:
        _table(result, order)

    if line_alpha is not None:
        _step_lines(labelled, line_alpha, line_per, write_limits, json_out=json_out)

    if plot is not None:
        from tripwire.replay.plot import PlotUnavailable, plot_calibration

        try:
            plot_calibration(result, plot)
        except PlotUnavailable as exc:
            abort_plain(str(exc))
        except OSError as exc:
            abort_plain(f"cannot write the plot to {plot} ({exc.strerror or exc}); check the path")
        err_console.print(f"[dim]plot written to {plot}[/]", highlight=False)

    if n_errors and not keep_going:
        abort_plain(
            f"{n_errors} input problem(s), listed above; the rest was used. Fix the input, or "
            "pass --keep-going",
            code=EXIT_USAGE,
        )
    if result.recommended is None:
        under = [s for s in result.scores if s.false_alarm_rate <= max_false_alarms + 1e-12]
        if under:
            abort_plain(
                f"only settings that break a promise of the loop rules (marked ✗: {under[0].caveat}) "
                f"flag at most {max_false_alarms:.1%} of healthy traces; raise --max-false-alarms, "
                "try larger --windows, or pass --any-setting to have one recommended anyway",
                code=EXIT_DETECTED,
            )
        abort_plain(
            f"no policy flags at most {max_false_alarms:.1%} of healthy traces; raise "
            "--max-false-alarms, or try larger --thresholds / --windows",
            code=EXIT_DETECTED,
        )


PLOT_FORMATS = (".png", ".svg", ".pdf")
"""The file types ``--plot`` writes (told by the extension)."""


def _check_plot(path: str) -> None:
    """Refuse a ``--plot`` target that cannot be written, before any work is done."""
    ext = os.path.splitext(path)[1].lower()
    if ext not in PLOT_FORMATS:
        what = f"has the extension {ext!r}" if ext else "has no extension"
        abort_plain(
            f"--plot {path} {what}; name the file with one of {', '.join(PLOT_FORMATS)} "
            f"(for example {os.path.splitext(path)[0] or 'tradeoff'}.png)"
        )
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        abort_plain("--plot needs matplotlib, which is not installed: pip install 'tripwire[plot]'")
    folder = os.path.dirname(path) or "."
    if not os.path.isdir(folder):
        abort_plain(f"--plot {path}: the folder {folder} does not exist")


def _table(result: object, order: list[int]) -> None:
    from rich.table import Table
    from rich.text import Text

    from tripwire.replay.calibrate import Calibration

    assert isinstance(result, Calibration)
    table = Table(
        title=(
            f"calibrate · false-alarm cap {result.max_false_alarms:.1%} · ★ Pareto front · → recommended"
            " · ✗ breaks a promise"
        ),
        title_justify="left",
    )
    for name, justify in (
        ("", "left"),
        ("key", "left"),
        ("win", "right"),
        ("thr", "right"),
        ("per", "right"),
        ("caught", "right"),
        ("flagged ok", "right"),
        ("delay", "right"),
        ("at", "right"),
        ("saved", "right"),
    ):
        table.add_column(name, justify=justify, no_wrap=True)  # type: ignore[arg-type]
    for i in order:
        s = result.scores[i]
        p = s.policy
        mark = ("→" if s.recommended else " ") + ("★" if s.pareto else " ") + (" " if s.ships else "✗")
        style = "bold green" if s.recommended else ("bold" if s.pareto else ("dim" if not s.ships else ""))
        table.add_row(
            Text(mark),
            p.key.value,
            str(p.window),
            str(p.threshold),
            "off" if p.max_period is None else str(p.max_period),
            f"{s.caught} {s.catch_rate:.0%}",
            f"{s.false_alarms} {s.false_alarm_rate:.1%}",
            "—" if s.median_delay is None else f"{s.median_delay:g}",
            "—" if s.median_flag_position is None else f"{s.median_flag_position:.0%}",
            f"{s.saved_share:.0%}",
            style=style,
        )
    print_table(table)
    first = result.scores[0]
    out_console.print(
        f"caught: of {first.incidents} incidents · flagged ok: false alarms, of {first.healthy} "
        "healthy traces · delay: median calls from the incident's start to the first flag · "
        "at: median first flag as a share of the trace · saved: incidents' calls after the "
        "first flag",
        highlight=False,
        style="dim",
    )
    caveats = sorted({c for s in result.scores for c in s.caveat.split("; ") if c})
    if caveats:
        out_console.print(
            "✗ breaks a promise of the loop rules ("
            + "; ".join(caveats)
            + ("): shown, not recommended without --any-setting" if result.shippable_only else ")"),
            highlight=False,
            style="dim",
        )
    if result.recommended is not None:
        rec = result.scores[result.recommended]
        p = rec.policy
        mp = "off" if p.max_period is None else p.max_period
        out_console.print(
            f"recommended: --key {p.key.value} --window {p.window} --threshold {p.threshold} "
            f"--max-period {mp}  (policy {p.version}): catches {rec.catch_rate:.0%} of "
            f"incidents, flags {rec.false_alarm_rate:.1%} of healthy traces"
            + (f"; ✗ {rec.caveat}" if rec.caveat else ""),
            highlight=False,
        )


def _step_lines(labelled: object, alpha: float, per: str, write_limits: str | None, *, json_out: bool = False) -> None:
    """Learn, print (a table, or with ``--json`` a ``{"step_line": ...}`` line per group) and,
    with ``--write-limits``, write the step line of each group: every file or none."""
    from pathlib import Path

    from rich.markup import escape
    from rich.table import Table

    from tripwire.replay.calibrate import learn_step_lines, limits_file_text

    groups = learn_step_lines(labelled, alpha=alpha, per=per)  # type: ignore[arg-type]
    if json_out:
        import msgspec

        for g in groups:
            learned_line = g.line is not None
            typer.echo(msgspec.json.encode({"step_line": {
                "per": per, "group": g.group, "alpha": alpha, "healthy": g.healthy,
                "incidents": g.incidents,
                "max_tool_calls": g.line.max_tool_calls if g.line is not None else None,
                "incidents_over": g.incidents_over if learned_line else None,
                "healthy_over": g.healthy_over if learned_line else None,
                "refused": g.refused or None,
            }}).decode())
    else:
        table = Table(
            title=f"step line per {per} · alpha {alpha:g} (split-conformal over healthy runs)",
            title_justify="left",
        )
        for name in ("group", "healthy", "max_tool_calls", "incidents over", "healthy over"):
            table.add_column(name, justify="left" if name == "group" else "right", no_wrap=True)
        for g in groups:
            if g.line is None:
                table.add_row(escape(g.group), str(g.healthy), "—", "—", "—")
            else:
                table.add_row(escape(g.group), str(g.healthy), str(g.line.max_tool_calls),
                              f"{g.incidents_over}/{g.incidents}", f"{g.healthy_over}/{g.healthy}")
        out_console.print(table)
    for g in groups:
        if g.line is None:
            err_console.print(f"[yellow]{escape(g.group)}:[/] {escape(g.refused)}", highlight=False)
    if write_limits is None:
        return
    learned = [g for g in groups if g.line is not None]
    if not learned:
        abort_plain("no step line could be learned (too few healthy runs in every group); nothing written")
    target = Path(write_limits)
    if len(groups) == 1:
        paths = {learned[0].group: target}
    else:
        names = _file_names([g.group for g in learned])
        suffix = target.suffix or ".toml"
        paths = {g.group: target.with_name(f"{target.stem}.{names[g.group]}{suffix}") for g in learned}
    # Every file is checked before one is written, and a failed write takes back the others
    # written: after fixing the cause, the same command starts from the same place.
    for path in paths.values():
        if path.exists():
            abort_plain(f"{path} exists; tripwire calibrate writes only new files (pass another --write-limits); nothing written")
    written: list[Path] = []
    for g in learned:
        path = paths[g.group]
        try:
            with path.open("x", encoding="utf-8") as fh:
                written.append(path)
                fh.write(limits_file_text(g))
        except OSError as exc:
            for done in written:
                done.unlink(missing_ok=True)
            abort_plain(f"cannot write {path} ({exc.strerror or exc}); check the path; nothing written")
    for g in learned:
        assert g.line is not None
        err_console.print(f"[dim]{escape(g.group)}: max_tool_calls = {g.line.max_tool_calls} written to {paths[g.group]}[/]", highlight=False)


def _safe(name: str) -> str:
    return "".join(c if c.isalnum() or c in "-_" else "_" for c in name) or "_"


def _file_names(groups: list[str]) -> dict[str, str]:
    """Each group's part of a file name: its name made safe, with a digest of the name where
    two groups would share one (``a/b`` and ``a:b`` are both ``a_b``; ``A`` and ``a`` on a
    disk blind to case)."""
    import hashlib

    safe = {g: _safe(g) for g in groups}
    seen: dict[str, int] = {}
    for name in safe.values():
        seen[name.lower()] = seen.get(name.lower(), 0) + 1
    return {
        g: name if seen[name.lower()] == 1 else f"{name}-{hashlib.sha256(g.encode()).hexdigest()[:8]}"
        for g, name in safe.items()
    }
