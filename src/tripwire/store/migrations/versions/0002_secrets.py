"""The fleet's secrets: the digest key every receiver of one store shares.

Revision ID: 0002
Revises: 0001
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.create_table(
        "tripwire_secrets",
        sa.Column("name", sa.String(40), primary_key=True),
        sa.Column("value", sa.String(256), nullable=False),
        sa.Column("created_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    op.drop_table("tripwire_secrets")
