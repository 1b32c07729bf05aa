"""The viewer's episode listing: a run's episodes filtered, sorted and in keyset pages.

    page = episode_page(db, "run-1", EpisodeFilter(success=False), Sort("reward", desc=True))
    page.rows, page.next_cursor                        # pass next_cursor back for the next page
    page.tool_calls[page.rows[0].episode_id]           # the sum of its turns' tool_calls
    tool_call_share(db, "run-1").share                 # of the newest episodes, made no tool call

Keyset pagination: a page is ``ORDER BY key, episode_id LIMIT n + 1`` from the last row of
the previous page (``WHERE (key, episode_id) > (k, id)``), never ``OFFSET``, so a deep page
costs what the first does when the sort has an index (the index list is agreed with the
schema's owner in ``agentrl.replay.models``). A nullable sort key (``total_reward``) pages
its non-NULL rows first, then its NULL rows by ``episode_id``. Which index a filtered page
uses is decided in ``agentrl.replay.read.query_plans``. The sort by tool calls (``TOOL_CALLS``,
an episode's turns summed) has no index: it reads the counts of every episode the filters
leave, so its pages cost what the run's turns do.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Integer, and_, case, exists, false, func, literal, or_, select, true, tuple_
from sqlalchemy.engine import Connection

from agentrl.errors import ContractError
from agentrl.replay.models import EpisodeRow, TurnRow
from agentrl.replay.read import query_plans
from agentrl.replay.read.db import ReplayDB
from agentrl.replay.read.episodes import check_kind

E = EpisodeRow.__table__
T = TurnRow.__table__
PAGE_SIZE_MAX = 500

TOOL_CALLS = (select(func.coalesce(func.sum(T.c.tool_calls), 0)).where(T.c.episode_id == E.c.episode_id)
              .correlate(E).scalar_subquery())
"""The episode's tool calls: the sum of its turns' ``tool_calls`` (a correlated subquery; no
index orders it, so a page sorted by it reads the tool-call counts of every episode the
filters leave; on a database without the column, schema 8 and older, ``tool_calls_of``)."""

SORTS = {
    "default": (E.c.iteration, E.c.created_at, E.c.position),
    "reward": (E.c.total_reward,),
    "length": (E.c.num_generated_tokens,),
    "turns": (E.c.num_turns,),
    "tool_calls": (TOOL_CALLS,),
}
"""Sort name → key columns (``episode_id`` is always appended as the tie-breaker)."""
_NULLABLE_SORTS = {"reward"}
_SORT_KEY = "sort_key"

LIST_COLUMNS = (E.c.episode_id, E.c.run_id, E.c.iteration, E.c.group_id, E.c.env_id, E.c.task_id,
                E.c.seed, E.c.terminated, E.c.truncated, E.c.termination_reason, E.c.success,
                E.c.total_reward, E.c.num_turns, E.c.num_generated_tokens, E.c.policy_version_min,
                E.c.policy_version_max, E.c.advantage_mean, E.c.created_at, E.c.position, E.c.error,
                E.c.prompt_mode)


@dataclass(frozen=True)
class EpisodeFilter:
    """Filters of the episodes page; ``None`` means "any". ``termination`` ``"none"`` selects
    episodes without a termination reason; ``policy_version`` selects episodes with a token
    of that version; ``q`` is a full-text search in actions and observations."""

    env: str | None = None
    task: str | None = None
    iteration: int | None = None
    reward_min: float | None = None
    reward_max: float | None = None
    termination: str | None = None
    success: bool | None = None
    group: str | None = None
    policy_version: int | None = None
    length_min: int | None = None
    length_max: int | None = None
    kind: str | None = None
    q: str | None = None


@dataclass(frozen=True)
class Sort:
    key: str = "default"
    desc: bool = False

    def __post_init__(self) -> None:
        if self.key not in SORTS:
            raise ContractError(f"sort={self.key!r}; expected one of {sorted(SORTS)}")


@dataclass
class Page:
    """One page of ``episode_page``: ``rows`` (``LIST_COLUMNS`` rows, attribute access by
    column name), the cursor of the next page (``None`` on the last one) and ``tool_calls``,
    episode id → the sum of its turns' ``tool_calls`` (0 on a database without the column)."""

    rows: list[Any]
    next_cursor: str | None
    tool_calls: dict[str, int] = field(default_factory=dict)


def tool_calls_of(db: ReplayDB) -> Any:
    """``TOOL_CALLS`` on a database with ``turns.tool_calls`` (schema 9), else the constant 0
    (``ReplayDB.columns_as_found``: turns stored before read as 0 tool calls)."""
    found = {c.name: c for c in db.columns_as_found(T)}
    return TOOL_CALLS if found["tool_calls"] is T.c.tool_calls else literal(0, Integer)


def encode_cursor(values: Sequence[Any]) -> str:
    raw = json.dumps([v.isoformat() if isinstance(v, datetime) else v for v in values], separators=(",", ":"))
    return base64.urlsafe_b64encode(raw.encode()).decode().rstrip("=")


def decode_cursor(cursor: str, sort: Sort) -> list[Any]:
    """The key values of ``cursor`` for ``sort``: ``[*keys, episode_id, null_phase]``.

    Raises:
        ContractError: the cursor was not made by ``encode_cursor`` for this sort.
    """
    try:
        values = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (ValueError, TypeError):
        raise ContractError(f"cursor={cursor[:40]!r} is not a page cursor of this viewer") from None
    n = len(SORTS[sort.key])
    if not isinstance(values, list) or len(values) != n + 2 or not isinstance(values[n], str) \
            or values[n + 1] not in (0, 1):
        raise ContractError(f"cursor={cursor[:40]!r} does not belong to sort={sort.key!r}")
    if sort.key == "default":
        try:
            values[1] = datetime.fromisoformat(values[1])
            ok = isinstance(values[0], int) and isinstance(values[2], int) and values[1].tzinfo is not None
        except (TypeError, ValueError):
            ok = False
        if not ok:
            raise ContractError(f"cursor={cursor[:40]!r} does not belong to sort='default'")
    elif values[n + 1] == 0 and not isinstance(values[0], (int, float)):
        raise ContractError(f"cursor={cursor[:40]!r} does not belong to sort={sort.key!r}")
    if any(isinstance(v, int) and not -2**63 <= v < 2**63 for v in values[:n]):
        # The key columns are 64-bit integers: a larger value would overflow the database's.
        raise ContractError(f"cursor={cursor[:40]!r} holds an integer outside [-2**63, 2**63); "
                            "it is not a page cursor of this viewer")
    return values


def _filter_clauses(db: ReplayDB, conn: Connection, run_id: str, f: EpisodeFilter
                    ) -> tuple[list[Any], list[tuple[Any, Any]]]:
    """Filter ``f`` as ``(clauses, indexed)``: ``clauses`` no index of ours serves (or run_id's),
    ``indexed`` ``(column, build)`` pairs for the filters an index (run_id, column, ...) serves,
    ``build(column expression) -> clause`` (``agentrl.replay.read.query_plans`` decides which
    of them may use their index)."""
    c: list[Any] = [E.c.run_id == run_id]
    indexed: list[tuple[Any, Any]] = []

    def add(col: Any, build: Any) -> None:
        if db.has_index("episodes", col.name):
            indexed.append((col, build))
        else:
            c.append(build(col))

    def between(lo: Any, hi: Any):
        return lambda x: and_(*[cl for cl in ((x >= lo) if lo is not None else None,
                                             (x <= hi) if hi is not None else None) if cl is not None])

    if f.env is not None:
        add(E.c.env_id, lambda x: x == f.env)
    if f.task is not None:
        add(E.c.task_id, lambda x: x == f.task)
    if f.iteration is not None:
        add(E.c.iteration, lambda x: x == f.iteration)
    if f.reward_min is not None or f.reward_max is not None:
        add(E.c.total_reward, between(f.reward_min, f.reward_max))
    if f.termination is not None:
        add(E.c.termination_reason, lambda x: x.is_(None) if f.termination == "none" else x == f.termination)
    if f.success is not None:
        add(E.c.success, lambda x: x == f.success)
    if f.group is not None:
        add(E.c.group_id, lambda x: x == f.group)
    if f.policy_version is not None:
        c.append(and_(E.c.policy_version_min <= f.policy_version, E.c.policy_version_max >= f.policy_version))
    if f.length_min is not None or f.length_max is not None:
        add(E.c.num_generated_tokens, between(f.length_min, f.length_max))
    if f.kind is not None and db.has_kind:
        c.append(E.c["kind"] == f.kind)
    if f.q:
        c.append(text_search(db, conn, f.q))
    return c, indexed


def text_search(db: ReplayDB, conn: Connection, q: str) -> Any:
    """Clause "an action or observation of the episode holds every word of ``q``": through
    the full-text index (``agentrl.replay.search_index``: SQLite FTS5, PostgreSQL tsvector) when
    the database has one, else a case-insensitive substring match of ``q`` (schema 5).

    Raises:
        ContractError: ``q`` has no word to search for (full-text index only).
    """
    if db.has_fts:
        return query_plans.text_clause(conn, db.engine.dialect.name, q)
    pattern = "%" + q.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"
    return exists().where(T.c.episode_id == E.c.episode_id,
                          or_(T.c.action_text.ilike(pattern, escape="\\"),
                              T.c.observation_text.ilike(pattern, escape="\\")))


def episode_page(db: ReplayDB, run_id: str, f: EpisodeFilter = EpisodeFilter(), sort: Sort = Sort(),
                 cursor: str | None = None, limit: int = 50) -> Page:
    """One page of a run's episodes (rows of ``LIST_COLUMNS``), the cursor of the next page
    (``None`` on the last one) and the page's tool-call counts (``Page.tool_calls``).

    Raises:
        ContractError: ``limit`` outside ``[1, PAGE_SIZE_MAX]`` or a bad ``cursor``.
    """
    if not 1 <= limit <= PAGE_SIZE_MAX:
        raise ContractError(f"limit={limit}; expected 1..{PAGE_SIZE_MAX}")
    computed = sort.key == "tool_calls"  # a key that is no column: selected under the name _SORT_KEY
    keys = ((tool_calls_of(db),) if computed else SORTS[sort.key]) + (E.c.episode_id,)
    columns = (*LIST_COLUMNS, keys[0].label(_SORT_KEY)) if computed else LIST_COLUMNS
    after = decode_cursor(cursor, sort) if cursor else None
    null_phase = bool(after and after[-1] == 1)
    nullable = sort.key in _NULLABLE_SORTS
    rows: list[Any] = []
    with db.read() as conn:
        base, indexed = _filter_clauses(db, conn, run_id, f)
        # a selective filter's index, or else the sort's (agentrl.replay.read.query_plans)
        base, by_filter = query_plans.plan_filters(conn, run_id, base, indexed, keys[0])
        if not null_phase:
            where = list(base)
            if nullable:
                where.append(keys[0].is_not(None))
            if after:
                cmp = tuple_(*keys) < tuple(after[:-1]) if sort.desc else tuple_(*keys) > tuple(after[:-1])
                where.append(cmp)
            order = [k.desc() if sort.desc else k.asc() for k in (query_plans.unordered(keys) if by_filter else keys)]
            rows = list(conn.execute(select(*columns).where(*where).order_by(*order).limit(limit + 1)))
        if nullable and len(rows) <= limit:
            where = [*base, keys[0].is_(None)]
            if null_phase:
                where.append(E.c.episode_id < after[-2] if sort.desc else E.c.episode_id > after[-2])
            last_key = query_plans.unordered(keys[-1:])[0] if by_filter else E.c.episode_id
            order_id = last_key.desc() if sort.desc else last_key.asc()
            rows += list(conn.execute(select(*columns).where(*where).order_by(order_id)
                                      .limit(limit + 1 - len(rows))))
        more = len(rows) > limit
        rows = rows[:limit]
        calls = _tool_calls(db, conn, [r.episode_id for r in rows])
    nxt = None
    if more and rows:
        last = rows[-1]._mapping
        vals = [last[_SORT_KEY if computed and i == 0 else k.name] for i, k in enumerate(keys)]
        phase = 1 if nullable and vals[0] is None else 0
        nxt = encode_cursor([*vals, phase])
    return Page(rows, nxt, calls)


def _tool_calls(db: ReplayDB, conn: Connection, episode_ids: list[str]) -> dict[str, int]:
    """Episode id → the sum of its turns' ``tool_calls``, for ``episode_ids`` (one query over
    their turns; zeros without a query on a database without the column)."""
    calls = dict.fromkeys(episode_ids, 0)
    if episode_ids and "tool_calls" in db.turn_columns:
        for eid, n in conn.execute(select(T.c.episode_id, func.sum(T.c.tool_calls))
                                   .where(T.c.episode_id.in_(episode_ids)).group_by(T.c.episode_id)):
            calls[eid] = int(n or 0)
    return calls


SHARE_EPISODES = 2000
"""Episodes ``tool_call_share`` reads by default: the run's newest ones."""


@dataclass(frozen=True)
class ToolCallShare:
    """How many of a run's newest episodes made no tool call (``tool_call_share``)."""

    episodes: int
    """Episodes read: the run's newest, at most the ``max_episodes`` asked for."""
    without: int
    """Of those, the episodes whose turns' ``tool_calls`` are all 0 (or that have no turn)."""
    more: bool
    """The run has more episodes than were read."""

    @property
    def share(self) -> float | None:
        """``without / episodes`` in [0, 1]; ``None`` when no episode was read."""
        return self.without / self.episodes if self.episodes else None


def tool_call_share(db: ReplayDB, run_id: str, kind: str | None = None,
                    max_episodes: int = SHARE_EPISODES) -> ToolCallShare:
    """The share of the run's newest ``max_episodes`` episodes (of one ``kind``, if given)
    that made no tool call: bounded work on any run size (the newest episodes through the
    (run_id, iteration, created_at, position) index, then an ``EXISTS`` over each one's
    turns). On a database without ``turns.tool_calls`` (schema 8 and older) every episode
    counts as without.

    Raises:
        ContractError: ``max_episodes < 1``, or an unknown ``kind``.
    """
    if max_episodes < 1:
        raise ContractError(f"max_episodes={max_episodes}; expected >= 1")
    check_kind(kind)
    q = select(E.c.episode_id).where(E.c.run_id == run_id)
    if kind is not None:  # every episode stored before schema 6 is "train"
        q = q.where(E.c["kind"] == kind if db.has_kind else (true() if kind == "train" else false()))
    newest = (q.order_by(E.c.iteration.desc(), E.c.created_at.desc(), E.c.position.desc())
              .limit(max_episodes).subquery())
    if "tool_calls" in db.turn_columns:
        called = exists().where(T.c.episode_id == newest.c.episode_id, T.c.tool_calls > 0)
        without = func.sum(case((called, 0), else_=1))
    else:
        without = func.count()
    with db.read() as conn:
        n, w = conn.execute(select(func.count(), without).select_from(newest)).one()
        more = n >= max_episodes and conn.scalar(q.offset(max_episodes).limit(1)) is not None
    return ToolCallShare(int(n), int(w or 0), more)
