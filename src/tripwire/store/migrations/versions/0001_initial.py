"""The first schema of the run store: runs, verdicts, calls, the alert outbox, kill flags.

Revision ID: 0001
Revises:
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None


def upgrade() -> None:
    op.create_table(
        "tripwire_runs",
        sa.Column("trace_id", sa.String(32), primary_key=True),
        sa.Column("agent", sa.String(200), nullable=True),
        sa.Column("service", sa.String(200), nullable=True),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("rule", sa.String(40), nullable=True),
        sa.Column("stop_reason", sa.String(40), nullable=True),
        sa.Column("health", sa.String(24), nullable=True),
        sa.Column("steps", sa.Integer, nullable=False),
        sa.Column("tool_calls", sa.Integer, nullable=False),
        sa.Column("input_tokens", sa.BigInteger, nullable=False),
        sa.Column("output_tokens", sa.BigInteger, nullable=False),
        sa.Column("cost_usd", sa.Float, nullable=True),
        sa.Column("duration_s", sa.Float, nullable=True),
        sa.Column("first_stuck_call", sa.Integer, nullable=True),
        sa.Column("calls_after_stuck", sa.Integer, nullable=False),
        sa.Column("cost_after_stuck", sa.Float, nullable=True),
        sa.Column("killed", sa.Boolean, nullable=False),
        sa.Column("acknowledged", sa.Boolean, nullable=False),
        sa.Column("resolved", sa.Boolean, nullable=False),
        sa.Column("policy_version", sa.String(40), nullable=True),
        sa.Column("normalizer_version", sa.String(40), nullable=True),
        sa.Column("mapping_version", sa.String(16), nullable=True),
        sa.Column("receipt", sa.Text, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
        sa.Column("updated_at", sa.Float, nullable=False),
        sa.Column("ended_at", sa.Float, nullable=True),
    )
    op.create_index("ix_tripwire_runs_created", "tripwire_runs", ["created_at"])
    op.create_index("ix_tripwire_runs_verdict", "tripwire_runs", ["verdict"])
    op.create_index("ix_tripwire_runs_agent", "tripwire_runs", ["agent"])
    op.create_table(
        "tripwire_verdicts",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("trace_id", sa.String(32), nullable=False),
        sa.Column("at", sa.Float, nullable=False),
        sa.Column("verdict", sa.String(16), nullable=False),
        sa.Column("previous", sa.String(16), nullable=True),
        sa.Column("rule", sa.String(40), nullable=True),
        sa.Column("tool", sa.String(200), nullable=True),
        sa.Column("digest", sa.String(40), nullable=True),
        sa.Column("call_index", sa.Integer, nullable=False),
        sa.Column("hits", sa.Integer, nullable=False),
        sa.Column("reason", sa.Text, nullable=False),
        sa.Column("stop_reason", sa.String(40), nullable=True),
        sa.Column("policy_version", sa.String(40), nullable=True),
        sa.Column("normalizer_version", sa.String(40), nullable=True),
    )
    op.create_index("ix_tripwire_verdicts_trace_id", "tripwire_verdicts", ["trace_id"])
    op.create_table(
        "tripwire_calls",
        sa.Column("trace_id", sa.String(32), primary_key=True),
        sa.Column("call_index", sa.Integer, primary_key=True),
        sa.Column("tool", sa.String(200), nullable=False),
        sa.Column("digest", sa.String(40), nullable=True),
        sa.Column("result_digest", sa.String(40), nullable=True),
        sa.Column("error_type", sa.String(100), nullable=True),
        sa.Column("attempt", sa.Integer, nullable=True),
        sa.Column("progress", sa.String(100), nullable=True),
        sa.Column("lease_owner", sa.String(200), nullable=True),
        sa.Column("start_s", sa.Float, nullable=True),
        sa.Column("end_s", sa.Float, nullable=True),
        sa.Column("verdict", sa.String(16), nullable=True),
        sa.Column("raw", sa.Text, nullable=True),
    )
    op.create_table(
        "tripwire_outbox",
        sa.Column("id", sa.Integer, primary_key=True, autoincrement=True),
        sa.Column("dedupe_key", sa.String(200), nullable=False, unique=True),
        sa.Column("trace_id", sa.String(32), nullable=False),
        sa.Column("target", sa.String(40), nullable=False),
        sa.Column("action", sa.String(16), nullable=False),
        sa.Column("payload", sa.Text, nullable=False),
        sa.Column("attempts", sa.Integer, nullable=False),
        sa.Column("next_at", sa.Float, nullable=False),
        sa.Column("delivered_at", sa.Float, nullable=True),
        sa.Column("failed_at", sa.Float, nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
        sa.Column("created_at", sa.Float, nullable=False),
    )
    op.create_index("ix_tripwire_outbox_due", "tripwire_outbox", ["delivered_at", "next_at"])
    op.create_table(
        "tripwire_flags",
        sa.Column("trace_id", sa.String(32), primary_key=True),
        sa.Column("reason", sa.String(40), nullable=False),
        sa.Column("message", sa.Text, nullable=False),
        sa.Column("raised_at", sa.Float, nullable=False),
        sa.Column("expires_at", sa.Float, nullable=False),
    )


def downgrade() -> None:
    for table in (
        "tripwire_flags",
        "tripwire_outbox",
        "tripwire_calls",
        "tripwire_verdicts",
        "tripwire_runs",
    ):
        op.drop_table(table)
