"""How the viewer's filtered episode pages stay fast on large runs (issue 13, point 6).

A page is ``WHERE run_id = ? AND <filters> ORDER BY <sort key>, episode_id LIMIT n``. Two plans
exist: walk the sort key's index and test each row against the filters (fast when many rows
match: the page fills early), or fetch the matching rows through a filter's index and sort
them (fast when few match). PostgreSQL's planner chooses well from its statistics (most
common values, histograms). SQLite's knows only the average rows per key, so the viewer
decides for it: ``PROBE_ROWS + 1`` index entries of each indexed filter are counted (a
bounded index-only scan). When one filter matches at most ``PROBE_ROWS`` rows, it is marked
``unlikely()`` and the sort keys are wrapped in ``coalesce(k, k)`` (an expression no index
can order), so that SQLite reads that filter's index and sorts the few rows it finds;
otherwise the filters are marked ``likely()`` and the sort's index is walked.

Full-text search follows the same rule: a rare word's matching episodes (at most
``PROBE_ROWS``) are fetched first and passed as an ``IN`` list; a common word is tested per
episode along the sort order (``EXISTS`` over the turns of that episode, through the FTS5
rowid, which is the turn's rowid; or the turn's ``tsvector`` on PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import exists, func, literal, select, text
from sqlalchemy.engine import Connection

from agentrl.replay.models import EpisodeRow, TurnRow

PROBE_ROWS = 2000
"""A filter matching at most this many episodes is read through its own index."""

E = EpisodeRow.__table__
T = TurnRow.__table__


def probe(conn: Connection, run_id: str, clause: Any) -> int:
    """How many of the run's episodes match ``clause``, counted up to ``PROBE_ROWS + 1``."""
    inner = (select(literal(1)).select_from(E).where(E.c.run_id == run_id, func.unlikely(clause))
             .limit(PROBE_ROWS + 1).subquery())
    return int(conn.scalar(select(func.count()).select_from(inner)) or 0)


def plan_filters(conn: Connection, run_id: str, clauses: Sequence[Any], indexed: Sequence[Any]) -> tuple[list[Any], bool]:
    """SQLite: ``(clauses with planner hints, by_filter)``. Each ``indexed`` clause (served by
    an index that starts with ``run_id``) is probed; one that matches at most ``PROBE_ROWS``
    episodes is marked ``unlikely()`` and ``by_filter`` is True (the caller then orders by
    ``unordered`` keys); otherwise every indexed clause is marked ``likely()``, so that the
    sort's index is walked. Both functions are no-ops SQLite removes after planning."""
    counts = {id(c): probe(conn, run_id, c) for c in indexed}
    best = min(indexed, key=lambda c: counts[id(c)], default=None)
    if best is not None and counts[id(best)] <= PROBE_ROWS:
        return [func.unlikely(c) if c is best else c for c in clauses], True
    marked = {id(c) for c in indexed}
    return [func.likely(c) if id(c) in marked else c for c in clauses], False


def unordered(keys: Sequence[Any]) -> list[Any]:
    """The sort keys as expressions no index can order (``coalesce(k, k)``: same values, same
    order, NULLs included), so that SQLite reads a filter's index instead of the sort's."""
    return [func.coalesce(k, k).label(None) for k in keys]


def text_clause(conn: Connection, dialect: str, query: str) -> Any:
    """Clause "an action or observation of this episode holds every word of ``query``"
    (``agentrl.replay.search``), planned by how many episodes match (module docstring).

    Raises:
        ContractError: ``query`` has no words.
    """
    from agentrl.replay.search import matching_turns

    hits = matching_turns(dialect, query)
    params = hits.compile().params
    if dialect == "postgresql":
        return exists().where(T.c.episode_id == E.c.episode_id, text(
            "turns.search_tsv @@ plainto_tsquery('simple', :ts_dense)").bindparams(ts_dense=params["ts_query"]))
    sub = hits.subquery()
    ids = list(conn.scalars(select(sub.c.episode_id).distinct().limit(PROBE_ROWS + 1)))
    if len(ids) <= PROBE_ROWS:
        return E.c.episode_id.in_(ids)
    return text("EXISTS (SELECT 1 FROM turns AS search_turn JOIN turns_fts ON turns_fts.rowid = search_turn.rowid "
                "WHERE search_turn.episode_id = episodes.episode_id AND turns_fts MATCH :fts_dense)"
                ).bindparams(fts_dense=params["fts_query"])
