"""Moved: the span mapping is the pure package :mod:`tripwire.spans`.

This alias keeps ``from tripwire.otel.conventions import map_span`` working for code written
before the move; new code imports :mod:`tripwire.spans`. It re-exports, it holds no mapping.
"""

from __future__ import annotations

from tripwire.spans import *  # noqa: F403
from tripwire.spans import __all__ as __all__
