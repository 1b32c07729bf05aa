"""What an episode of an agent behind the gateway records (schema_version 9): ``turns.branch``
(``Turn.branch``: the branch of the episode a turn extends, each branch its own trainer row),
``turns.tool_calls`` (``Turn.tool_calls``: tool calls the turn's action made, as the env
reported) and ``episodes.counters`` (``Episode.counters``: named per-episode counts, JSON).
Turns stored before read back on branch 0 with 0 tool calls, episodes with no counters
(NULL), which is what they were. The downgrade drops the three columns with ``ALTER TABLE ...
DROP COLUMN`` (SQLite 3.35 or newer), not by copying the table, so the triggers of the
full-text index on ``turns`` (revision ``0006``) stay.

Revision ID: 0009
Revises: 0008
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0009"
down_revision = "0008"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.add_column("turns", sa.Column("branch", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("turns", sa.Column("tool_calls", sa.Integer(), nullable=False, server_default="0"))
    op.add_column("episodes", sa.Column("counters", sa.JSON(), nullable=True))
    op.execute("UPDATE schema_version SET version = 9 WHERE id = 1")


def downgrade() -> None:
    op.execute("UPDATE schema_version SET version = 8 WHERE id = 1")
    op.drop_column("episodes", "counters")
    op.drop_column("turns", "tool_calls")
    op.drop_column("turns", "branch")
