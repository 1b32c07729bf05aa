"""Full-text search over the turns' actions and observations, on both dialects.

The index is made by migration ``0006`` and kept in step with ``turns`` without the writer's
help: on SQLite an FTS5 table (``turns_fts``, ``unicode61`` tokenizer: words of letters and
digits, case-folded) that triggers on ``turns`` fill and empty; on PostgreSQL a generated
``tsvector`` column (``turns.search_tsv``: every run of characters other than letters and
digits made a space, then text search configuration ``simple``: lower-cased words, no
stemming, since actions and observations are mostly code and shell output) with a GIN
index. Both thus split ``./solve.sh`` into ``solve`` and ``sh``. PostgreSQL indexes the first
``PG_SEARCH_MAX_CHARS`` characters of each field (a ``tsvector`` is limited to 1 MB), and
its ``[:alnum:]`` follows the database's locale (non-ASCII letters count only under a UTF-8
locale); SQLite indexes all of it, Unicode letters included.

    q = matching_turns(engine.dialect.name, "permission denied")
    conn.execute(q).all()   # [(episode_id, turn_index), ...]

Text stored escaped (``models.SafeText``: strings with U+0000 or lone surrogates) is indexed
in its escaped form.

SQLite: a turn's FTS row has the turn's ``rowid`` (``turns`` has a composite primary key, so
its rowid is implicit), which the delete and update triggers use. SQLite does not promise to
keep implicit rowids through ``VACUUM``; the store never vacuums, and after a manual
``VACUUM`` ``rebuild_sqlite_index`` makes the index again from ``turns``.
"""

from __future__ import annotations

import re

from sqlalchemy import Select, bindparam, column, literal_column, select, table, text
from sqlalchemy.engine import Connection

from agentrl.errors import ContractError

FTS_TABLE = "turns_fts"
"""SQLite: the FTS5 table (columns action_text, observation_text, episode_id, turn_index)."""
PG_SEARCH_COLUMN = "search_tsv"
"""PostgreSQL: the generated ``tsvector`` column of ``turns``."""
PG_TS_CONFIG = "simple"
PG_SEARCH_MAX_CHARS = 65536
"""PostgreSQL indexes this many leading characters of the action and of the observation."""

_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def search_terms(query: str) -> list[str]:
    """The words of a user's search text (runs of letters and digits), in order,
    lower-cased; every one must occur in a matching turn. Everything else only separates
    words, as in both indexes (``solve.sh`` is ``solve`` and ``sh``), so no query syntax of
    either database reaches it."""
    if not isinstance(query, str):
        raise ContractError(f"search text {query!r} must be a str")
    return [w.lower() for w in _WORD.findall(query)]


def matching_turns(dialect_name: str, query: str) -> Select:
    """A ``SELECT episode_id, turn_index`` of the turns whose action or observation holds
    every word of ``query`` (``search_terms``), for ``dialect_name`` (``sqlite`` or
    ``postgresql``). Join or ``IN`` it against ``episodes`` for the episode list.

    Raises:
        ContractError: ``query`` has no words, or the dialect is neither.
    """
    terms = search_terms(query)
    if not terms:
        raise ContractError(f"search text {query!r} has no words (letters or digits) to search for")
    if dialect_name == "sqlite":
        fts = table(FTS_TABLE, column("episode_id"), column("turn_index"))
        expr = " ".join('"' + t.replace('"', '""') + '"' for t in terms)  # each word a quoted phrase: AND
        return (select(fts.c.episode_id, fts.c.turn_index)
                .where(literal_column(FTS_TABLE).op("MATCH")(bindparam("fts_query", expr))))
    if dialect_name == "postgresql":
        turns = table("turns", column("episode_id"), column("turn_index"))
        return (select(turns.c.episode_id, turns.c.turn_index)
                .where(text(f"turns.{PG_SEARCH_COLUMN} @@ plainto_tsquery('{PG_TS_CONFIG}', :ts_query)")
                       .bindparams(ts_query=" ".join(terms))))
    raise ContractError(f"dialect {dialect_name!r} has no full-text search here; expected 'sqlite' or 'postgresql'")


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


__all__ = ["FTS_TABLE", "PG_SEARCH_COLUMN", "PG_SEARCH_MAX_CHARS", "PG_TS_CONFIG", "matching_turns",
           "rebuild_sqlite_index", "search_terms"]
