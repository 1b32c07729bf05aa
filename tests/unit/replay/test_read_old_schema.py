"""Reads of a database left at an older schema and opened read-only (``ReadOnlyDB``, as the
viewer and ``agentrl diagnose`` read): nothing upgrades it, so the columns of later revisions
are absent and read as their defaults. A schema-8 database (revision ``0008``, made by the
store at the head revision and downgraded with Alembic) reads back its episodes on branch 0,
with 0 tool calls and no counters; the schema-5 file of the migration tests reads back without
``kind``, trainer log-probs or entropies. The file is not written."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path


from agentrl.replay import ReplayStore, read
from agentrl.replay.diagnose.data import load_run
from agentrl.replay.read import ReadOnlyDB
from agentrl.types import Episode, ExecResult, TerminationReason, Turn
from tests.integration.replay.data.make_schema5_db import expected_schema5_episodes
from tests.helpers.replay_schema import downgrade

SCHEMA5_DB = Path(__file__).parents[2] / "integration" / "replay" / "data" / "replay_schema5.db"


def _episode(eid: str, position: int) -> Episode:
    turns = [
        Turn([1, 2, 3], [4, 5], [-0.25, -0.5], reward=0.0, action_text="ls",
             exec_results=[ExecResult(("ls",), 0, "x\n", "", 0.01)]),
        Turn([7], [8, 10], [-0.75, -1.0], reward=float(position), policy_version=2, action_text="done"),
    ]
    return Episode(group_id="g", env_id="x/E-v0", task_id=f"t{position}", seed=3, turns=turns, terminated=True,
                   termination_reason=TerminationReason.ENV_TERMINATED, episode_id=eid)


def _schema8_db(path: Path) -> list[Episode]:
    """A SQLite replay database at revision ``0008`` holding two episodes of run ``r``."""
    eps = [_episode("r/it1/g/0/a0", 0), _episode("r/it1/g/1/a0", 1)]
    with ReplayStore(f"sqlite:///{path}") as store:
        store.start_run("r", {})
        store.add_episodes("r", 1, eps, {eps[0].episode_id: [0.5, -0.5]})
        store.mark_complete("r", 1)
    downgrade(f"sqlite:///{path}", "0008")
    return eps


def test_a_schema_8_database_reads_back_its_episodes_with_the_new_fields_at_their_defaults(tmp_path: Path) -> None:
    path = tmp_path / "replay.db"
    eps = _schema8_db(path)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    db = ReadOnlyDB(f"sqlite:///{path}")
    try:
        assert "branch" not in db.turn_columns and "tool_calls" not in db.turn_columns
        assert "counters" not in db.episode_columns
        for ep in eps:
            back = read.get_episode(db, ep.episode_id)
            assert back == ep
            assert [t.branch for t in back.turns] == [0, 0] and [t.tool_calls for t in back.turns] == [0, 0]
            assert back.counters == {}
        assert read.get_episode(db, "nope") is None
        listed = read.list_episodes(db, "r", 1, complete_only=True, kind="train")
        assert [s.episode_id for s in listed] == [e.episode_id for e in eps]
        assert all(s.complete and s.kind == "train" for s in listed)
        assert read.get_episode_summary(db, eps[1].episode_id).total_reward == 1.0
        assert read.count_episodes(db, "r", kind="train") == 2
        data = load_run(db, "r")  # what `agentrl diagnose` reads
        assert [f.episode_id for f in data.episodes] == [e.episode_id for e in eps]
        assert [f.tool_calls for f in data.episodes] == [1, 1]  # sandbox commands, as stored
    finally:
        db.close()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before  # not upgraded, not written


def test_the_schema_5_file_reads_back_its_episodes_without_the_columns_of_schema_6(tmp_path: Path) -> None:
    path = tmp_path / "replay.db"
    shutil.copy(SCHEMA5_DB, path)
    db = ReadOnlyDB(f"sqlite:///{path}")
    try:
        assert not db.has_kind and "trainer_log_probs" not in db.turn_columns
        for it, eps in expected_schema5_episodes().items():  # iterations as stored (from 0)
            listed = read.list_episodes(db, "run-schema5", it, kind="train")
            assert [s.episode_id for s in listed] == [e.episode_id for e in eps]
            assert all(s.kind == "train" for s in listed)
            assert [read.get_episode(db, e.episode_id) for e in eps] == eps
        assert read.list_episodes(db, "run-schema5", kind="eval") == []
        assert read.count_episodes(db, "run-schema5", kind="eval") == 0
        assert read.count_episodes(db, "run-schema5", kind="train") == 6
    finally:
        db.close()
    assert path.read_bytes() == SCHEMA5_DB.read_bytes()


def test_agentrl_diagnose_reads_a_schema_8_database_as_it_is(tmp_path: Path) -> None:
    """``agentrl diagnose`` opens the database read-only without migrating it (a trainer of
    the older version may still be writing it), as the viewer does."""
    import json

    from typer.testing import CliRunner

    from agentrl.cli import app

    path = tmp_path / "replay.db"
    _schema8_db(path)
    before = path.read_bytes()
    res = CliRunner().invoke(app, ["diagnose", str(path), "--json"])
    assert res.exit_code in (0, 1), res.output
    assert json.loads(res.stdout)["run_id"] == "r"
    assert path.read_bytes() == before
