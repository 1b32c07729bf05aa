"""The replay store's side of a resume that never duplicates (design.md, invariant 7): completion
marks, reads that leave out incomplete iterations, ``rewind`` to a checkpoint, and the
in-place upgrade of a version-3 database (through Alembic: 3 -> 4 -> 5 -> head). Real databases (SQLite, and PostgreSQL when
$AGENTRL_TEST_POSTGRES_URL is set; see conftest.py). No mocks."""

from __future__ import annotations

import sqlite3

import pytest
from sqlalchemy import create_engine, func, select, text, update

from agentrl.errors import ContractError
from agentrl.replay import SCHEMA_VERSION, ReplayStore
from agentrl.replay.migrations import HEAD, current_revision
from tests.integration.replay.conftest import make_pre_alembic
from agentrl.replay.models import EpisodeRow, IterationRow, MetricRow, SandboxEventRow, SchemaVersionRow, TurnRow


def _rows(store: ReplayStore, model: type, run_id: str | None = None) -> int:
    q = select(func.count()).select_from(model)
    if run_id is not None and hasattr(model, "run_id"):
        q = q.where(model.run_id == run_id)
    with store.engine.connect() as conn:
        return int(conn.scalar(q))


def _iteration(store: ReplayStore, run_id: str, it: int, make_episode, first: int, n: int = 4) -> list:
    """Store ``n`` episodes and two metrics as iteration ``it`` of ``run_id`` (episode ids
    as the rollout makes them: deterministic from run, iteration, group and index)."""
    eps = [make_episode(first + k, episode_id=f"{run_id}/it{it}/g{first + k // 2}/{k % 2}/a0") for k in range(n)]
    store.add_episodes(run_id, it, eps)
    store.add_metrics(run_id, it, {"rollout/reward_mean": float(it), "iteration": float(it)})
    return eps


def test_iterations_count_as_complete_only_once_marked(store: ReplayStore, make_episode) -> None:
    store.start_run("run-c", {})
    for it in (1, 2, 3):  # checkpoint_every=2: iterations 1 and 2 are stored before the checkpoint
        _iteration(store, "run-c", it, make_episode, first=10 * it)
        if it == 2:
            assert store.mark_complete("run-c", 2) == [1, 2]
    assert store.completed_iterations("run-c") == [1, 2]
    assert store.count_episodes("run-c") == 12
    assert store.count_episodes("run-c", complete_only=True) == 8
    assert store.count_episodes("run-c", 3, complete_only=True) == 0 and store.count_episodes("run-c", 3) == 4
    assert store.iterations("run-c") == [1, 2, 3] and store.iterations("run-c", complete_only=True) == [1, 2]
    assert sorted(store.metrics("run-c", complete_only=True)) == [1, 2] and sorted(store.metrics("run-c")) == [1, 2, 3]
    listed = store.list_episodes("run-c")
    assert [s.complete for s in listed] == [True] * 8 + [False] * 4
    assert [s.iteration for s in store.list_episodes("run-c", complete_only=True)] == [1] * 4 + [2] * 4
    page = store.list_episodes("run-c", complete_only=True, limit=3, offset=6)
    assert [s.episode_id for s in page] == [s.episode_id for s in listed[6:8]]
    # Marks are kept: marking again adds only the new iterations.
    assert store.mark_complete("run-c", 2) == [] and store.mark_complete("run-c", 3) == [3]
    assert store.count_episodes("run-c", complete_only=True) == 12


def test_a_complete_iteration_is_frozen(store: ReplayStore, make_episode) -> None:
    store.start_run("run-f", {})
    eps = _iteration(store, "run-f", 1, make_episode, first=0)
    store.mark_complete("run-f", 1)
    with pytest.raises(ContractError, match="iteration 1 of run 'run-f' is marked complete"):
        store.add_episodes("run-f", 1, eps)
    with pytest.raises(ContractError, match="marked complete"):
        store.add_metrics("run-f", 1, {"x": 1.0})
    assert store.metrics("run-f")[1] == {"iteration": 1.0, "rollout/reward_mean": 1.0}


def test_rewind_drops_the_abandoned_attempt_and_the_rerun_is_stored_once(store: ReplayStore, make_episode) -> None:
    """A run with checkpoint_every=2 that crashed in iteration 4 after storing iterations 3
    and 4: the resume from the checkpoint after 2 iterations rewinds to it, re-runs 3 and 4,
    and then every iteration is stored exactly once."""
    store.start_run("run-r", {})
    store.start_run("run-other", {})
    other = _iteration(store, "run-other", 2, make_episode, first=500)  # another run is untouched
    for it in (1, 2, 3, 4):
        _iteration(store, "run-r", it, make_episode, first=10 * it)
        if it == 2:
            store.mark_complete("run-r", 2)
    # the crash: no checkpoint after iteration 4, so 3 and 4 stay unmarked
    store.start_run("run-r", {"resumed": True})
    assert store.rewind("run-r", 2) == 8
    assert store.iterations("run-r") == [1, 2] and store.completed_iterations("run-r") == [1, 2]
    assert store.count_episodes("run-r") == 8 and sorted(store.metrics("run-r")) == [1, 2]
    # turns and sandbox events of the dropped episodes are gone too (3 turns, 2 events each)
    assert (_rows(store, TurnRow), _rows(store, SandboxEventRow)) == (12 * 3, 12 * 6)
    assert store.count_episodes("run-other") == 4 and store.get_episode(other[0].episode_id) == other[0]
    # The re-run writes the same ids again (deterministic); with other data this time.
    for it in (3, 4):
        eps = _iteration(store, "run-r", it, make_episode, first=10 * it + 1)
    store.mark_complete("run-r", 4)
    for it in (1, 2, 3, 4):
        assert store.count_episodes("run-r", it, complete_only=True) == 4
    assert _rows(store, MetricRow, "run-r") == 8 and _rows(store, IterationRow, "run-r") == 4
    assert store.get_episode(eps[0].episode_id) == eps[0]


def test_rewind_repairs_marks_missing_after_a_crash_past_the_checkpoint(store: ReplayStore, make_episode) -> None:
    store.start_run("run-m", {})
    for it in (1, 2):
        _iteration(store, "run-m", it, make_episode, first=10 * it)
    # crash after the checkpoint after 2 iterations was written, before mark_complete
    assert store.rewind("run-m", 2) == 0
    assert store.completed_iterations("run-m") == [1, 2] and store.count_episodes("run-m", complete_only=True) == 8
    assert store.rewind("run-m", 0) == 8  # a new run's rewind to nothing leaves nothing
    assert store.iterations("run-m") == [] and store.completed_iterations("run-m") == []


def test_marks_and_rewind_refuse_bad_input(store: ReplayStore) -> None:
    with pytest.raises(ContractError, match="start_run first"):
        store.mark_complete("nope", 1)
    with pytest.raises(ContractError, match="start_run first"):
        store.rewind("nope", 1)
    store.start_run("run-b", {})
    for bad in (-1, 1.5, True):
        with pytest.raises(ContractError, match="iterations_done"):
            store.mark_complete("run-b", bad)  # type: ignore[arg-type]
        with pytest.raises(ContractError, match="iterations_done"):
            store.rewind("run-b", bad)  # type: ignore[arg-type]


def test_a_version_3_database_is_upgraded_in_place(db_url: str, make_episode) -> None:
    ep = make_episode(0)
    with ReplayStore(db_url) as store:
        store.start_run("run-old", {})
        store.add_episodes("run-old", 1, [ep])  # 0 in the schema-5 database below, 1 again after its upgrade
    make_pre_alembic(db_url)  # what schema_version 5 was, then 3: no iterations table
    engine = create_engine(db_url)
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE iterations"))
        conn.execute(update(SchemaVersionRow).values(version=3))
    engine.dispose()
    with ReplayStore(db_url) as store:
        with store.engine.connect() as conn:
            assert conn.scalar(select(SchemaVersionRow.version)) == SCHEMA_VERSION == 10  # 3 -> 4 -> 5 -> head
            assert current_revision(conn) == HEAD
        assert store.get_episode(ep.episode_id) == ep
        assert store.completed_iterations("run-old") == []  # stored before the upgrade: unmarked
        assert store.mark_complete("run-old", 1) == [1]
        assert store.count_episodes("run-old", complete_only=True) == 1


def test_a_version_2_database_is_refused_naming_both_versions(tmp_path) -> None:
    url = f"sqlite:///{tmp_path / 'v2.db'}"
    ReplayStore(url).close()
    make_pre_alembic(url)
    with sqlite3.connect(tmp_path / "v2.db") as conn:
        conn.execute("UPDATE schema_version SET version = 2")
    with pytest.raises(ContractError, match=rf"schema_version 2, this agentrl expects schema_version {SCHEMA_VERSION} "
                                            rf"\(revision '{HEAD}'\).*schema_version 3 \(3 -> 4 -> 5 -> Alembic\)"):
        ReplayStore(url)


def test_deleting_a_run_cascades_to_its_marks(store: ReplayStore, make_episode) -> None:
    store.start_run("run-d", {})
    _iteration(store, "run-d", 0, make_episode, first=0)
    store.mark_complete("run-d", 1)
    with store.engine.begin() as conn:  # foreign keys are on (the store's connect hook on SQLite)
        conn.execute(EpisodeRow.__table__.delete())
        conn.execute(MetricRow.__table__.delete())
        conn.execute(text("DELETE FROM runs WHERE run_id = 'run-d'"))
    assert _rows(store, IterationRow) == 0
