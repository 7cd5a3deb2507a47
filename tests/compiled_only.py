"""The module-level guard of test files that test ``tripwire.core._speedups`` itself.

Under ``CI=true`` the accelerator must be built (the clean-clone install compiles it); locally
such files skip, loudly, when it was not, and always with ``TRIPWIRE_NO_EXTENSIONS`` set.
"""

from __future__ import annotations

import os
from types import ModuleType

import pytest


def speedups_or_skip() -> ModuleType:
    """The compiled module; else skip the calling test file (or fail it under ``CI=true``)."""
    try:
        from tripwire.core import _speedups
    except ImportError:  # pragma: no cover - depends on the build
        _speedups = None  # type: ignore[assignment]
    if os.environ.get("TRIPWIRE_NO_EXTENSIONS", "").strip() not in ("", "0"):
        pytest.skip(
            "SKIPPED LOUDLY: TRIPWIRE_NO_EXTENSIONS is set, so the compiled accelerator is not in "
            "use; only the Python reference was tested",
            allow_module_level=True,
        )
    if _speedups is None:
        if os.environ.get("CI", "").lower() == "true":
            raise RuntimeError(
                "tripwire.core._speedups was not built: the install must compile "
                "src/tripwire/core/_speedups.c (is a C compiler missing?)"
            )
        pytest.skip(
            "SKIPPED LOUDLY: the compiled accelerator tripwire.core._speedups is not built "
            "(pip install -e . needs a C compiler); only the Python reference was tested",
            allow_module_level=True,
        )
    return _speedups
