"""Where tripwire keeps state beyond one process: the shared budget ledgers of the guard
(:mod:`tripwire.store.memory`, :mod:`tripwire.store.sqlite`, :mod:`tripwire.store.redis`, on the
protocol of :mod:`tripwire.store.base`) and the fleet service's run store
(:mod:`tripwire.store.runs`, SQLite or PostgreSQL through SQLAlchemy, migrated by Alembic).

Nothing is imported here: each backend pulls in its own driver only when it is used.
"""
