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


# Commands register themselves on import. Keep one line per command module.
from tripwire.cli import demo as _demo  # noqa: E402,F401

for _optional in ("explain", "replay", "calibrate", "runs"):
    try:
        __import__(f"tripwire.cli.{_optional}")
    except ModuleNotFoundError as _exc:  # the command module is not written yet
        if _exc.name != f"tripwire.cli.{_optional}":
            raise


def main() -> None:
    """Console-script entry point."""
    app()
