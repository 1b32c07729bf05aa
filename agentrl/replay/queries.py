"""Read queries of the replay viewer (``agentrl view``): read-only access to a replay store,
listings with filters, sort and keyset pagination, chart series, episode and token pages.

    db = ReadOnlyDB("sqlite:///runs/x/replay.db")     # or a postgresql+psycopg:// URL
    page = episode_page(db, "run-1", EpisodeFilter(success=False), Sort("reward", desc=True))
    page.rows, page.next_cursor                        # pass next_cursor back for the next page

Every function is one read transaction (one snapshot) on its own connection, so the viewer
works while a training run writes the same database (SQLite WAL; PostgreSQL MVCC).

Read-only by construction: SQLite is opened through a ``mode=ro`` URI (the file cannot be
written or created); PostgreSQL sessions start with ``default_transaction_read_only=on``, so
a write would fail in the server. Optional columns and tables of newer schemas (trainer-side
log-probs and entropies, episode ``kind``, ``reruns``, full-text search) are found by
reflection when the database is opened; a page shows "not recorded" where they are missing.

Keyset pagination: a page is ``ORDER BY key, episode_id LIMIT n + 1`` from the last row of
the previous page (``WHERE (key, episode_id) > (k, id)``), never ``OFFSET``, so a deep page
costs what the first does when the sort has an index (the index list is agreed with the
schema's owner in ``agentrl.replay.models``). A nullable sort key (``total_reward``) pages
its non-NULL rows first, then its NULL rows by ``episode_id``.
"""

from __future__ import annotations

import base64
import json
import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from sqlalchemy import Table, and_, bindparam, event, exists, func, inspect, or_, select, tuple_
from sqlalchemy.engine import Connection, Engine, create_engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError

from agentrl.errors import ConfigError, ContractError, InfraError
from agentrl.replay import query_plans
from agentrl.replay.migrations import HEAD, current_revision, known_revisions
from agentrl.replay.models import SCHEMA_VERSION, Base, EpisodeRow, IterationRow, MetricRow, RunRow, TurnRow

MIN_SCHEMA_VERSION = 5
"""Oldest ``schema_version`` the viewer reads (per-token policy versions). Older databases,
and revisions newer than this agentrl's (``agentrl.replay.migrations``), are refused; a
database of schema 5 (before Alembic) is read as it is, without the columns 6 added."""
REQUIRED_TABLES = ("runs", "episodes", "turns", "sandbox_events", "metrics")
PAGE_SIZE_MAX = 500

E = EpisodeRow.__table__
T = TurnRow.__table__
M = MetricRow.__table__
R = RunRow.__table__
I = IterationRow.__table__


class ReadOnlyDB:
    """A replay database opened for reading only.

    Args:
        url: SQLAlchemy URL: ``sqlite:////abs/path/replay.db`` or
            ``postgresql+psycopg://user@host/db``.

    Raises:
        ConfigError: not a database URL, a missing SQLite file, or a driver not installed.
        InfraError: the server cannot be reached or the file is not a database.
        ContractError: the database is not a replay store of a schema this viewer reads
            (missing tables, or a ``schema_version`` older than ``MIN_SCHEMA_VERSION``).
    """

    def __init__(self, url: str) -> None:
        try:
            parsed = make_url(url)
        except ArgumentError:
            raise ConfigError(f"{url!r} is not a database URL; expected a run directory, a replay.db "
                              "file, 'sqlite:///path/replay.db' or 'postgresql+psycopg://user@host/db'") from None
        self.url = parsed.render_as_string(hide_password=True)
        self.source_url = url
        """The URL as given (password included: never shown; ``agentrl.replay.diagnose`` opens it)."""
        self.is_sqlite = parsed.get_backend_name() == "sqlite"
        kwargs: dict[str, Any] = {}
        if self.is_sqlite:
            path = parsed.database or ""
            if path in ("", ":memory:") or not os.path.isfile(path):
                raise ConfigError(f"SQLite database {path!r} does not exist; expected the replay.db of a run")
            # mode=ro: the file is opened read-only and never created (sqlite.org/uri.html).
            parsed = parsed.set(database=f"file:{os.path.abspath(path)}?mode=ro", query={"uri": "true"})
        elif parsed.get_backend_name() == "postgresql":
            kwargs["connect_args"] = {"options": "-c default_transaction_read_only=on"}
        try:
            self.engine: Engine = create_engine(parsed, **kwargs)
        except (NoSuchModuleError, ModuleNotFoundError, ImportError) as exc:
            raise ConfigError(f"{self.url}: database driver not available ({exc}); install it, e.g. "
                              "`pip install psycopg[binary]` for postgresql+psycopg") from None
        if self.is_sqlite:
            event.listen(self.engine, "connect", _sqlite_ro_connect)
            event.listen(self.engine, "begin", lambda conn: conn.exec_driver_sql("BEGIN"))
        try:
            self._inspect()
        except BaseException:
            self.engine.dispose()
            raise

    def _inspect(self) -> None:
        try:
            with self.engine.connect() as conn:
                ins = inspect(conn)
                tables = set(ins.get_table_names())
                missing = [t for t in REQUIRED_TABLES if t not in tables]
                if missing:
                    raise ContractError(f"{self.url} is not a replay store: tables {missing} are missing "
                                        f"(found {sorted(tables)[:8]}); expected the replay.db of an agentrl run")
                if "schema_version" in tables:
                    version = conn.exec_driver_sql("SELECT version FROM schema_version WHERE id = 1").scalar()
                    if version is not None and int(version) < MIN_SCHEMA_VERSION:
                        raise ContractError(
                            f"{self.url} has replay schema_version {version}; the viewer reads "
                            f"{MIN_SCHEMA_VERSION} and newer: open it once with this agentrl's ReplayStore "
                            "(e.g. `agentrl train --resume`) to upgrade it")
                    if version is not None and int(version) > SCHEMA_VERSION:
                        raise ContractError(f"{self.url} has replay schema_version {version}, newer than this "
                                            f"agentrl's {SCHEMA_VERSION}; view it with a newer agentrl")
                rev = current_revision(conn)
                if rev is not None and rev not in known_revisions():
                    raise ContractError(f"{self.url} is at replay schema revision {rev!r}, newer than this "
                                        f"agentrl's {HEAD!r}; view it with a newer agentrl")
                self.index_prefixes = {t: {tuple(ix["column_names"][:2]) for ix in ins.get_indexes(t)}
                                       for t in ("episodes", "metrics")}
                self.turn_columns = {c["name"] for c in ins.get_columns("turns")}
                self.episode_columns = {c["name"] for c in ins.get_columns("episodes")}
                self.tables = tables
        except DBAPIError as exc:
            raise InfraError(f"cannot read {self.url}: {exc.orig}") from None

    @property
    def has_fts(self) -> bool:
        """The database has the full-text index of ``agentrl.replay.search`` (schema 6)."""
        return "turns_fts" in self.tables if self.is_sqlite else "search_tsv" in self.turn_columns

    def has_index(self, table: str, column: str) -> bool:
        """The database has an index on ``table`` whose columns start with (run_id, column)."""
        return ("run_id", column) in self.index_prefixes.get(table, set())

    @property
    def has_kind(self) -> bool:
        return "kind" in self.episode_columns

    def table(self, name: str) -> Table | None:
        """The ORM table ``name`` if both the models and this database have it."""
        return Base.metadata.tables.get(name) if name in self.tables else None

    def turn_col(self, name: str):
        """Column ``turns.name`` when this database and the models have it, else None."""
        return T.c[name] if name in self.turn_columns and name in T.c else None

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """One read transaction (one snapshot); errors of the database become ``InfraError``."""
        try:
            with self.engine.connect() as conn:
                if not self.is_sqlite:
                    conn = conn.execution_options(isolation_level="REPEATABLE READ")
                with conn.begin():
                    yield conn
        except DBAPIError as exc:
            raise InfraError(f"reading {self.url} failed: {exc.orig}") from None

    def close(self) -> None:
        self.engine.dispose()


def _sqlite_ro_connect(dbapi_conn: Any, _record: Any) -> None:
    dbapi_conn.isolation_level = None  # our own BEGIN: one snapshot per read (see store.py)
    cur = dbapi_conn.cursor()
    try:
        cur.execute("PRAGMA query_only=ON")
    finally:
        cur.close()


# ---------------------------------------------------------------------------------------
# Runs
# ---------------------------------------------------------------------------------------

SUMMARY_LAST = ("rollout/reward_mean", "rollout/success_rate")
SUMMARY_SUM = ("tokens/generated", "tokens/trained", "tokens/discarded", "rollout/episodes")


@dataclass
class RunSummary:
    """One run with its headline numbers (from the ``metrics`` table: last reward and success
    rate, summed token counts; iterations = highest metric iteration + 1)."""

    run_id: str
    status: str
    created_at: datetime
    finished_at: datetime | None
    resume_count: int
    config: dict[str, Any]
    iterations: int = 0
    completed: int = 0
    last: dict[str, float] = field(default_factory=dict)
    sums: dict[str, float] = field(default_factory=dict)

    @property
    def run_config(self) -> dict[str, Any]:
        """The training config: the stored config, or its ``config`` entry for runs that
        wrap it (``agentrl eval`` stores ``{"kind": "eval", ..., "config": {...}}``)."""
        inner = self.config.get("config")
        return inner if isinstance(inner, dict) and "env" not in self.config else self.config

    @property
    def kind(self) -> str:
        return str(self.config.get("kind", "train"))

    @property
    def env_id(self) -> str:
        return str((self.run_config.get("env") or {}).get("id", "?"))

    @property
    def model(self) -> str:
        return str((self.run_config.get("model") or {}).get("path", "?"))

    @property
    def is_async(self) -> bool:
        return (self.run_config.get("controller") or {}).get("mode") == "async"


def list_runs(db: ReadOnlyDB, run_id: str | None = None) -> list[RunSummary]:
    """Every run (or the one ``run_id``), newest first, with its headline numbers."""
    q = select(R.c.run_id, R.c.status, R.c.created_at, R.c.finished_at, R.c.resume_count, R.c.config)
    if run_id is not None:
        q = q.where(R.c.run_id == run_id)
    q = q.order_by(R.c.created_at.desc(), R.c.run_id)
    keys = SUMMARY_LAST + SUMMARY_SUM
    with db.read() as conn:
        runs = {r.run_id: RunSummary(*r) for r in conn.execute(q)}
        if not runs:
            return []
        ids = list(runs)
        agg = (select(M.c.run_id, M.c.key, func.max(M.c.iteration).label("last_it"), func.sum(M.c.value))
               .where(M.c.run_id.in_(ids), M.c.key.in_(keys)).group_by(M.c.run_id, M.c.key)).subquery()
        q_last = (select(agg.c.run_id, agg.c.key, agg.c[3], M.c.value)
                  .join(M, and_(M.c.run_id == agg.c.run_id, M.c.key == agg.c.key, M.c.iteration == agg.c.last_it)))
        for rid, key, total, last in conn.execute(q_last):
            if key in SUMMARY_SUM and total is not None:
                runs[rid].sums[key] = float(total)
            if key in SUMMARY_LAST and last is not None:
                runs[rid].last[key] = float(last)
        # per run, max() over the primary key (run_id, iteration, key): one index seek, where a
        # GROUP BY run_id reads every metric of the run (about 100 per iteration)
        last_it = select(func.max(M.c.iteration)).where(M.c.run_id == R.c.run_id).scalar_subquery()
        for rid, n in conn.execute(select(R.c.run_id, last_it).where(R.c.run_id.in_(ids))):
            runs[rid].iterations = 0 if n is None else int(n) + 1
        for rid, n in conn.execute(select(I.c.run_id, func.count()).where(I.c.run_id.in_(ids)).group_by(I.c.run_id)):
            runs[rid].completed = int(n)
    return list(runs.values())


def get_run(db: ReadOnlyDB, run_id: str) -> RunSummary | None:
    found = list_runs(db, run_id)
    return found[0] if found else None


def model_path(db: ReadOnlyDB, run_id: str) -> str | None:
    """The run's ``model.path`` from its stored config (None if not given)."""
    with db.read() as conn:
        config = conn.scalar(select(R.c.config).where(R.c.run_id == run_id))
    return _config_model_path(config)


def model_paths(db: ReadOnlyDB, limit: int = 4) -> list[str]:
    """The distinct ``model.path`` of the newest runs, newest first, at most ``limit``
    (the tokenizers the viewer loads when it starts)."""
    out: list[str] = []
    with db.read() as conn:
        for config in conn.scalars(select(R.c.config).order_by(R.c.created_at.desc(), R.c.run_id).limit(100)):
            path = _config_model_path(config)
            if path is not None and path not in out:
                out.append(path)
                if len(out) >= limit:
                    break
    return out


def _config_model_path(config: Any) -> str | None:
    if isinstance(config, dict) and "model" not in config and isinstance(config.get("config"), dict):
        config = config["config"]  # a run that wraps its training config (agentrl eval)
    path = ((config if isinstance(config, dict) else {}).get("model") or {}).get("path")
    return str(path) if path else None


def run_metrics(db: ReadOnlyDB, run_id: str, keys: Sequence[str] | None = None) -> dict[str, list[tuple[int, float]]]:
    """``{key: [(iteration, value), ...]}`` ascending, NaN values (NULL) left out; only the
    metrics named in ``keys`` when given (each one a range of the index ``ix_metrics_key``:
    the run's other metrics are not read).

    Raises:
        InfraError: the database cannot be read.
    """
    with db.read() as conn:
        if keys is None:
            keys = list(conn.scalars(select(M.c.key).where(M.c.run_id == run_id).distinct()))
        keys = sorted(set(keys))
        if db.has_index("metrics", "key"):
            return _series(db, conn, run_id, keys)
        # a database before schema 7 (no ix_metrics_key): one scan of the run's metrics
        out: dict[str, list[tuple[int, float]]] = {}
        q = select(M.c.key, M.c.iteration, M.c.value).where(M.c.run_id == run_id, M.c.value.is_not(None),
                                                             M.c.key.in_(keys))
        for key, it, value in conn.execute(q.order_by(M.c.key, M.c.iteration)):
            if math.isfinite(value):
                out.setdefault(key, []).append((int(it), float(value)))
        return out


_SERIES = (select(M.c.iteration, M.c.value)
           .where(M.c.run_id == bindparam("run_id"), M.c.key == bindparam("key"), M.c.value.is_not(None))
           .order_by(M.c.iteration))


def _series(db: ReadOnlyDB, conn: Connection, run_id: str, keys: Sequence[str]) -> dict[str, list[tuple[int, float]]]:
    """Each metric's finite values of a run in iteration order (one query per key), through
    the driver's cursor in the caller's transaction: plain tuples, since SQLAlchemy's row
    objects cost about 3 times what the queries do (26,000 values for the run page at 1,000
    iterations: 55 ms against 14 ms of CPU on SQLite)."""
    compiled = _SERIES.compile(dialect=conn.dialect)
    sql, out = str(compiled), {}
    cursor = conn.connection.cursor()
    try:
        for key in keys:
            params = {"run_id": run_id, "key": key}
            cursor.execute(sql, [params[n] for n in compiled.positiontup or ()] if compiled.positional else params)
            series = [(int(it), float(v)) for it, v in cursor.fetchall() if math.isfinite(v)]
            if series:
                out[key] = series
    except conn.dialect.loaded_dbapi.Error as exc:
        raise InfraError(f"reading {db.url} failed: {exc}") from None
    finally:
        cursor.close()
    return out


def completed_iterations(db: ReadOnlyDB, run_id: str) -> set[int]:
    with db.read() as conn:
        return {int(i) for i in conn.scalars(select(I.c.iteration).where(I.c.run_id == run_id))}


# ---------------------------------------------------------------------------------------
# Episode listings: filters, sort, keyset pagination
# ---------------------------------------------------------------------------------------

SORTS = {
    "default": (E.c.iteration, E.c.created_at, E.c.position),
    "reward": (E.c.total_reward,),
    "length": (E.c.num_generated_tokens,),
    "turns": (E.c.num_turns,),
}
"""Sort name → key columns (``episode_id`` is always appended as the tie-breaker)."""
_NULLABLE_SORTS = {"reward"}

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
    rows: list[Any]
    next_cursor: str | None


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


def _filter_clauses(db: ReadOnlyDB, conn: Connection, run_id: str, f: EpisodeFilter
                    ) -> tuple[list[Any], list[tuple[Any, Any]]]:
    """Filter ``f`` as ``(clauses, indexed)``: ``clauses`` no index of ours serves (or run_id's),
    ``indexed`` ``(column, build)`` pairs for the filters an index (run_id, column, ...) serves,
    ``build(column expression) -> clause`` (``agentrl.replay.query_plans`` decides which
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


def text_search(db: ReadOnlyDB, conn: Connection, q: str) -> Any:
    """Clause "an action or observation of the episode holds every word of ``q``": through
    the full-text index (``agentrl.replay.search``: SQLite FTS5, PostgreSQL tsvector) when
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


def episode_page(db: ReadOnlyDB, run_id: str, f: EpisodeFilter = EpisodeFilter(), sort: Sort = Sort(),
                 cursor: str | None = None, limit: int = 50) -> Page:
    """One page of a run's episodes (rows of ``LIST_COLUMNS``) and the cursor of the next
    page (``None`` on the last one).

    Raises:
        ContractError: ``limit`` outside ``[1, PAGE_SIZE_MAX]`` or a bad ``cursor``.
    """
    if not 1 <= limit <= PAGE_SIZE_MAX:
        raise ContractError(f"limit={limit}; expected 1..{PAGE_SIZE_MAX}")
    keys = (*SORTS[sort.key], E.c.episode_id)
    after = decode_cursor(cursor, sort) if cursor else None
    null_phase = bool(after and after[-1] == 1)
    nullable = sort.key in _NULLABLE_SORTS
    rows: list[Any] = []
    with db.read() as conn:
        base, indexed = _filter_clauses(db, conn, run_id, f)
        # a selective filter's index, or else the sort's (agentrl.replay.query_plans)
        base, by_filter = query_plans.plan_filters(conn, run_id, base, indexed, keys[0])
        if not null_phase:
            where = list(base)
            if nullable:
                where.append(keys[0].is_not(None))
            if after:
                cmp = tuple_(*keys) < tuple(after[:-1]) if sort.desc else tuple_(*keys) > tuple(after[:-1])
                where.append(cmp)
            order = [k.desc() if sort.desc else k.asc() for k in (query_plans.unordered(keys) if by_filter else keys)]
            rows = list(conn.execute(select(*LIST_COLUMNS).where(*where).order_by(*order).limit(limit + 1)))
        if nullable and len(rows) <= limit:
            where = [*base, keys[0].is_(None)]
            if null_phase:
                where.append(E.c.episode_id < after[-2] if sort.desc else E.c.episode_id > after[-2])
            last_key = query_plans.unordered(keys[-1:])[0] if by_filter else E.c.episode_id
            order_id = last_key.desc() if sort.desc else last_key.asc()
            rows += list(conn.execute(select(*LIST_COLUMNS).where(*where).order_by(order_id)
                                      .limit(limit + 1 - len(rows))))
    more = len(rows) > limit
    rows = rows[:limit]
    nxt = None
    if more and rows:
        last = rows[-1]._mapping
        vals = [last[k.name] for k in keys]
        phase = 1 if nullable and vals[0] is None else 0
        nxt = encode_cursor([*vals, phase])
    return Page(rows, nxt)
