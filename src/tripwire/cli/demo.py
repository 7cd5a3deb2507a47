"""``tripwire demo``: a simulated fleet, a flat iteration cap vs tripwire, side by side."""

from __future__ import annotations

import typer
from rich.table import Table

from tripwire.cli import app
from tripwire.cli._common import abort, out_console, print_table
from tripwire.core.reasons import Verdict

_STYLE = {
    Verdict.WORKING: "green",
    Verdict.RETRYING: "cyan",
    Verdict.WAITING: "blue",
    Verdict.STUCK: "bold red",
    Verdict.UNCERTAIN: "yellow",
}


@app.command("demo", short_help="Play a simulated fleet: a flat cap vs tripwire, side by side.")
def demo(
    max_iterations: int = typer.Option(
        10, "--max-iterations", min=1, help="The flat cap to compare against."
    ),
) -> None:
    """Play seven scripted agents through tripwire's core and through a flat max_iterations cap.

    Runs offline in well under a second: no model, no network, no server. The kill switch
    stops a run at its first `stuck` verdict; every other verdict lets the run go on.
    """
    from tripwire.demo import play_all

    try:
        outcomes = list(play_all(max_iterations))
    except ValueError as exc:  # a ConfigError from an impossible cap
        abort(str(exc))

    table = Table(title="A flat cap vs tripwire", title_justify="left", show_lines=True)
    table.add_column("agent", ratio=3, min_width=18)
    table.add_column("calls", justify="right")
    table.add_column(f"cap={max_iterations}", ratio=2, min_width=14)
    table.add_column("tripwire", ratio=2, min_width=14)
    table.add_column("tripwire's verdict and why", ratio=5, min_width=30)
    totals = {"cap_wasted": 0, "cap_cut": 0, "tw_wasted": 0, "tw_cut": 0}
    for o in outcomes:
        cap_w, cap_c = o.wasted(o.cap_stop), o.cut_off(o.cap_stop)
        tw_w, tw_c = o.wasted(o.tripwire_stop), o.cut_off(o.tripwire_stop)
        totals["cap_wasted"] += cap_w
        totals["cap_cut"] += cap_c
        totals["tw_wasted"] += tw_w
        totals["tw_cut"] += tw_c
        table.add_row(
            o.scenario.name,
            str(o.planned),
            _cell(o.cap_stop, cap_w, cap_c),
            _cell(o.tripwire_stop, tw_w, tw_c),
            f"[{_STYLE[o.verdict]}]{o.verdict.value}[/]: {o.reason}",
        )
    print_table(table)
    out_console.print(
        f"[bold]flat cap:[/] {totals['cap_wasted']} calls wasted in loops, "
        f"{totals['cap_cut']} useful calls cut off.   "
        f"[bold]tripwire:[/] {totals['tw_wasted']} wasted, {totals['tw_cut']} cut off."
    )
    out_console.print(
        "[dim]Next: `tripwire replay` runs the same detection over your recorded OpenTelemetry "
        "traces; see README.md.[/]"
    )


def _cell(stop: int | None, wasted: int, cut: int) -> str:
    if stop is None:
        return "[green]let it finish[/]"
    text = f"stopped at call {stop}"
    if wasted:
        text += f"\n[red]{wasted} looping calls wasted[/]"
    if cut:
        text += f"\n[red]{cut} useful calls cut off[/]"
    if not wasted and not cut:
        text += "\n[green]at the loop[/]"
    return text
