"""The ``tripwire`` command line: a typer app; one module per command.

Exit codes: 0 OK, 1 a failure or a detection you asked to fail on, 2 a usage error.
"""

from __future__ import annotations

import os
import sys

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
    """Console-script entry point.

    An output that cannot be written (a full disk, ``> /dev/full``, a closed pipe), or a file
    error a command did not handle itself, ends the command with one line on standard error and
    exit code 1, never a traceback.
    """
    try:
        try:
            app()
        finally:
            sys.stdout.flush()  # what is still buffered fails here, not in the interpreter's exit
    except OSError as exc:
        # Nothing more can reach standard output: point it at the null device, so that the
        # interpreter's own flush at exit does not complain again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        if exc.filename:  # not the output: a file a command did not handle itself
            print(f"error: {exc.filename}: {exc.strerror or exc}", file=sys.stderr)
        elif not isinstance(exc, BrokenPipeError):  # the reader left (| head): nothing to say
            print(f"error: cannot write the output: {exc.strerror or exc}", file=sys.stderr)
        sys.exit(1)
