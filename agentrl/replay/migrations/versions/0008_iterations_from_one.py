"""Iterations numbered from 1 (schema_version 8): the ``iteration`` columns of ``episodes``,
``metrics`` and ``iterations`` (completion marks) of every row stored before are shifted by
one, so a run stored when the replay store numbered iterations from 0 reads as a new one
does (docs/design.md, "Iteration numbering"): its first iteration is 1, its metrics rows'
``iteration`` column equals their ``iteration`` value, and ``agentrl eval``'s rows, stored
at 0 before as now, stay at 0 (``wrapping_runs``).

Episode ids are left as they were: an episode stored before keeps ``.../it{k}/...`` with
the 0-based ``k`` (so its id names the iteration before the one it is listed under). An id
is the key that ``turns``, ``sandbox_events``, ``reruns`` and the full-text index refer to,
and the name that logs, links and ``agentrl replay rerun`` use; rewriting it would be a
cascade through every table and break those references, while the ids stay unique (a
resumed run's new ids carry iterations after the checkpoint, the old ones iterations up to it).

The shift runs in two statements per table (``iteration = -iteration - 1``, then ``iteration
= -iteration``), since a single ``iteration + 1`` can collide with the next row's primary key
midway (``metrics``, ``iterations``) on both SQLite and PostgreSQL. The downgrade shifts back.

Revision ID: 0008
Revises: 0007
"""

from __future__ import annotations

import json

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"
branch_labels = None
depends_on = None

TABLES = ("episodes", "metrics", "iterations")
"""The tables with an ``iteration`` column (``agentrl.replay.models``)."""


def wrapping_runs(bind: sa.engine.Connection) -> list[str]:
    """Runs that are not training runs: their config wraps another under a top-level
    ``kind`` (``agentrl eval``: ``{"kind": "eval", ...}``); their rows are iteration 0 before
    and after."""
    out = []
    for run_id, config in bind.execute(sa.text("SELECT run_id, config FROM runs")):
        if isinstance(config, str):  # SQLite hands the JSON column back as text
            config = json.loads(config)
        if isinstance(config, dict) and "kind" in config:
            out.append(run_id)
    return out


def _shift(by: int) -> None:
    bind = op.get_bind()
    skip = wrapping_runs(bind)
    others = " AND run_id NOT IN :skip" if skip else ""
    params = {"skip": skip} if skip else {}
    for table in TABLES:
        first = sa.text(f"UPDATE {table} SET iteration = -iteration - 1 WHERE iteration >= :lo{others}")
        if skip:
            first = first.bindparams(sa.bindparam("skip", expanding=True))
        bind.execute(first, {"lo": 0 if by > 0 else 1, **params})
        bind.execute(sa.text(f"UPDATE {table} SET iteration = -iteration - :back WHERE iteration < 0"),
                     {"back": 0 if by > 0 else 2})


def upgrade() -> None:
    _shift(+1)
    op.execute("UPDATE schema_version SET version = 8 WHERE id = 1")


def downgrade() -> None:
    op.execute("UPDATE schema_version SET version = 7 WHERE id = 1")
    _shift(-1)
