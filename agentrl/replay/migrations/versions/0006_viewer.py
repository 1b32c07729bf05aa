"""What the replay viewer needs (schema_version 6): the trainer-side log-prob and entropy of
each sampled token, the episode ``kind`` (train | eval), the ``reruns`` table, indexes for the
episode list's filters and keyset pagination, and full-text search over actions and
observations (SQLite: an FTS5 table kept in step by triggers; PostgreSQL: a generated
``tsvector`` column with a GIN index). See ``agentrl.replay.models`` and
``agentrl.replay.search_index``.

Revision ID: 0006
Revises: 0005
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

from agentrl.replay.models import UTCDateTime
from agentrl.replay.search_index import FTS_TABLE, PG_SEARCH_COLUMN, PG_SEARCH_MAX_CHARS, PG_TS_CONFIG

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# name -> columns; each starts with run_id and ends with episode_id (keyset tie-breaker)
EPISODE_INDEXES = {
    "ix_episodes_kind_iteration": ["run_id", "kind", "iteration", "episode_id"],
    "ix_episodes_reward": ["run_id", "total_reward", "episode_id"],
    "ix_episodes_tokens": ["run_id", "num_generated_tokens", "episode_id"],
    "ix_episodes_turns": ["run_id", "num_turns", "episode_id"],
    "ix_episodes_termination": ["run_id", "termination_reason", "episode_id"],
    "ix_episodes_success": ["run_id", "success", "episode_id"],
    "ix_episodes_group_id": ["run_id", "group_id", "episode_id"],
    "ix_episodes_policy_version": ["run_id", "policy_version_max", "episode_id"],
    "ix_episodes_task": ["run_id", "task_id", "episode_id"],
    "ix_episodes_env": ["run_id", "env_id", "episode_id"],
    "ix_episodes_created": ["run_id", "created_at", "episode_id"],
}

_SQLITE_FTS = [
    f"CREATE VIRTUAL TABLE {FTS_TABLE} USING fts5("
    "action_text, observation_text, episode_id UNINDEXED, turn_index UNINDEXED, tokenize = 'unicode61')",
    # The FTS row of a turn has the turn's rowid: deletes and updates find it directly.
    f"CREATE TRIGGER {FTS_TABLE}_insert AFTER INSERT ON turns BEGIN "
    f"INSERT INTO {FTS_TABLE}(rowid, action_text, observation_text, episode_id, turn_index) "
    "VALUES (new.rowid, new.action_text, new.observation_text, new.episode_id, new.turn_index); END",
    f"CREATE TRIGGER {FTS_TABLE}_delete AFTER DELETE ON turns BEGIN "
    f"DELETE FROM {FTS_TABLE} WHERE rowid = old.rowid; END",
    f"CREATE TRIGGER {FTS_TABLE}_update AFTER UPDATE OF action_text, observation_text, episode_id, turn_index "
    f"ON turns BEGIN UPDATE {FTS_TABLE} SET action_text = new.action_text, "
    "observation_text = new.observation_text, episode_id = new.episode_id, turn_index = new.turn_index "
    "WHERE rowid = old.rowid; END",
    f"INSERT INTO {FTS_TABLE}(rowid, action_text, observation_text, episode_id, turn_index) "
    "SELECT rowid, action_text, observation_text, episode_id, turn_index FROM turns",
]


def upgrade() -> None:
    op.add_column("turns", sa.Column("trainer_log_probs", sa.LargeBinary(), nullable=True))
    op.add_column("turns", sa.Column("entropies", sa.LargeBinary(), nullable=True))
    op.add_column("episodes", sa.Column("kind", sa.String(length=8), nullable=False, server_default="train"))
    op.create_table(
        "reruns",
        sa.Column("id", sa.BigInteger().with_variant(sa.Integer(), "sqlite"), autoincrement=True, nullable=False),
        sa.Column("episode_id", sa.String(length=200), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("same", sa.Boolean(), nullable=True),
        sa.Column("first_divergent_turn", sa.Integer(), nullable=True),
        sa.Column("report", sa.JSON(), nullable=False),
        sa.ForeignKeyConstraint(["episode_id"], ["episodes.episode_id"], ondelete="CASCADE"),
        sa.PrimaryKeyConstraint("id"),
    )
    op.create_index("ix_reruns_episode", "reruns", ["episode_id", "created_at"])
    op.drop_index("ix_episodes_group", table_name="episodes")  # ix_episodes_group_id covers it
    for name, cols in EPISODE_INDEXES.items():
        op.create_index(name, "episodes", cols)
    op.create_index("ix_runs_created", "runs", ["created_at", "run_id"])
    if op.get_bind().dialect.name == "sqlite":
        for stmt in _SQLITE_FTS:
            op.execute(stmt)
    else:
        n = PG_SEARCH_MAX_CHARS
        op.execute(
            f"ALTER TABLE turns ADD COLUMN {PG_SEARCH_COLUMN} tsvector GENERATED ALWAYS AS "
            f"(to_tsvector('{PG_TS_CONFIG}'::regconfig, regexp_replace(left(action_text, {n}) || ' ' || "
            f"left(observation_text, {n}), '[^[:alnum:]]+', ' ', 'g'))) STORED"
        )
        op.execute(f"CREATE INDEX ix_turns_search ON turns USING gin ({PG_SEARCH_COLUMN})")
    op.execute("UPDATE schema_version SET version = 6 WHERE id = 1")


def downgrade() -> None:
    op.execute("UPDATE schema_version SET version = 5 WHERE id = 1")
    if op.get_bind().dialect.name == "sqlite":
        for suffix in ("insert", "delete", "update"):
            op.execute(f"DROP TRIGGER IF EXISTS {FTS_TABLE}_{suffix}")
        op.execute(f"DROP TABLE IF EXISTS {FTS_TABLE}")
    else:
        op.execute("DROP INDEX IF EXISTS ix_turns_search")
        op.execute(f"ALTER TABLE turns DROP COLUMN IF EXISTS {PG_SEARCH_COLUMN}")
    op.drop_index("ix_runs_created", table_name="runs")
    for name in EPISODE_INDEXES:
        op.drop_index(name, table_name="episodes")
    op.create_index("ix_episodes_group", "episodes", ["run_id", "group_id"])
    op.drop_index("ix_reruns_episode", table_name="reruns")
    op.drop_table("reruns")
    with op.batch_alter_table("episodes") as batch:
        batch.drop_column("kind")
    with op.batch_alter_table("turns") as batch:
        batch.drop_column("entropies")
        batch.drop_column("trainer_log_probs")
