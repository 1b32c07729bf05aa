"""Judge rewards (schema_version 10): the table ``judgements`` (``Episode.judgement``, the
``JudgeRecord`` of a judged episode, one row per episode, deleted with it) and the table
``judge_cache`` (the judge's raw answer by the hex sha256 of what it was asked, the first
answer kept). Episodes stored before have no row: no judgement. The downgrade drops both
tables.

Revision ID: 0010
Revises: 0009
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from agentrl.replay.models import SafeText, UTCDateTime

revision = "0010"
down_revision = "0009"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        "judgements",
        sa.Column("episode_id", sa.String(length=200), nullable=False),
        sa.Column("model", SafeText(), nullable=False),
        sa.Column("rubric", SafeText(), nullable=False),
        sa.Column("rubric_digest", sa.String(length=64), nullable=False),
        sa.Column("mode", sa.String(length=8), nullable=False),
        sa.Column("prompt", sa.JSON(), nullable=False),
        sa.Column("output", SafeText(), nullable=True),
        sa.Column("scores", sa.JSON(), nullable=False),
        sa.Column("reasons", sa.JSON(), nullable=False),
        sa.Column("score", sa.Double(), nullable=True),
        sa.Column("gate_failed", SafeText(), nullable=True),
        sa.Column("rule_reward", sa.Double(), nullable=True),
        sa.Column("reward", sa.Double(), nullable=True),
        sa.Column("latency_s", sa.Double(), nullable=False),
        sa.Column("cached", sa.Boolean(), nullable=False),
        sa.Column("judged", sa.Boolean(), nullable=False),
        sa.Column("calls", sa.Integer(), nullable=False),
        sa.Column("parse_errors", sa.Integer(), nullable=False),
        sa.Column("group_position", sa.Integer(), nullable=True),
        sa.Column("error", SafeText(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["episode_id"], ["episodes.episode_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("episode_id"),
    )
    op.create_table(
        "judge_cache",
        sa.Column("cache_key", sa.String(length=64), nullable=False),
        sa.Column("model", SafeText(), nullable=False),
        sa.Column("rubric_digest", sa.String(length=64), nullable=False),
        sa.Column("output", SafeText(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("cache_key"),
    )
    op.execute("UPDATE schema_version SET version = 10 WHERE id = 1")


def downgrade() -> None:
    op.execute("UPDATE schema_version SET version = 9 WHERE id = 1")
    op.drop_table("judge_cache")
    op.drop_table("judgements")
