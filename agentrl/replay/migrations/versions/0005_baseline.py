"""Baseline: the replay schema of ``schema_version`` 5, the last one before Alembic.

Frozen: it must keep creating exactly what the store of schema 5 created (an existing
schema-5 database is stamped with this revision instead of running it).

Revision ID: 0005
Revises: (none)
"""

from __future__ import annotations

from datetime import datetime, timezone

import sqlalchemy as sa
from alembic import op

from agentrl.replay.models import SafeText, UTCDateTime

revision = "0005"
down_revision = None
branch_labels = None
depends_on = None

_ID = sa.String(length=200)


def upgrade() -> None:
    op.create_table(
        "runs",
        sa.Column("run_id", _ID, nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.Column("config", sa.JSON(), nullable=False),
        sa.Column("status", sa.String(length=32), nullable=False),
        sa.Column("resume_count", sa.Integer(), nullable=False),
        sa.PrimaryKeyConstraint("run_id"),
    )
    version = op.create_table(
        "schema_version",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("version", sa.Integer(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_table(
        "episodes",
        sa.Column("episode_id", _ID, nullable=False),
        sa.Column("run_id", _ID, nullable=False),
        sa.Column("iteration", sa.Integer(), nullable=False),
        sa.Column("position", sa.Integer(), nullable=False),
        sa.Column("group_id", _ID, nullable=False),
        sa.Column("env_id", _ID, nullable=False),
        sa.Column("task_id", SafeText(), nullable=False),
        sa.Column("seed", sa.BigInteger(), nullable=False),
        sa.Column("terminated", sa.Boolean(), nullable=False),
        sa.Column("truncated", sa.Boolean(), nullable=False),
        sa.Column("termination_reason", sa.String(length=32), nullable=True),
        sa.Column("prompt_mode", sa.String(length=16), nullable=False),
        sa.Column("success", sa.Boolean(), nullable=True),
        sa.Column("total_reward", sa.Double(), nullable=True),
        sa.Column("error", sa.JSON(), nullable=True),
        sa.Column("num_turns", sa.Integer(), nullable=False),
        sa.Column("num_generated_tokens", sa.Integer(), nullable=False),
        sa.Column("policy_version_min", sa.Integer(), nullable=True),
        sa.Column("policy_version_max", sa.Integer(), nullable=True),
        sa.Column("advantage_mean", sa.Double(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("episode_id"),
    )
    op.create_index("ix_episodes_group", "episodes", ["run_id", "group_id"])
    op.create_index("ix_episodes_run_iteration", "episodes", ["run_id", "iteration", "created_at", "position"])
    op.create_table(
        "iterations",
        sa.Column("run_id", _ID, nullable=False),
        sa.Column("iteration", sa.Integer(), nullable=False),
        sa.Column("completed_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "iteration"),
    )
    op.create_table(
        "metrics",
        sa.Column("run_id", _ID, nullable=False),
        sa.Column("iteration", sa.Integer(), nullable=False),
        sa.Column("key", sa.String(length=200), nullable=False),
        sa.Column("value", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(["run_id"], ["runs.run_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("run_id", "iteration", "key"),
    )
    op.create_table(
        "turns",
        sa.Column("episode_id", _ID, nullable=False),
        sa.Column("turn_index", sa.Integer(), nullable=False),
        sa.Column("prompt_ids", sa.LargeBinary(), nullable=False),
        sa.Column("completion_ids", sa.LargeBinary(), nullable=False),
        sa.Column("behavior_log_probs", sa.LargeBinary(), nullable=False),
        sa.Column("temperature", sa.Double(), nullable=False),
        sa.Column("top_p", sa.Double(), nullable=False),
        sa.Column("top_k", sa.Integer(), nullable=False),
        sa.Column("policy_version", sa.Integer(), nullable=False),
        sa.Column("policy_versions", sa.LargeBinary(), nullable=True),
        sa.Column("finish_reason", sa.String(length=16), nullable=False),
        sa.Column("reward", sa.Double(), nullable=True),
        sa.Column("anchor", SafeText(), nullable=False),
        sa.Column("anchor_kind", sa.String(length=8), nullable=False),
        sa.Column("action_text", SafeText(), nullable=False),
        sa.Column("observation_text", SafeText(), nullable=False),
        sa.Column("invalid_action", sa.Boolean(), nullable=False),
        sa.Column("advantage", sa.Double(), nullable=True),
        sa.ForeignKeyConstraint(["episode_id"], ["episodes.episode_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("episode_id", "turn_index"),
    )
    op.create_table(
        "sandbox_events",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("episode_id", _ID, nullable=False),
        sa.Column("turn_index", sa.Integer(), nullable=False),
        sa.Column("seq", sa.Integer(), nullable=False),
        sa.Column("command", SafeText(), nullable=False),
        sa.Column("argv", sa.JSON(), nullable=True),
        sa.Column("exit_code", sa.Integer(), nullable=True),
        sa.Column("stdout", SafeText(), nullable=False),
        sa.Column("stderr", SafeText(), nullable=False),
        sa.Column("duration_s", sa.Double(), nullable=False),
        sa.Column("timed_out", sa.Boolean(), nullable=False),
        sa.Column("truncated_bytes", sa.BigInteger(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.ForeignKeyConstraint(["episode_id", "turn_index"], ["turns.episode_id", "turns.turn_index"],
                                ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
        sa.UniqueConstraint("episode_id", "turn_index", "seq", name="uq_sandbox_events_order"),
    )
    op.bulk_insert(version, [{"id": 1, "version": 5, "created_at": datetime.now(timezone.utc)}])


def downgrade() -> None:
    for name in ("sandbox_events", "turns", "metrics", "iterations", "episodes", "schema_version", "runs"):
        op.drop_table(name)
