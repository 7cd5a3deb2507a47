"""Version columns wide enough for a keyed normalizer's version (41 characters and more: it
names the scheme, the volatile keys, the cap and the key's fingerprint), on PostgreSQL, which
enforces lengths (SQLite does not).

Revision ID: 0003
Revises: 0002
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"

_COLUMNS = (
    ("tripwire_runs", "policy_version"),
    ("tripwire_runs", "normalizer_version"),
    ("tripwire_verdicts", "policy_version"),
    ("tripwire_verdicts", "normalizer_version"),
)


def upgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return  # SQLite keeps any length in a VARCHAR column
    for table, column in _COLUMNS:
        op.alter_column(table, column, type_=sa.String(120), existing_type=sa.String(40), existing_nullable=True)


def downgrade() -> None:
    if op.get_bind().dialect.name == "sqlite":
        return
    for table, column in _COLUMNS:
        op.alter_column(table, column, type_=sa.String(40), existing_type=sa.String(120), existing_nullable=True)
