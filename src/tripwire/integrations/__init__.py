"""tripwire inside agent frameworks: one or two lines at each framework's own extension point.

Each framework lives behind its own import path and extra
(``tripwire.integrations.pydantic_ai`` needs ``pip install 'tripwire[pydantic-ai]'``, and so on),
so the core install needs none of them.

Every adapter stands on :mod:`tripwire.integrations._common`: :func:`new_run` starts one run
under one :class:`~tripwire.guard.Guard`, :class:`RunControl` is what the adapter calls around
model and tool calls, :class:`StoppedRun` is what the caller gets when tripwire ended the
run, and ``_common.RunSettings`` holds the settings an adapter's ``Tripwire`` takes, checked
once. See ``docs/integrations.md`` for the table of frameworks and what a stop looks like in
each.
"""

from __future__ import annotations

from tripwire.integrations._common import OnLoop, RunControl, StoppedRun, current_run, new_run

__all__ = ["OnLoop", "RunControl", "StoppedRun", "current_run", "new_run"]
