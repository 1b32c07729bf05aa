"""Reads of runs and their metrics: ``RunInfo`` rows with headline numbers, completed
iterations, metrics by iteration or as per-key series, the models the runs used.

Every function is one read transaction of a ``ReplayDB``; an unknown run is ``None`` or empty.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime
from enum import Enum
from typing import Any

from sqlalchemy import and_, bindparam, func, select, union
from sqlalchemy.engine import Connection

from agentrl.errors import InfraError
from agentrl.replay.models import EpisodeRow, IterationRow, MetricRow, RunRow
from agentrl.replay.read.db import ReplayDB

E = EpisodeRow.__table__
M = MetricRow.__table__
R = RunRow.__table__
I = IterationRow.__table__

HEADLINE_LAST = ("rollout/reward_mean", "rollout/success_rate")
"""Metrics whose last value a ``RunInfo`` carries (``RunInfo.last``)."""
HEADLINE_SUM = ("tokens/generated", "tokens/trained", "tokens/discarded", "rollout/episodes")
"""Metrics whose sum over iterations a ``RunInfo`` carries (``RunInfo.sums``)."""


class RunStatus(str, Enum):
    """Status of a run in the ``runs`` table."""

    RUNNING = "running"
    FINISHED = "finished"
    """All requested iterations ran."""
    FAILED = "failed"
    """The run stopped on an error."""
    INTERRUPTED = "interrupted"
    """Stopped by the user or a signal; it may be resumed."""


@dataclass(frozen=True)
class RunInfo:
    """One row of ``runs``, with its headline numbers from the ``metrics`` table where read
    (``list_runs``, ``get_run``): ``iterations`` = highest metric iteration (iterations are
    numbered from 1), ``completed`` = training iterations (from 1) marked complete, ``last`` the last value of each
    ``HEADLINE_LAST`` metric, ``sums`` each ``HEADLINE_SUM`` metric summed."""

    run_id: str
    status: RunStatus
    config: dict[str, Any]
    created_at: datetime
    finished_at: datetime | None
    resume_count: int
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
        """``train``, or what a wrapping run says it is (``eval``)."""
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


def run_info(row: Any, **headline: Any) -> RunInfo:
    """``RunInfo`` of a ``runs`` row (ORM or Core), with ``headline`` numbers if given."""
    return RunInfo(run_id=row.run_id, status=RunStatus(row.status), config=row.config,
                   created_at=row.created_at, finished_at=row.finished_at,
                   resume_count=row.resume_count, **headline)


def list_runs(db: ReplayDB, run_id: str | None = None) -> list[RunInfo]:
    """Every run (or the one ``run_id``), newest first, with its headline numbers (four
    queries, each an index range)."""
    q = select(R.c.run_id, R.c.status, R.c.created_at, R.c.finished_at, R.c.resume_count, R.c.config)
    if run_id is not None:
        q = q.where(R.c.run_id == run_id)
    q = q.order_by(R.c.created_at.desc(), R.c.run_id)
    keys = HEADLINE_LAST + HEADLINE_SUM
    with db.read() as conn:
        rows = {r.run_id: r for r in conn.execute(q)}
        if not rows:
            return []
        ids = list(rows)
        head: dict[str, dict[str, Any]] = {rid: {"iterations": 0, "completed": 0, "last": {}, "sums": {}}
                                           for rid in ids}
        agg = (select(M.c.run_id, M.c.key, func.max(M.c.iteration).label("last_it"), func.sum(M.c.value))
               .where(M.c.run_id.in_(ids), M.c.key.in_(keys)).group_by(M.c.run_id, M.c.key)).subquery()
        q_last = (select(agg.c.run_id, agg.c.key, agg.c[3], M.c.value)
                  .join(M, and_(M.c.run_id == agg.c.run_id, M.c.key == agg.c.key, M.c.iteration == agg.c.last_it)))
        for rid, key, total, last in conn.execute(q_last):
            if key in HEADLINE_SUM and total is not None:
                head[rid]["sums"][key] = float(total)
            if key in HEADLINE_LAST and last is not None:
                head[rid]["last"][key] = float(last)
        # per run, max() over the primary key (run_id, iteration, key): one index seek, where a
        # GROUP BY run_id reads every metric of the run (about 100 per iteration)
        last_it = select(func.max(M.c.iteration)).where(M.c.run_id == R.c.run_id).scalar_subquery()
        for rid, n in conn.execute(select(R.c.run_id, last_it).where(R.c.run_id.in_(ids))):
            head[rid]["iterations"] = 0 if n is None else int(n)  # numbered from 1: the last is the count
        for rid, n in conn.execute(select(I.c.run_id, func.count()).where(I.c.run_id.in_(ids), I.c.iteration > 0)
                                   .group_by(I.c.run_id)):
            head[rid]["completed"] = int(n)
    return [run_info(rows[rid], **head[rid]) for rid in ids]


def get_run(db: ReplayDB, run_id: str) -> RunInfo | None:
    """The run ``run_id`` with its headline numbers, or ``None`` when it is not stored."""
    found = list_runs(db, run_id)
    return found[0] if found else None


def model_path(db: ReplayDB, run_id: str) -> str | None:
    """The run's ``model.path`` from its stored config (None if not given)."""
    with db.read() as conn:
        config = conn.scalar(select(R.c.config).where(R.c.run_id == run_id))
    return _config_model_path(config)


def model_paths(db: ReplayDB, limit: int = 4) -> list[str]:
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


# ---------------------------------------------------------------------------------------
# Iterations and metrics
# ---------------------------------------------------------------------------------------


def complete_subquery(run_id: str):
    """``SELECT iteration`` of the run's iterations marked complete (for ``IN (...)``)."""
    return select(I.c.iteration).where(I.c.run_id == run_id)


def completed_iterations(db: ReplayDB, run_id: str) -> list[int]:
    """The run's iterations marked complete, ascending (numbered from 1, 0 for rows before
    training; ``[]`` for an unknown run)."""
    with db.read() as conn:
        return [int(i) for i in conn.scalars(complete_subquery(run_id).order_by(I.c.iteration))]


def iterations(db: ReplayDB, run_id: str, *, complete_only: bool = False) -> list[int]:
    """Sorted iterations for which the run has episodes or metrics (and, with
    ``complete_only``, a completion mark)."""
    q = union(select(E.c.iteration).where(E.c.run_id == run_id), select(M.c.iteration).where(M.c.run_id == run_id))
    with db.read() as conn:
        found = sorted(int(i) for i in conn.scalars(q))
        if complete_only:
            done = set(conn.scalars(complete_subquery(run_id)))
            found = [i for i in found if i in done]
    return found


def metrics(db: ReplayDB, run_id: str, *, complete_only: bool = False) -> dict[int, dict[str, float]]:
    """Every metric of a run as ``{iteration: {key: value}}`` (its complete iterations only,
    with ``complete_only``), iterations ascending, keys sorted; NULL (a NaN written) reads
    as ``nan``."""
    q = (select(M.c.iteration, M.c.key, M.c.value)
         .where(M.c.run_id == run_id).order_by(M.c.iteration, M.c.key))
    if complete_only:
        q = q.where(M.c.iteration.in_(complete_subquery(run_id)))
    out: dict[int, dict[str, float]] = {}
    with db.read() as conn:
        for it, key, value in conn.execute(q):
            out.setdefault(int(it), {})[key] = math.nan if value is None else value
    return out


def metric_series(db: ReplayDB, run_id: str, keys: Sequence[str] | None = None
                  ) -> dict[str, list[tuple[int, float]]]:
    """Per metric, its finite values as ``{key: [(iteration, value), ...]}`` ascending (NaN
    and ±inf left out); only the metrics named in ``keys`` when given (each one a range of
    the index ``ix_metrics_key``: the run's other metrics are not read).

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


def _series(db: ReplayDB, conn: Connection, run_id: str, keys: Sequence[str]) -> dict[str, list[tuple[int, float]]]:
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
