"""The module-level guard of test files that test one compiled module of tripwire itself.

Under ``CI=true`` the module must be built (the clean-clone install compiles it); locally such
files skip, loudly, when it was not, and always with ``TRIPWIRE_NO_EXTENSIONS`` set.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def compiled_or_skip(name: str, what: str) -> ModuleType:
    """The compiled module ``tripwire.<name>`` (``"core._watchstep"``), described as ``what`` in
    the messages; else skip the calling test file (or fail it under ``CI=true``)."""
    source = "src/tripwire/" + name.replace(".", "/") + ".c"
    if os.environ.get("TRIPWIRE_NO_EXTENSIONS", "").strip() not in ("", "0"):
        pytest.skip(
            f"SKIPPED LOUDLY: TRIPWIRE_NO_EXTENSIONS is set, so {what} is not in use; only the "
            "Python reference was tested",
            allow_module_level=True,
        )
    try:
        module = importlib.import_module(f"tripwire.{name}")
    except ImportError:  # pragma: no cover - depends on the build
        if os.environ.get("CI", "").lower() == "true":
            raise RuntimeError(
                f"tripwire.{name} was not built: the install must compile {source} (is a C "
                "compiler missing?)"
            ) from None
        pytest.skip(
            f"SKIPPED LOUDLY: {what} tripwire.{name} is not built (pip install -e . needs a C "
            "compiler); only the Python reference was tested",
            allow_module_level=True,
        )
    return module


def speedups_or_skip() -> ModuleType:
    """``tripwire.core._speedups``; else skip the calling test file (or fail it under ``CI=true``)."""
    return compiled_or_skip("core._speedups", "the compiled accelerator")
