"""The full-text index over the turns' actions and observations: its names and its rebuild.

Migration ``0006`` makes the index, and the database keeps it in step with ``turns`` without
the writer's help: on SQLite an FTS5 table (``turns_fts``, ``unicode61`` tokenizer: words of
letters and digits, case-folded) that triggers on ``turns`` fill and empty; on PostgreSQL a
generated ``tsvector`` column (``turns.search_tsv``: every run of characters other than
letters and digits made a space, then text search configuration ``simple``: lower-cased
words, no stemming, since actions and observations are mostly code and shell output) with a
GIN index. Both thus split ``./solve.sh`` into ``solve`` and ``sh``. PostgreSQL indexes the
first ``PG_SEARCH_MAX_CHARS`` characters of each field (a ``tsvector`` is limited to 1 MB),
and its ``[:alnum:]`` follows the database's locale (non-ASCII letters count only under a
UTF-8 locale); SQLite indexes all of it, Unicode letters included. Text stored escaped
(``models.SafeText``: strings with U+0000 or lone surrogates) is indexed in its escaped form.

Searching it is a read: ``agentrl.replay.read.search``.

SQLite: a turn's FTS row has the turn's ``rowid`` (``turns`` has a composite primary key, so
its rowid is implicit), which the delete and update triggers use. SQLite does not promise to
keep implicit rowids through ``VACUUM``; the store never vacuums, and after a manual
``VACUUM`` ``rebuild_sqlite_index`` makes the index again from ``turns``.
"""

from __future__ import annotations

from sqlalchemy import text
from sqlalchemy.engine import Connection

from agentrl.errors import ContractError

FTS_TABLE = "turns_fts"
"""SQLite: the FTS5 table (columns action_text, observation_text, episode_id, turn_index)."""
PG_SEARCH_COLUMN = "search_tsv"
"""PostgreSQL: the generated ``tsvector`` column of ``turns``."""
PG_TS_CONFIG = "simple"
PG_SEARCH_MAX_CHARS = 65536
"""PostgreSQL indexes this many leading characters of the action and of the observation."""


def rebuild_sqlite_index(conn: Connection) -> int:
    """Make SQLite's FTS table again from ``turns`` (after a ``VACUUM``, or to repair it), in
    the caller's transaction. Returns the number of turns indexed.

    Raises:
        ContractError: ``conn`` is not a SQLite connection.
    """
    if conn.dialect.name != "sqlite":
        raise ContractError(f"rebuild_sqlite_index needs a SQLite connection; got {conn.dialect.name!r} "
                            "(PostgreSQL's generated column needs no rebuild)")
    conn.execute(text(f"DELETE FROM {FTS_TABLE}"))
    conn.execute(text(f"INSERT INTO {FTS_TABLE}(rowid, action_text, observation_text, episode_id, turn_index) "
                      "SELECT rowid, action_text, observation_text, episode_id, turn_index FROM turns"))
    return int(conn.execute(text(f"SELECT count(*) FROM {FTS_TABLE}")).scalar_one())


__all__ = ["FTS_TABLE", "PG_SEARCH_COLUMN", "PG_SEARCH_MAX_CHARS", "PG_TS_CONFIG", "rebuild_sqlite_index"]
