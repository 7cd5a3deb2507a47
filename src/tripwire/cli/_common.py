"""Shared CLI plumbing: consoles and the single exit path."""

from __future__ import annotations

from typing import NoReturn

import typer
from rich.console import Console

__all__ = ["EXIT_DETECTED", "EXIT_OK", "EXIT_USAGE", "abort", "err_console", "out_console"]

EXIT_OK = 0
EXIT_DETECTED = 1
"""A failure, or a detection the user asked to fail on (``--fail-on``)."""
EXIT_USAGE = 2
"""A usage error: bad option, unreadable input, invalid configuration."""

out_console = Console()
"""Tables and data go to stdout."""
err_console = Console(stderr=True)
"""Diagnostics, progress bars and errors go to stderr."""


def abort(text: str, code: int = EXIT_USAGE) -> NoReturn:
    """Print ``text`` as an error on stderr and exit with ``code`` (the only exit path)."""
    err_console.print(f"[bold red]error:[/] {text}", highlight=False)
    raise typer.Exit(code)
