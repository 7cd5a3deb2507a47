"""Marks for what stands on other engineers' milestones: strict xfails while the behaviour
probe in :mod:`._guard_milestones` says the milestone is missing, plain tests once it lands."""

from __future__ import annotations

from ._guard_milestones import needs_g1, needs_g2, needs_g3, needs_g5, needs_orders_fix

orders_flagged = needs_orders_fix

__all__ = ["needs_g1", "needs_g2", "needs_g3", "needs_g5", "orders_flagged"]
