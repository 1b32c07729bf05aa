"""Replay schema through Alembic (schema 10): a schema-5 file made by the store before
Alembic is upgraded in place; the revisions build exactly the tables of ``models``; the
new columns and tables round-trip (episode ``kind``, trainer-side log-probs and entropies,
``reruns``); full-text search over actions and observations; read-only opening. Real
databases (SQLite, and PostgreSQL: see conftest.py)."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path

import pytest
from alembic.autogenerate import compare_metadata
from alembic.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import select

import agentrl.replay.migrations as migrations
from agentrl.errors import ConfigError, ContractError
from agentrl.replay import SCHEMA_VERSION, ReplayStore
from agentrl.replay.models import Base, EpisodeRow, SchemaVersionRow
from agentrl.replay.read.search import matching_turns, search_terms
from agentrl.replay.search_index import FTS_TABLE, PG_SEARCH_COLUMN, rebuild_sqlite_index
from tests.integration.replay.data import make_rev7_db as rev7
from tests.integration.replay.data.make_schema5_db import ADVANTAGES, METRICS, expected_schema5_episodes

SCHEMA5_DB = Path(__file__).parent / "data" / "replay_schema5.db"
REV7_DB = Path(__file__).parent / "data" / "replay_rev7.db"


def test_head_is_the_script_directorys_head() -> None:
    script = ScriptDirectory(str(Path(migrations.__file__).parent))
    assert script.get_current_head() == migrations.HEAD
    assert migrations.known_revisions() == [migrations.BASELINE, "0006", "0007", "0008", "0009", "0010"]


def _not_ours(obj, name, type_, reflected, compare_to) -> bool:
    # the search index lives outside the ORM models: SQLite's FTS5 table (and its shadow
    # tables), PostgreSQL's generated tsvector column
    if type_ == "table" and (name == "alembic_version" or name.startswith(FTS_TABLE)):
        return False
    if type_ == "column" and name == PG_SEARCH_COLUMN:
        return False
    if type_ == "index" and name == "ix_turns_search":
        return False
    return True


def test_the_revisions_build_exactly_the_models_tables(store: ReplayStore) -> None:
    with store.engine.connect() as conn:
        ctx = MigrationContext.configure(conn, opts={"include_object": _not_ours, "compare_type": True})
        diff = compare_metadata(ctx, Base.metadata)
    assert diff == [], diff


def test_a_schema_5_file_of_the_store_before_alembic_is_upgraded_in_place(tmp_path) -> None:
    path = tmp_path / "replay.db"
    shutil.copy(SCHEMA5_DB, path)  # never upgrade the committed file itself
    with ReplayStore(f"sqlite:///{path}") as store:
        with store.engine.connect() as conn:
            assert migrations.current_revision(conn) == migrations.HEAD
            assert conn.scalar(select(SchemaVersionRow.version)) == SCHEMA_VERSION == 10
        assert [r.run_id for r in store.runs()] == ["run-schema5"]
        assert store.completed_iterations("run-schema5") == [1]  # numbered from 1 (revision 0008)
        for it, eps in expected_schema5_episodes().items():
            assert [s.episode_id for s in store.list_episodes("run-schema5", it + 1)] == [e.episode_id for e in eps]
            for k, ep in enumerate(eps):
                assert store.get_episode(ep.episode_id) == ep  # tokens, log-probs, events bit-exact
                adv = ADVANTAGES.get(it, {}).get(str(k))
                assert store.get_advantages(ep.episode_id) == (adv or [None] * len(ep.turns))
                assert store.get_trainer_values(ep.episode_id) == [(None, None)] * len(ep.turns)
        assert store.get_episode("spans-update").turns[1].policy_versions[-1] == 1 + 4 % 3 + 0
        assert all(s.kind == "train" for s in store.list_episodes("run-schema5"))
        assert store.metrics("run-schema5") == {it + 1: dict(sorted(m.items())) for it, m in METRICS.items()}
        with store.engine.connect() as conn:  # text stored before the upgrade is searchable
            hits = conn.execute(matching_turns("sqlite", "echo 5 0")).all()
        assert {tuple(h) for h in hits} == {(expected_schema5_episodes()[1][1].episode_id, 0)}
        store.add_episodes("run-schema5", 2, [expected_schema5_episodes()[1][1]])  # replace works
        assert store.count_episodes("run-schema5") == 6


def test_revision_0008_numbers_the_iterations_of_a_revision_7_file_from_1(tmp_path) -> None:
    path = tmp_path / "replay.db"
    shutil.copy(REV7_DB, path)  # made by the store of revision 0007 (data/make_rev7_db.py)
    with sqlite3.connect(path) as conn:
        assert conn.execute("SELECT version_num FROM alembic_version").fetchone() == ("0007",)
    with ReplayStore(f"sqlite:///{path}") as store:
        with store.engine.connect() as conn:
            assert migrations.current_revision(conn) == migrations.HEAD
            assert conn.scalar(select(SchemaVersionRow.version)) == SCHEMA_VERSION == 10
        run = rev7.RUN
        assert store.iterations(run) == [1, 2] and store.completed_iterations(run) == [1]
        for it, eps in rev7.expected_rev7_episodes().items():  # ids kept (0-based), rows under it + 1
            got = store.list_episodes(run, it + 1, kind="train")
            assert [s.episode_id for s in got] == [e.episode_id for e in eps]
            assert all(s.iteration == it + 1 for s in got)
            assert [store.get_episode(e.episode_id) for e in eps] == eps  # turns and events intact
        assert [s.episode_id for s in store.list_episodes(run, 1, kind="eval")] == [f"{run}/eval/it0/x/0/a0"]
        metrics = store.metrics(run)  # the column now equals the line's own `iteration`
        assert {it: m["iteration"] for it, m in metrics.items()} == {1: 1.0, 2: 2.0}
        assert store.get_run(run).iterations == 2
        # `agentrl eval`'s rows are iteration 0 before and after
        assert store.iterations(rev7.EVAL_RUN) == [0] and store.completed_iterations(rev7.EVAL_RUN) == [0]
        assert store.metrics(rev7.EVAL_RUN) == {0: {"eval/pass@1": 1.0}}
        # a resume of the old run after its checkpoint (1 iteration done) drops iteration 2 only
        assert store.rewind(run, 1) == 2 and store.iterations(run) == [1]
    with ReplayStore(f"sqlite:///{path}") as store:  # opening again changes nothing
        assert store.iterations(rev7.RUN) == [1] and store.iterations(rev7.EVAL_RUN) == [0]


def test_revision_0008_downgrade_and_upgrade_round_trip(db_url: str, make_episode) -> None:
    from alembic import command
    from alembic.config import Config

    with ReplayStore(db_url) as store:
        store.start_run("run-d", {})
        store.add_episodes("run-d", 1, [make_episode(0)])
        store.add_metrics("run-d", 1, {"iteration": 1.0})
        store.add_metrics("run-d", 2, {"iteration": 2.0})
        store.mark_complete("run-d", 2)
        store.start_run("eval-d", {"kind": "eval"})
        store.add_metrics("eval-d", 0, {"eval/pass@1": 0.5})
        store.mark_complete("eval-d", 0)
        with store.engine.begin() as conn:
            cfg = Config()
            cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
            cfg.attributes["connection"] = conn
            command.downgrade(cfg, "0007")
            assert sorted(conn.execute(select(EpisodeRow.iteration)).scalars()) == [0]
    with ReplayStore(db_url) as store:  # upgraded again on open
        assert store.iterations("run-d") == [1, 2] and store.completed_iterations("run-d") == [1, 2]
        assert store.iterations("eval-d") == [0] and store.completed_iterations("eval-d") == [0]


def test_kind_trainer_values_and_reruns_round_trip(store: ReplayStore, make_episode) -> None:
    store.start_run("run-n", {})
    train, ev = make_episode(0), make_episode(1, episode_id="eval-1")
    n = [len(t.completion_ids) for t in train.turns]
    values = {train.episode_id: [([-0.5 - j / 8 for j in range(n[0])], [1.0 + j / 16 for j in range(n[0])]),
                                 None,
                                 ([-0.0] * n[2], [2.0 ** -30] * n[2])]}
    store.add_episodes("run-n", 0, [train], trainer_values=values)
    store.add_episodes("run-n", 0, [ev], kind="eval")
    assert {s.episode_id: s.kind for s in store.list_episodes("run-n")} == {train.episode_id: "train", "eval-1": "eval"}
    assert [s.episode_id for s in store.list_episodes("run-n", kind="eval")] == ["eval-1"]
    assert (store.count_episodes("run-n", kind="train"), store.count_episodes("run-n", 0)) == (1, 2)
    with pytest.raises(ContractError, match="kind='x'"):
        store.count_episodes("run-n", kind="x")
    back = store.get_trainer_values(train.episode_id)
    assert back[0] == values[train.episode_id][0] and back[1] == (None, None)
    assert back[2][1] == [2.0 ** -30] * n[2]
    # written later, by an update (a separate transaction): only the given turn changes
    later = [None, ([-1.0] * n[1], [0.5] * n[1]), None]
    assert store.set_trainer_values("run-n", {train.episode_id: later}) == 1
    back = store.get_trainer_values(train.episode_id)
    assert back[1] == later[1] and back[0] == values[train.episode_id][0]

    first = store.add_rerun(train.episode_id, same=True, first_divergent_turn=None, report={"turns": []})
    second = store.add_rerun(train.episode_id, same=False, first_divergent_turn=2, report={"turns": [1, 2]})
    third = store.add_rerun(train.episode_id, same=None, first_divergent_turn=None, report={"error": "sandbox"})
    got = store.reruns(train.episode_id)
    assert [r.rerun_id for r in got] == [third, second, first]
    assert (got[1].same, got[1].first_divergent_turn, got[1].report) == (False, 2, {"turns": [1, 2]})
    assert got[0].same is None and store.reruns("eval-1") == []

    with pytest.raises(ContractError, match="kind='test'"):
        store.add_episodes("run-n", 0, [make_episode(2)], kind="test")
    with pytest.raises(ContractError, match="expected one per completion id"):
        store.set_trainer_values("run-n", {train.episode_id: [([0.0], [0.0]), None, None]})
    with pytest.raises(ContractError, match="non-finite"):
        store.set_trainer_values("run-n", {train.episode_id: [None, ([float("nan")] * n[1], [0.0] * n[1]), None]})
    with pytest.raises(ContractError, match="not stored under run"):
        store.set_trainer_values("run-n", {"nope": [None]})
    with pytest.raises(ContractError, match="same=True with first_divergent_turn=1"):
        store.add_rerun(train.episode_id, same=True, first_divergent_turn=1, report={})
    with pytest.raises(ContractError, match="not in"):
        store.add_rerun("nope", same=True, first_divergent_turn=None, report={})
    store.mark_complete("run-n", 1)
    with pytest.raises(ContractError, match="marked complete"):
        store.set_trainer_values("run-n", {train.episode_id: later})
    # replacing or rewinding an episode removes its reruns with it
    store.rewind("run-n", 0)
    assert store.reruns(train.episode_id) == []


def test_full_text_search_follows_inserts_replacements_and_deletes(store: ReplayStore, make_episode) -> None:
    store.start_run("run-f", {})
    a = make_episode(0)
    a.turns[1].observation_text = "bash: ./solve.sh: Permission denied\n"
    b = make_episode(1)
    b.turns[0].action_text = "<bash>chmod +x solve.sh && ./solve.sh</bash>"
    b.turns[2].observation_text = "PERMISSION check passed; nothing denied"
    store.add_episodes("run-f", 0, [a, b])
    dialect = store.engine.dialect.name

    def hits(q: str) -> set[tuple[str, int]]:
        with store.engine.connect() as conn:
            return {(e, int(k)) for e, k in conn.execute(matching_turns(dialect, q))}

    assert hits("permission denied") == {(a.episode_id, 1), (b.episode_id, 2)}  # every word, any order, any case
    assert hits("solve.sh") == {(a.episode_id, 1), (b.episode_id, 0)}
    assert hits('"denied" (*') == {(a.episode_id, 1), (b.episode_id, 2)}  # no query syntax reaches the index
    assert hits("no-such-word-anywhere") == set()
    b.turns[2].observation_text = "all good"
    store.add_episodes("run-f", 0, [b])  # replaced: the old text leaves the index
    assert hits("permission denied") == {(a.episode_id, 1)}
    store.rewind("run-f", 0)
    assert hits("permission") == set() and hits("echo") == set()
    with pytest.raises(ContractError, match="has no words"):
        matching_turns(dialect, " -- ")
    if dialect == "sqlite":  # after a VACUUM (which may renumber rowids): rebuilt from turns
        store.add_episodes("run-f", 0, [a])
        raw = sqlite3.connect(store.engine.url.database, isolation_level=None)
        raw.execute("VACUUM")
        raw.close()
        with store.engine.begin() as conn:
            assert rebuild_sqlite_index(conn) == len(a.turns)
        assert hits("permission denied") == {(a.episode_id, 1)}
        store.rewind("run-f", 0)
        assert hits("permission") == set()
    assert search_terms("Foo_bar, BAZ!") == ["foo", "bar", "baz"]


def test_read_only_store_checks_and_never_writes(db_url: str, make_episode, tmp_path) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        ReplayStore(f"sqlite:///{tmp_path / 'empty.db'}", read_only=True)  # not created read-only
    assert not (tmp_path / "empty.db").exists()
    with ReplayStore(db_url) as store:
        store.start_run("run-r", {})
        store.add_episodes("run-r", 0, [make_episode(0)])
    with ReplayStore(db_url, read_only=True) as viewer:
        assert viewer.count_episodes("run-r") == 1
        with pytest.raises(ContractError, match="read_only=True"):
            viewer.start_run("run-x", {})
        with pytest.raises(ContractError, match="read_only=True"):
            viewer.add_rerun("x", same=True, first_divergent_turn=None, report={})
    with ReplayStore(db_url) as store, store.engine.begin() as conn:
        conn.execute(EpisodeRow.__table__.update().values(kind="train"))  # a writer still works
