"""The ``tripwire`` command line: a typer app; one module per command.

Exit codes: 0 OK, 1 a failure or a detection you asked to fail on, 2 a usage error.
"""

from __future__ import annotations

import typer

from tripwire._version import __version__

__all__ = ["app", "main"]

app = typer.Typer(
    name="tripwire",
    help="Stop AI agents that are stuck in loops, enforce run budgets, prove why runs stopped.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_show_locals=False,  # locals hold tool arguments
    rich_markup_mode=None,  # help texts are literal: "pip install 'tripwire[plot]'" keeps its [plot]
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version_callback(value: bool) -> None:
    if value:
        typer.echo(f"tripwire {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: bool = typer.Option(
        False, "--version", "-V", help="Print the version and exit.", callback=_version_callback,
        is_eager=True,
    ),
) -> None:
    """tripwire: tell stuck agents from busy ones, guard budgets, receipt every stop."""


# Commands register themselves on import: one module per command.
from tripwire.cli import calibrate as _calibrate  # noqa: E402,F401
from tripwire.cli import demo as _demo  # noqa: E402,F401
from tripwire.cli import explain as _explain  # noqa: E402,F401
from tripwire.cli import replay as _replay  # noqa: E402,F401
from tripwire.cli import report as _report  # noqa: E402,F401
from tripwire.cli import serve as _serve  # noqa: E402,F401


def main() -> None:
    """Console-script entry point."""
    app()
