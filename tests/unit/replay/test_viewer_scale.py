"""The run and runs pages read what they show and not the rest of a run's metrics: their
queries' work (SQLite virtual-machine steps, counted by a progress handler: a measure of work,
not of time) does not grow with the metric keys a run writes beside the ~35 the run page
draws (a training iteration writes about 100). Measured on a replay file made before Alembic,
analysed (``ANALYZE``) and then upgraded by the store, as a user's old database is.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections import Counter
from pathlib import Path

import pytest
from sqlalchemy import event

from agentrl.replay import ReplayStore
from agentrl.replay.read import ReadOnlyDB, list_runs, metric_series
from agentrl.replay.viewer.run_charts import METRIC_KEYS, run_charts

SCHEMA5_DB = Path(__file__).parents[2] / "integration" / "replay" / "data" / "replay_schema5.db"
RUN = "run-schema5"
ITERATIONS = range(100, 400)


def _database(tmp_path: Path, other_keys: int) -> str:
    """The schema-5 file with 300 iterations of the run page's metrics and ``other_keys``
    more keys per iteration, analysed, then upgraded to this agentrl's schema."""
    path = tmp_path / f"replay-{other_keys}.db"
    shutil.copy(SCHEMA5_DB, path)
    keys = list(METRIC_KEYS) + [f"other/key_{j:03d}" for j in range(other_keys)]
    with sqlite3.connect(path) as conn:
        conn.executemany("INSERT INTO metrics (run_id, iteration, key, value) VALUES (?, ?, ?, ?)",
                         [(RUN, it, k, float(it % 7)) for it in ITERATIONS for k in keys])
        conn.execute("ANALYZE")
    ReplayStore(f"sqlite:///{path}").close()
    return f"sqlite:///{path}"


def _steps(url: str, read) -> int:  # noqa: ANN001
    """SQLite VM steps (in units of 100) that ``read(db)`` costs on a fresh read-only connection."""
    db = ReadOnlyDB(url)
    count = [0]

    def tick() -> int:
        count[0] += 1
        return 0

    event.listen(db.engine, "connect", lambda dbapi_conn, _rec: dbapi_conn.set_progress_handler(tick, 100))
    db.engine.dispose()  # the connection opened while inspecting has no handler
    try:
        read(db)
        count[0] = 0
        result = read(db)
        assert result
        return count[0]
    finally:
        db.close()


@pytest.fixture(scope="module")
def databases(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    tmp = tmp_path_factory.mktemp("viewer-scale")
    return _database(tmp, 0), _database(tmp, 200)


def test_run_metrics_work_does_not_grow_with_the_keys_it_does_not_read(databases: tuple[str, str]) -> None:
    few, many = databases
    lean, wide = (_steps(url, lambda db: metric_series(db, RUN, METRIC_KEYS)) for url in (few, many))
    assert wide <= 1.25 * lean + 20, (lean, wide)
    db = ReadOnlyDB(many)
    try:
        series = metric_series(db, RUN, METRIC_KEYS)
    finally:
        db.close()
    assert set(series) == set(METRIC_KEYS)
    # stored 0-based into the schema-5 file, numbered from 1 by its upgrade (migration 0008)
    assert series["rollout/reward_mean"][-3:] == [(398, 397 % 7), (399, 398 % 7), (400, 399 % 7)]


def test_run_summary_work_does_not_grow_with_the_keys_it_does_not_read(databases: tuple[str, str]) -> None:
    few, many = databases
    lean, wide = (_steps(url, lambda db: list_runs(db, RUN)) for url in (few, many))
    assert wide <= 1.25 * lean + 20, (lean, wide)
    db = ReadOnlyDB(many)
    try:
        (run,) = list_runs(db, RUN)
    finally:
        db.close()
    assert run.iterations == 400 and run.last["rollout/reward_mean"] == 399 % 7
    assert run.sums["tokens/generated"] == sum(it % 7 for it in ITERATIONS) + 0.0


def test_the_key_index_is_used_after_an_upgrade_of_an_analysed_database(databases: tuple[str, str]) -> None:
    with sqlite3.connect(databases[1].removeprefix("sqlite:///")) as conn:
        plan = " ".join(str(r) for r in conn.execute(
            "EXPLAIN QUERY PLAN SELECT iteration, value FROM metrics WHERE run_id = ? AND key = ?", (RUN, "a")))
        last = " ".join(str(r) for r in conn.execute(
            "EXPLAIN QUERY PLAN SELECT max(iteration) FROM metrics WHERE run_id = ?", (RUN,)))
    assert "ix_metrics_key (run_id=? AND key=?)" in plan
    assert "sqlite_autoindex_metrics_1" in last  # the primary key: one seek, not a scan of the run


def test_run_charts_make_each_link_once_per_iteration() -> None:
    its = range(1000)
    metrics = {k: [(i, float(i % 5)) for i in its] for k in METRIC_KEYS}
    calls: Counter[tuple[str, int]] = Counter()

    def link(kind: str):  # noqa: ANN202
        def make(it: int) -> str:
            calls[kind, it] += 1
            return f"/episodes?iteration={it}&kind={kind}"
        return make

    charts = run_charts(metrics, link("train"), True, eval_link=link("eval"))
    drawn = {p.href for c in charts for line in c.lines for p in line.points}
    assert "/episodes?iteration=999&kind=train" in drawn and "/episodes?iteration=999&kind=eval" in drawn
    assert max(calls.values()) == 1, calls.most_common(3)


def test_a_database_without_the_key_index_reads_the_same_series(tmp_path: Path, databases: tuple[str, str]) -> None:
    old = tmp_path / "schema5.db"  # read as it is (read-only): no ix_metrics_key
    shutil.copy(SCHEMA5_DB, old)
    with sqlite3.connect(old) as conn:  # numbered from 1 by hand, as the upgraded file is (migration 0008)
        conn.execute("UPDATE metrics SET iteration = -iteration - 1")
        conn.execute("UPDATE metrics SET iteration = -iteration")
        conn.executemany("INSERT INTO metrics (run_id, iteration, key, value) VALUES (?, ?, ?, ?)",
                         [(RUN, it + 1, k, float(it % 7)) for it in ITERATIONS for k in METRIC_KEYS])
    before, after = ReadOnlyDB(f"sqlite:///{old}"), ReadOnlyDB(databases[0])
    try:
        assert not before.has_index("metrics", "key") and after.has_index("metrics", "key")
        assert metric_series(before, RUN, METRIC_KEYS) == metric_series(after, RUN, METRIC_KEYS)
        assert metric_series(before, RUN) == metric_series(after, RUN)  # every key
    finally:
        before.close()
        after.close()
