"""The optional compiled accelerators of :mod:`tripwire.core`, and how each is found.

They are built by ``pip install`` when a C compiler is at hand. ``tripwire.core._speedups``
(``_speedups.c``) holds two stateless leaf functions of :mod:`tripwire.core.signature`: the
canonical bytes of a tool call's arguments (the volatile-key walk included) and the volatile-key
check of decoded JSON. ``tripwire.core._resultmask`` (``_resultmask.c``) holds two of
``Normalizer.result_digest``: the mask of a short tool result's volatile values and the digit
deletion of a long one. ``tripwire.core._watchstep`` (``_watchstep.c``) does the per-call
bookkeeping of :func:`tripwire.core.watch.evaluate_hashed` for the calls it handles, calling no
Python function; every rule's test and every verdict stay Python. Each has a Python twin that
stays the reference. Set ``TRIPWIRE_NO_EXTENSIONS=1`` to run without them (CI runs the whole
suite both ways).
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

__all__ = ["compiled", "resultmask", "speedups"]


def compiled(name: str) -> ModuleType | None:
    """The compiled module ``tripwire.<name>`` (``"core._speedups"``, ``"spans._otlpscan"``…),
    or ``None`` when it was not built or ``TRIPWIRE_NO_EXTENSIONS`` is set."""
    if os.environ.get("TRIPWIRE_NO_EXTENSIONS", "").strip() not in ("", "0"):
        return None
    try:
        return importlib.import_module(f"tripwire.{name}")
    except ImportError:
        return None


def speedups() -> ModuleType | None:
    """The compiled module, or ``None`` when it was not built or ``TRIPWIRE_NO_EXTENSIONS`` is set."""
    return compiled("core._speedups")


def resultmask() -> ModuleType | None:
    """``tripwire.core._resultmask`` (``_resultmask.c``), the compiled leaves of result digests,
    or ``None`` when it was not built or ``TRIPWIRE_NO_EXTENSIONS`` is set."""
    return compiled("core._resultmask")
