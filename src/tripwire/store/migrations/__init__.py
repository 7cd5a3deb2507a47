"""Alembic migrations of the run store (``tripwire.store.runs``)."""
