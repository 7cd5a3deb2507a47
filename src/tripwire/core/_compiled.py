"""The optional compiled accelerator, ``tripwire.core._speedups`` (``_speedups.c``).

It is built by ``pip install`` when a C compiler is at hand and speeds up the loop watcher's
per-call bookkeeping, the signature of JSON arguments, and the span processor's mapping of the
common tool span; the Python code it stands in for stays the reference, and the verdicts,
signatures and tool calls are the same either way. Set
``TRIPWIRE_NO_EXTENSIONS=1`` to run without it.
"""

from __future__ import annotations

import os
from types import ModuleType

__all__ = ["speedups"]


def speedups() -> ModuleType | None:
    """The compiled module, or ``None`` when it was not built or ``TRIPWIRE_NO_EXTENSIONS`` is set."""
    if os.environ.get("TRIPWIRE_NO_EXTENSIONS", "").strip() not in ("", "0"):
        return None
    try:
        from tripwire.core import _speedups
    except ImportError:
        return None
    return _speedups
