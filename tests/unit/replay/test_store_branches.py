"""Revision ``0009`` of the replay store (schema_version 9): ``turns.branch``, ``turns.tool_calls``
and ``episodes.counters``. An episode with branches, tool-call counts and counters round-trips
through a SQLite store; one without them reads back as it was; the revision's downgrade and
upgrade keep the rows (turns stored at ``0008`` read back on branch 0, no tool calls, no
counters) and the full-text index's triggers."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from alembic import command
from alembic.config import Config
from sqlalchemy import select

import agentrl.replay.migrations as migrations
from agentrl.replay import SCHEMA_VERSION, ReplayStore
from agentrl.replay.models import SchemaVersionRow
from agentrl.types import Episode, ExecResult, TerminationReason, Turn


def _episode(eid: str, *, branched: bool = True) -> Episode:
    turns = [
        Turn([1, 2, 3], [4, 5], [-0.25, -0.5], reward=0.0, action_text="a0", tool_calls=2 if branched else 0,
             exec_results=[ExecResult(("ls",), 0, "x\n", "", 0.01)]),
        Turn([1, 9, 9], [6], [-0.125], reward=0.0, branch=1 if branched else 0, policy_version=1, action_text="a1"),
        Turn([7], [8, 10], [-0.75, -1.0], reward=1.0, policy_version=2, action_text="a2", tool_calls=1 if branched else 0),
    ]
    return Episode(group_id="g", env_id="x/E-v0", task_id="t", seed=3, turns=turns, terminated=True,
                   termination_reason=TerminationReason.ENV_TERMINATED, episode_id=eid,
                   counters={"gateway/forks": 1.0, "gateway/requests": 3.0} if branched else {})


def _cfg(conn) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(migrations.__file__).parent))
    cfg.attributes["connection"] = conn
    return cfg


def test_branches_tool_calls_and_counters_round_trip(tmp_path: Path) -> None:
    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as store:
        store.start_run("r", {})
        branched, plain = _episode("r/it1/g/0/a0"), _episode("r/it1/g/1/a0", branched=False)
        store.add_episodes("r", 1, [branched, plain], {branched.episode_id: [0.5, -0.5, 1.0]})
        back = store.get_episode(branched.episode_id)
        assert back == branched
        assert [t.branch for t in back.turns] == [0, 1, 0] and [t.tool_calls for t in back.turns] == [2, 0, 1]
        assert back.counters == {"gateway/forks": 1.0, "gateway/requests": 3.0}
        assert [r.key for r in back.rows()] == [branched.episode_id, f"{branched.episode_id}:b1"]
        assert store.get_episode(plain.episode_id) == plain and store.get_episode(plain.episode_id).counters == {}
        with store.engine.connect() as conn:
            assert conn.scalar(select(SchemaVersionRow.version)) == SCHEMA_VERSION == 10
            assert migrations.current_revision(conn) == migrations.HEAD == "0010"
            stored = conn.exec_driver_sql("SELECT counters FROM episodes ORDER BY position").scalars().all()
        assert stored[1] is None  # no counters: NULL


def test_the_downgrade_to_0008_and_the_upgrade_keep_the_rows_and_the_search_triggers(tmp_path: Path) -> None:
    path = tmp_path / "replay.db"
    with ReplayStore(f"sqlite:///{path}") as store:
        store.start_run("r", {})
        store.add_episodes("r", 1, [_episode("r/it1/g/0/a0")])
        with store.engine.begin() as conn:
            command.downgrade(_cfg(conn), "0008")
    with sqlite3.connect(path) as con:
        assert con.execute("SELECT version_num FROM alembic_version").fetchone() == ("0008",)
        assert con.execute("SELECT version FROM schema_version").fetchone() == (8,)
        cols = {r[1] for r in con.execute("PRAGMA table_info(turns)")}
        assert not cols & {"branch", "tool_calls"} and "action_text" in cols
        triggers = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'")}
        assert {"turns_fts_insert", "turns_fts_delete", "turns_fts_update"} <= triggers
    with ReplayStore(f"sqlite:///{path}") as store:  # upgraded again on open
        back = store.get_episode("r/it1/g/0/a0")
        assert [t.branch for t in back.turns] == [0, 0, 0] and [t.tool_calls for t in back.turns] == [0, 0, 0]
        assert back.counters == {} and [t.completion_ids for t in back.turns] == [[4, 5], [6], [8, 10]]
        store.add_episodes("r", 1, [_episode("r/it1/g/0/a0")])  # a replacement writes the new columns
        assert store.get_episode("r/it1/g/0/a0") == _episode("r/it1/g/0/a0")
