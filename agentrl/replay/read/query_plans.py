"""How the viewer's filtered episode pages stay fast on large runs.

A page is ``WHERE run_id = ? AND <filters> ORDER BY <sort key>, episode_id LIMIT n``. Two plans
exist: walk the sort key's index and test each row against the filters (fast when many rows
match: the page fills early), or fetch the matching rows through a filter's index and sort
them (fast when few match). PostgreSQL's planner chooses well from its statistics (most
common values, histograms) in most cases. SQLite's knows only the average rows per key, so the viewer
decides for it, and for PostgreSQL too where its estimates mislead it (a range filter's
rows sorted instead of the sort's index walked): ``PROBE_ROWS + 1`` index entries of each
indexed filter are counted (a bounded index-only scan). When one filter matches at most
``PROBE_ROWS`` rows, the sort keys and the other filters' columns are wrapped in
``coalesce(x, x)`` (expressions no index serves), so that the database reads that filter's
index and sorts the few rows it finds; otherwise the filters' columns are wrapped, and the
sort's index is walked.

Full-text search follows the same rule: a rare word's matching episodes (at most
``PROBE_ROWS`` turns, counted by FTS rowid) are fetched first and passed as an ``IN`` list; a common word is tested per
episode along the sort order (``EXISTS`` over the turns of that episode, through the FTS5
rowid, which is the turn's rowid; or the turn's ``tsvector`` on PostgreSQL).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import exists, func, literal, literal_column, select, text
from sqlalchemy.engine import Connection

from agentrl.replay.models import EpisodeRow, TurnRow
from agentrl.replay.read.search import matching_turns
from agentrl.replay.search_index import FTS_TABLE

PROBE_ROWS = 2000
"""A filter matching at most this many episodes is read through its own index."""

E = EpisodeRow.__table__
T = TurnRow.__table__


def probe(conn: Connection, run_id: str, clause: Any) -> int:
    """How many of the run's episodes match ``clause``, counted up to ``PROBE_ROWS + 1``."""
    inner = select(literal(1)).select_from(E).where(E.c.run_id == run_id, clause).limit(PROBE_ROWS + 1).subquery()
    return int(conn.scalar(select(func.count()).select_from(inner)) or 0)


def hidden(col: Any) -> Any:
    """``coalesce(col, col)``: the column's values (NULL included) as an expression that no
    index serves, so the planner cannot pick that column's index."""
    return func.coalesce(col, col)


def plan_filters(conn: Connection, run_id: str, clauses: Sequence[Any], indexed: Sequence[tuple[Any, Any]],
                 sort_key: Any) -> tuple[list[Any], bool]:
    """``(every clause, by_filter)`` for one page. ``indexed``: ``(column, build)`` of the
    filters an index (run_id, column, ...) serves. Each is probed; the one matching the
    fewest episodes, if at most ``PROBE_ROWS``, keeps its index (``by_filter``: the caller
    orders by ``unordered`` keys, so the planner reads that index and sorts what it finds).
    Every other filter's column is ``hidden``, except a filter on the sort key itself (its
    index is the sort's), so the sort's index is walked and the page fills early."""
    counts = [probe(conn, run_id, build(col)) for col, build in indexed]
    best = min(range(len(indexed)), key=counts.__getitem__, default=None)
    by_filter = best is not None and counts[best] <= PROBE_ROWS
    out = list(clauses)
    for k, (col, build) in enumerate(indexed):
        keep = (k == best) if by_filter else (col is sort_key)
        clause = build(col if keep else hidden(col))
        if by_filter and keep and conn.dialect.name == "sqlite":
            # SQLite's statistics give every value of a column the average row count (e.g. one
            # env: all rows); unlikely() (a no-op after planning) makes it pick this index
            clause = func.unlikely(clause)
        out.append(clause)
    return out, by_filter


def unordered(keys: Sequence[Any]) -> list[Any]:
    """The sort keys as expressions no index can order (``coalesce(k, k)``: same values, same
    order, NULLs included), so that SQLite reads a filter's index instead of the sort's."""
    return [func.coalesce(k, k).label(None) for k in keys]


def text_clause(conn: Connection, dialect: str, query: str) -> Any:
    """Clause "an action or observation of this episode holds every word of ``query``"
    (``agentrl.replay.read.search``), planned by how many episodes match (module docstring).

    Raises:
        ContractError: ``query`` has no words.
    """

    hits = matching_turns(dialect, query)
    params = hits.compile().params
    if dialect == "postgresql":
        return exists().where(T.c.episode_id == E.c.episode_id, text(
            "turns.search_tsv @@ plainto_tsquery('simple', :ts_dense)").bindparams(ts_dense=params["ts_query"]))
    # count the matching turns by FTS rowid (= the turn's rowid: no stored text is read)
    rowids = list(conn.scalars(hits.with_only_columns(literal_column(f"{FTS_TABLE}.rowid"), maintain_column_froms=True)
                          .limit(PROBE_ROWS + 1)))
    if len(rowids) <= PROBE_ROWS:
        ids = conn.scalars(select(T.c.episode_id).where(literal_column("turns.rowid").in_(rowids)).distinct())
        return E.c.episode_id.in_(list(ids))
    return text("EXISTS (SELECT 1 FROM turns AS search_turn JOIN turns_fts ON turns_fts.rowid = search_turn.rowid "
                "WHERE search_turn.episode_id = episodes.episode_id AND turns_fts MATCH :fts_dense)"
                ).bindparams(fts_dense=params["fts_query"])
