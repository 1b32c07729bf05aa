"""Full-text search over the turns' actions and observations, on both dialects.

The index (``agentrl.replay.search_index``: SQLite FTS5 table ``turns_fts``, PostgreSQL
generated ``tsvector`` column ``turns.search_tsv``) splits text into words of letters and
digits, lower-cased, so ``./solve.sh`` is ``solve`` and ``sh``; a query is split the same way
and matches a turn whose action or observation holds every one of its words.

    q = matching_turns(engine.dialect.name, "permission denied")
    conn.execute(q).all()   # [(episode_id, turn_index), ...]
"""

from __future__ import annotations

import re

from sqlalchemy import Select, bindparam, column, literal_column, select, table, text

from agentrl.errors import ContractError
from agentrl.replay.search_index import FTS_TABLE, PG_SEARCH_COLUMN, PG_TS_CONFIG

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


__all__ = ["matching_turns", "search_terms"]
