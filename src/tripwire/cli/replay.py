"""``tripwire replay PATH...``: what a loop policy would have done to recorded traces."""

from __future__ import annotations

import gc
from collections import Counter
from collections.abc import Sequence
from enum import Enum
from typing import TYPE_CHECKING, Annotated

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
    Key,
    MaxFileSize,
    MaxPeriod,
    MinRepeats,
    Paths,
    PolicyPath,
    PolicyPreset,
    PollingTools,
    Threshold,
    VolatileKeys,
    Window,
    abort_plain,
    parse_size,
    replay_progress,
    report_problems,
    resolve_policy,
)

if TYPE_CHECKING:
    from tripwire.core.policy import LoopPolicy
    from tripwire.core.signature import Normalizer
    from tripwire.replay.engine import Replayed, TraceResult

__all__ = ["replay"]

_VERDICT_STYLES = {
    "working": "green",
    "retrying": "cyan",
    "waiting": "cyan",
    "stuck": "bold red",
    "uncertain": "yellow",
}


class FailOn(str, Enum):
    """Final verdicts that make ``replay`` exit with code 1."""

    STUCK = "stuck"
    UNCERTAIN = "uncertain"


_HELP = "\n\n".join(
    (
        "Replay a loop policy over recorded traces, without calling any model.",
        "Reads OTLP traces (what OpenTelemetry exporters and the Collector write), groups the "
        "tool calls by trace across files, and reports per trace the verdict at the end, the "
        "call at which it first became stuck, the repeated call (tool and signature prefix, "
        "never the arguments) and how many calls came after. The policy comes from a preset, "
        "then a policy file, then the options.",
        "Exit codes: 0 OK; 1 a trace ended with a --fail-on verdict; 2 a usage error or "
        "unreadable input (unless --keep-going); 3 no trace at all in the input (an empty "
        "directory, an exporter that wrote nothing).",
    )
)


@app.command(
    "replay",
    help=_HELP,
    short_help="Run a loop policy over recorded OTLP traces, offline.",
)
def replay(
    ctx: typer.Context,
    paths: Paths,
    config: ConfigPath = None,
    policy_file: PolicyPath = None,
    policy_preset: PolicyPreset = None,
    window: Window = None,
    threshold: Threshold = None,
    key: Key = None,
    max_period: MaxPeriod = None,
    min_repeats: MinRepeats = None,
    volatile_key: VolatileKeys = None,
    polling_tool: PollingTools = None,
    json_out: JsonOut = False,
    max_file_size: MaxFileSize = None,
    fail_on: Annotated[
        list[FailOn] | None,
        typer.Option(
            "--fail-on", envvar="TRIPWIRE_FAIL_ON", show_default=False, case_sensitive=False,
            help="Exit with code 1 when any trace ends with this verdict (for CI gates); "
            "repeatable.",
        ),
    ] = None,
    skip_empty: Annotated[
        bool,
        typer.Option(
            "--skip-empty", envvar="TRIPWIRE_SKIP_EMPTY",
            help="Leave out traces without any tool call. By default they are reported, "
            "with 0 tool calls and verdict 'working'.",
        ),
    ] = False,
    keep_going: Annotated[
        bool,
        typer.Option(
            "--keep-going", envvar="TRIPWIRE_KEEP_GOING",
            help="Report unreadable input as warnings and exit as if it were not there. By "
            "default the rest is still replayed, then the exit code is 2.",
        ),
    ] = False,
    workers: Annotated[
        int,
        typer.Option(
            "--workers", envvar="TRIPWIRE_WORKERS", min=0,
            help="Processes to replay the traces in (Linux; 0 = one per CPU, at most 4, once "
            "the input takes 16 MiB or more). The output does not depend on it.",
        ),
    ] = 0,
) -> None:
    """Replay a loop policy over recorded traces, without calling any model (see _HELP)."""
    policy, normalizer = resolve_policy(
        ctx,
        config=config,
        policy_file=policy_file,
        preset=policy_preset,
        window=window,
        threshold=threshold,
        key=key,
        max_period=max_period,
        min_repeats=min_repeats,
        volatile_keys=volatile_key,
        polling_tools=polling_tool,
    )
    max_bytes = parse_size("--max-file-size", max_file_size)
    # Reading and replaying build objects (spans, calls, loop states) that stay alive until
    # the results are out and hold no reference cycles: a collection meanwhile would only walk
    # them, over and over as they grow. The collector is paused until then.
    collecting = gc.isenabled()
    gc.disable()
    try:
        replayed = _read_and_replay(
            paths, policy, normalizer, max_bytes, skip_empty=skip_empty, workers=workers
        )
    finally:
        if collecting:
            gc.enable()
    results = replayed.results
    n_errors = report_problems(replayed.problems, as_warnings=keep_going)
    if not replayed.traces and n_errors:
        abort_plain("no trace could be read; check the paths and formats above (see docs/replay.md)")
    if not replayed.traces:
        abort_plain(
            f"no traces in the input ({replayed.files} file(s) read, {replayed.spans} span(s)); "
            "check the paths, and that the exporter wrote anything",
            code=EXIT_NO_INPUT,
        )

    if json_out:
        import msgspec

        encode = msgspec.json.encode
        lines: list[str] = []
        for r in results:
            obj = r.to_json()
            obj["sources"] = list(r.sources)  # join verdicts to a per-file labels file
            lines.append(encode(obj).decode())
            if len(lines) == 1024:  # one write per 1,024 traces, not one flush per trace
                typer.echo("\n".join(lines))
                lines = []
        if lines:
            typer.echo("\n".join(lines))
    else:
        _table(results, policy.version, normalizer.version)

    if n_errors and not keep_going:
        abort_plain(
            f"{n_errors} input problem(s), listed above; the rest was replayed. Fix the input, "
            "or pass --keep-going to exit on the replay alone",
            code=EXIT_USAGE,
        )
    if fail_on:
        wanted = {f.value for f in fail_on}
        failing = Counter(r.verdict.value for r in results if r.verdict.value in wanted)
        if failing:
            what = ", ".join(f"{n} {v}" for v, n in sorted(failing.items()))
            abort_plain(
                f"{sum(failing.values())} trace(s) ended with a --fail-on verdict ({what})",
                code=EXIT_DETECTED,
            )
    if not results:
        err_console.print("[dim]no trace with a tool call in the input (--skip-empty)[/]")


def _read_and_replay(
    paths: list[str],
    policy: LoopPolicy,
    normalizer: Normalizer,
    max_bytes: int,
    *,
    skip_empty: bool,
    workers: int,
) -> Replayed:
    from tripwire.replay.engine import replay_all

    with replay_progress(paths) as (on_file, on_replayed):
        return replay_all(
            paths,
            policy,
            normalizer,
            skip_empty=skip_empty,
            on_file=on_file,
            on_replayed=on_replayed,
            max_file_bytes=max_bytes,
            workers=workers,
        )


def _table(results: Sequence[TraceResult], policy_version: str, normalizer_version: str) -> None:
    from rich.table import Table
    from rich.text import Text

    from tripwire.core.reasons import Rule

    table = Table(
        title=f"replay · policy {policy_version} · normalizer {normalizer_version}",
        title_justify="left",
        show_lines=False,
    )
    table.add_column("trace", no_wrap=True)
    table.add_column("file", overflow="fold")
    table.add_column("agent", overflow="fold")
    table.add_column("calls", justify="right", no_wrap=True)
    table.add_column("verdict", no_wrap=True, min_width=9)
    table.add_column("tripped at", overflow="fold")
    table.add_column("repeated call", overflow="fold")
    table.add_column("after", justify="right", no_wrap=True)

    verdicts: Counter[str] = Counter()
    calls = after = tripped = no_args = 0
    for r in results:
        verdicts[r.verdict.value] += 1
        calls += r.tool_calls
        after += r.calls_after_trip
        no_args += not r.arguments_seen and r.tool_calls > 0
        trip = r.first_trip
        if trip is None:
            at, repeated, after_text = Text("—", style="dim"), Text("—", style="dim"), Text("—", style="dim")
        else:
            tripped += 1
            at = Text(f"call {trip.call_index} · {trip.rule.value}")
            sig = f" {trip.digest[:8]}…" if trip.digest else ""
            if trip.rule is Rule.PERIOD:
                repeated = Text(f"cycle of {trip.period} ending {trip.tool}{sig} x{trip.hits}")
            elif trip.rule in (Rule.SAME_ERROR, Rule.FAILURES):
                repeated = Text(f"{trip.hits} failures ending {trip.tool}")
            else:
                repeated = Text(f"{trip.tool}{sig} x{trip.hits}")
            after_text = Text(str(r.calls_after_trip))
        verdict = Text(r.verdict.value, style=_VERDICT_STYLES.get(r.verdict.value, ""))
        if not r.arguments_seen and r.tool_calls:
            verdict.append(" (no args)", style="dim")
        files = r.sources[0] if r.sources else "—"
        if len(r.sources) > 1:
            files += f" +{len(r.sources) - 1}"
        table.add_row(
            Text(r.trace_id[:12]),
            Text(files),
            Text(r.agent or "—", style="" if r.agent else "dim"),
            str(r.tool_calls),
            verdict,
            at,
            repeated,
            after_text,
        )
    print_table(table)
    parts = [f"{len(results)} trace(s)", f"{calls} tool call(s)"]
    parts += [f"{verdicts[v]} {v}" for v in ("stuck", "uncertain", "retrying", "waiting", "working") if verdicts[v]]
    parts.append(f"{tripped} tripped stuck at some point")
    parts.append(f"{after} call(s) after the first trip")
    out_console.print("totals: " + " · ".join(parts), highlight=False)
    if no_args:
        err_console.print(
            f"[yellow]note:[/] {no_args} trace(s) recorded no tool arguments, so their "
            "signatures are name-only; switch argument capture on, or pass --key tool to let "
            "the tool name decide",
            highlight=False,
        )
