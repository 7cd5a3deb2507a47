"""Shared CLI plumbing: consoles, the single exit path, table output that survives a pipe."""

from __future__ import annotations

from typing import Final, NoReturn

import typer
from rich.console import Console, RenderableType
from rich.markup import escape

__all__ = [
    "EXIT_DETECTED",
    "EXIT_NO_INPUT",
    "EXIT_OK",
    "EXIT_USAGE",
    "PIPE_WIDTH",
    "abort",
    "err_console",
    "out_console",
    "print_table",
]

EXIT_OK = 0
EXIT_DETECTED = 1
"""A failure, or a detection the user asked to fail on (``--fail-on``)."""
EXIT_USAGE = 2
"""A usage error: bad option, unreadable input, invalid configuration."""
EXIT_NO_INPUT = 3
"""``replay`` / ``calibrate`` read no trace at all: an empty directory, an exporter that wrote
nothing. A CI gate must not pass on that."""

PIPE_WIDTH: Final = 4000
"""The width tables are laid out for when stdout is not a terminal (a pipe, a CI log): wide
enough that no column is ever cropped; each table still takes only the width it needs."""

out_console = Console(soft_wrap=True)
"""Tables and data go to stdout. Lines of text are never hard-wrapped (soft wrap)."""
err_console = Console(stderr=True, soft_wrap=True)
"""Diagnostics, progress bars and errors go to stderr, never hard-wrapped mid-sentence."""


def print_table(renderable: RenderableType) -> None:
    """Print a table on stdout: to the terminal's width, or uncropped when piped."""
    if out_console.is_terminal:
        out_console.print(renderable)
        return
    # A console of its own: print(width=...) cannot go above the console's width (80 when piped).
    wide = Console(file=out_console.file, width=PIPE_WIDTH, soft_wrap=True,
                   color_system="auto" if out_console.color_system else None, no_color=out_console.no_color)
    wide.print(renderable, crop=False)


def abort(text: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print ``text`` as an error on stderr and exit with ``code`` (the only exit path).

    ``text`` is taken literally: messages carry paths, option values and hints like
    ``pip install 'tripwire[serve]'``, whose square brackets rich would read as markup (and
    drop, or fail on: ``--since '[/x]d'`` was a MarkupError traceback).
    """
    err_console.print(f"[bold red]error:[/] {escape(text)}", highlight=False)
    raise typer.Exit(code)
