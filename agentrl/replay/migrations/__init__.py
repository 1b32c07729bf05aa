"""Schema migrations of the replay store (Alembic), shipped inside the package and run
programmatically: no ``alembic.ini`` is needed. ``ReplayStore`` calls ``upgrade`` when it opens
a database and ``check_current`` when it opens one read-only.

Revisions (``versions/``): ``0005`` is the baseline, equal to ``schema_version`` 5 (the last
schema before Alembic); ``0006`` adds what the viewer needs (see ``agentrl.replay.models``);
``0007`` the index of ``metrics`` by key (the viewer's run pages); ``0008`` numbers the stored
iterations from 1 (a data migration: the rows of 0-based iterations shifted by one); ``0009``
adds ``turns.branch``, ``turns.tool_calls`` and ``episodes.counters``; ``0010`` the tables
``judgements`` and ``judge_cache`` (judge rewards).
A database made before Alembic has a ``schema_version`` table and no ``alembic_version``: of
schema 3 or 4 it is first brought to 5 by the steps the store always had, then the baseline is
stamped and the later revisions run. The ``schema_version`` row keeps being updated
(``SCHEMA_VERSION``), so an agentrl release older than Alembic refuses a newer database.

A new revision: add ``versions/NNNN_name.py`` (``script.py.mako`` is its template) with
``down_revision`` = the current ``HEAD``, then bump ``HEAD`` below and
``models.SCHEMA_VERSION``; ``tests/integration/replay/test_replay_migrations.py`` checks that
``HEAD`` is the script directory's head and that the revisions build exactly the tables of
``models`` on SQLite and PostgreSQL.
"""

from __future__ import annotations

from pathlib import Path

from sqlalchemy import inspect, text
from sqlalchemy.engine import Connection

from agentrl.errors import ContractError
from agentrl.replay.models import SCHEMA_VERSION, IterationRow

BASELINE = "0005"
"""Revision equal to ``schema_version`` 5 (made before Alembic)."""
HEAD = "0010"
"""The newest revision this agentrl knows."""
LEGACY_VERSIONS = (3, 4, 5)
"""``schema_version`` values of pre-Alembic databases that are upgraded in place."""

_DIR = Path(__file__).resolve().parent
_PG_LOCK_KEY = 7_305_113_511_402  # pg_advisory_xact_lock key: one migrating opener at a time


def _config(conn: Connection):
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", str(_DIR))
    cfg.attributes["connection"] = conn
    return cfg


def known_revisions() -> list[str]:
    """Every revision of the script directory, oldest first."""
    from alembic.script import ScriptDirectory

    script = ScriptDirectory(str(_DIR))
    return [s.revision for s in reversed(list(script.walk_revisions()))]


def current_revision(conn: Connection) -> str | None:
    """The ``alembic_version`` of the database, ``None`` when it has no such table."""
    if "alembic_version" not in set(inspect(conn).get_table_names()):
        return None
    return conn.execute(text("SELECT version_num FROM alembic_version")).scalar()


def _schema_version(conn: Connection) -> int | None:
    if "schema_version" not in set(inspect(conn).get_table_names()):
        return None
    return conn.execute(text("SELECT version FROM schema_version WHERE id = 1")).scalar()


def _newer_error(where: str, rev: str) -> ContractError:
    return ContractError(
        f"database {where} is at replay schema revision {rev!r}, newer than this agentrl, whose "
        f"newest revision is {HEAD!r}; upgrade agentrl (or use a new database)"
    )


def check_current(conn: Connection, where: str) -> None:
    """Raise ``ContractError`` unless the database is at ``HEAD`` (read-only: nothing is
    written). The message names both revisions."""
    rev = current_revision(conn)
    if rev == HEAD and _schema_version(conn) == SCHEMA_VERSION:
        return
    if rev is None:
        found = _schema_version(conn)
        have = "no replay tables" if found is None else f"schema_version {found} (before Alembic)"
        raise ContractError(
            f"database {where} has {have}; this agentrl reads revision {HEAD!r} "
            f"(schema_version {SCHEMA_VERSION}): open it once with write access (e.g. "
            "`agentrl train` or ReplayStore(url)) to upgrade it in place"
        )
    if rev not in known_revisions():
        raise _newer_error(where, rev)
    raise ContractError(
        f"database {where} is at replay schema revision {rev!r}, this agentrl reads revision "
        f"{HEAD!r}: open it once with write access (ReplayStore(url)) to upgrade it in place"
    )


def upgrade(conn: Connection, where: str, foreign_tables: set[str]) -> None:
    """Bring the database on ``conn`` to ``HEAD`` inside the caller's transaction.

    Args:
        conn: a connection in a write transaction (the store's ``BEGIN IMMEDIATE`` on SQLite).
        where: the database URL for messages (password hidden).
        foreign_tables: names of replay tables; an unversioned database holding any of them
            is refused rather than guessed at.

    Raises:
        ContractError: a revision or ``schema_version`` newer than this agentrl, a
            pre-Alembic ``schema_version`` outside ``LEGACY_VERSIONS``, or replay tables
            without any version. The messages name both versions.
    """
    from alembic import command

    if conn.dialect.name == "postgresql":
        conn.execute(text(f"SELECT pg_advisory_xact_lock({_PG_LOCK_KEY})"))
    rev = current_revision(conn)
    if rev == HEAD:
        found = _schema_version(conn)
        if found != SCHEMA_VERSION:
            raise ContractError(
                f"database {where} is at revision {rev!r} but holds replay schema_version {found}; "
                f"this agentrl expects schema_version {SCHEMA_VERSION} at revision {HEAD!r}"
            )
        return
    if rev is not None:
        if rev not in known_revisions():
            raise _newer_error(where, rev)
        command.upgrade(_config(conn), "head")
        return
    found = _schema_version(conn)
    if found is None:
        tables = set(inspect(conn).get_table_names())
        ours = tables & foreign_tables
        if ours:
            raise ContractError(
                f"database {where} has replay tables {sorted(ours)} but no schema_version table; "
                f"expected a database made by ReplayStore (schema_version {SCHEMA_VERSION}) or an empty one"
            )
        command.upgrade(_config(conn), "head")  # an empty database: every revision from the start
        return
    if found not in LEGACY_VERSIONS:
        newer = found > LEGACY_VERSIONS[-1]
        raise ContractError(
            f"database {where} has replay schema_version {found}, this agentrl expects schema_version "
            f"{SCHEMA_VERSION} (revision {HEAD!r}); "
            + ("it is newer than this agentrl: upgrade agentrl" if newer else
               "use a new database: the oldest schema this store upgrades in place is "
               f"schema_version {LEGACY_VERSIONS[0]} (3 -> 4 -> 5 -> Alembic)")
        )
    _legacy_to_5(conn, found)
    command.stamp(_config(conn), BASELINE)
    command.upgrade(_config(conn), "head")


def _legacy_to_5(conn: Connection, found: int) -> None:
    """The in-place steps of the pre-Alembic store: 3 -> 4 adds the ``iterations`` table
    (older iterations stay unmarked), 4 -> 5 adds ``turns.policy_versions`` (NULL: every
    token at the turn's version)."""
    if found == 3:
        IterationRow.__table__.create(conn, checkfirst=True)
        found = 4
    if found == 4:
        if "policy_versions" not in {c["name"] for c in inspect(conn).get_columns("turns")}:
            conn.execute(text("ALTER TABLE turns ADD COLUMN policy_versions "
                              + ("BLOB" if conn.dialect.name == "sqlite" else "BYTEA")))
        found = 5
    conn.execute(text("UPDATE schema_version SET version = :v WHERE id = 1"), {"v": found})


__all__ = ["BASELINE", "HEAD", "LEGACY_VERSIONS", "check_current", "current_revision", "known_revisions", "upgrade"]
