"""``tripwire demo``: a simulated fleet, a flat iteration cap vs tripwire, side by side."""

from __future__ import annotations

import typer
from rich.markup import escape
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
    serve: bool = typer.Option(
        False, "--serve", help="Instead: start tripwire serve with a simulated fleet sending it OTLP, and print the dashboard's address (needs the serve extra)."
    ),
    port: int = typer.Option(4318, min=1, max=65535, help="With --serve: the port (on 127.0.0.1)."),
    duration: float | None = typer.Option(None, min=1, help="With --serve: stop after this many seconds (default: run until Ctrl-C)."),
) -> None:
    """Play seven scripted agents through tripwire's core and through a flat max_iterations cap.

    Runs offline in well under a second: no model, no network, no server. The kill switch
    stops a run at its first `stuck` verdict; every other verdict lets the run go on.

    With --serve: the fleet service on a fresh embedded SQLite store, fed real OTLP by a
    simulated fleet (looping, healthy, and over-budget agents that really stop when flagged),
    with the dashboard at http://127.0.0.1:PORT/.
    """
    if serve:
        _serve_demo(port, duration)
        return
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
            f"[{_STYLE[o.verdict]}]{o.verdict.value}[/]: {escape(o.reason)}",  # "[policy.polls.x]" is text
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


def _serve_demo(port: int, duration: float | None) -> None:
    import secrets
    import shlex
    import tempfile
    import threading
    from pathlib import Path

    try:
        import uvicorn

        from tripwire.core.budget import Limits
        from tripwire.serve import ServeConfig, Service, create_app
        from tripwire.serve.demo import run_fleet
        from tripwire.store.runs import RunStore
    except ImportError as exc:
        abort(f"tripwire demo --serve needs the serve extra: pip install -e '.[serve]' ({exc.name} is missing)")
    token = secrets.token_urlsafe(24)
    folder = Path(tempfile.mkdtemp(prefix="tripwire-demo-"))
    store_url = f"sqlite:///{folder / 'runs.db'}"
    config = ServeConfig(
        store_url=store_url, tokens=(token,), token_names=("demo token",),
        limits=Limits(max_tool_calls=50), reorder_s=0.1,
    )
    store = RunStore.open(store_url)
    service = Service(config, store=store)
    app_ = create_app(config, service=service)
    from tripwire.serve.connections import http_protocol

    server = uvicorn.Server(
        uvicorn.Config(app_, host="127.0.0.1", port=port, log_level="warning", http=http_protocol(config.header_timeout_s))
    )
    stop = threading.Event()
    url = f"http://127.0.0.1:{port}"

    def fleet() -> None:
        while not (server.started and service.started.is_set()) and not stop.is_set():
            stop.wait(0.05)
        run_fleet(url, token, stop)

    def timer() -> None:
        if duration is not None and not stop.wait(duration):
            server.should_exit = True

    out_console.print(
        f"[bold]tripwire serve[/] with a simulated fleet: dashboard at [bold]{url}/[/] "
        f"(sign in with the token [bold]{token}[/]); run store {store_url}; Ctrl-C stops it.",
        soft_wrap=True,
    )
    report = f"tripwire report --store {shlex.quote(store_url)}"
    out_console.print(f"Report on its runs, now or after: [bold]{escape(report)}[/]", soft_wrap=True)
    threads = [threading.Thread(target=fleet, daemon=True), threading.Thread(target=timer, daemon=True)]
    for t in threads:
        t.start()
    try:
        server.run()
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=10)
        import tripwire.remote

        tripwire.remote.disconnect()
        out_console.print(f"The demo's runs stay in {store_url}: {escape(report)}", soft_wrap=True, highlight=False)
