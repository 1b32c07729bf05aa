"""An index of the ``metrics`` table by key (schema_version 7): ``(run_id, key, iteration,
value)``, so that one metric's series of a run, its last value and its sum are a range of
this index (covering: the table is not read) instead of a scan of every metric of the run.
The viewer's run and runs pages read 30 of the about 100 keys a training iteration writes.

Revision ID: 0007
Revises: 0006
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None

INDEX = "ix_metrics_key"
COLUMNS = ["run_id", "key", "iteration", "value"]


def upgrade() -> None:
    op.create_index(INDEX, "metrics", COLUMNS)
    bind = op.get_bind()
    if bind.dialect.name == "sqlite" and sa.inspect(bind).has_table("sqlite_stat1"):
        # A database analysed before (ANALYZE) has statistics for the other indexes of
        # metrics only; with none for this one, SQLite's planner takes it for max(iteration)
        # of a run (a scan) instead of the primary key (one seek). Statistics for all of them.
        op.execute("ANALYZE metrics")
    op.execute("UPDATE schema_version SET version = 7 WHERE id = 1")


def downgrade() -> None:
    op.execute("UPDATE schema_version SET version = 6 WHERE id = 1")
    op.drop_index(INDEX, table_name="metrics")
