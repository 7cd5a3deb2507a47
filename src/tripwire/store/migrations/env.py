"""Alembic environment for the run store: runs on the connection :class:`RunStore` hands in."""

from __future__ import annotations

from alembic import context

from tripwire.store.runs import VERSION_TABLE, metadata

connection = context.config.attributes.get("connection")
if connection is None:  # pragma: no cover - only RunStore.migrate runs these migrations
    raise RuntimeError("the run store's migrations run through tripwire.store.runs.RunStore")
context.configure(
    connection=connection,
    target_metadata=metadata,
    version_table=VERSION_TABLE,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
