"""Revision ``0010`` of the replay store (schema_version 10): the ``judgements`` table
(``Episode.judgement``) and the judge cache, on SQLite. A judged episode round-trips
(``get_episode`` and the viewer's ``episode_view``), replacing an episode replaces its
judgement, an episode without one has no row; the cache keeps the first answer of a key;
a schema-9 database is upgraded on open, and read-only (``ReadOnlyDB``, not upgraded) reads
its episodes with no judgement."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest
from sqlalchemy import select

import agentrl.replay.migrations as migrations
from agentrl.errors import ContractError
from agentrl.replay import SCHEMA_VERSION, ReplayStore, read
from agentrl.replay.models import JudgementRow, SchemaVersionRow
from agentrl.replay.read import ReadOnlyDB
from agentrl.types import Episode, ExecResult, JudgeRecord, TerminationReason, Turn
from tests.helpers.replay_schema import downgrade


def _record(score: float = 0.75, **fields: object) -> JudgeRecord:
    values: dict[str, object] = dict(
        model="judge-7b", rubric="helpful", rubric_digest=hashlib.sha256(b"rubric").hexdigest(), mode="group",
        prompt=[{"role": "system", "content": "grade\x00it"}, {"role": "user", "content": "answer: 42 \u00e9"}],
        output='{"correct": 1, "style": 0.5}', scores={"correct": 1.0, "style": 0.5},
        reasons={"": "fine overall", "style": "terse"}, score=score, gate_failed=None, rule_reward=0.0,
        reward=score, latency_s=1.25, cached=False, judged=True, group_position=2, error=None,
    )
    values.update(fields)
    return JudgeRecord(**values)  # type: ignore[arg-type]


def _episode(eid: str, judgement: JudgeRecord | None = None) -> Episode:
    turns = [
        Turn([1, 2, 3], [4, 5], [-0.25, -0.5], reward=0.0, action_text="ls",
             exec_results=[ExecResult(("ls",), 0, "x\n", "", 0.01)]),
        Turn([7], [8, 10], [-0.75, -1.0], reward=0.75, policy_version=1, action_text="done"),
    ]
    return Episode(group_id="g", env_id="x/E-v0", task_id="t", seed=3, turns=turns, terminated=True,
                   termination_reason=TerminationReason.ENV_TERMINATED, episode_id=eid, judgement=judgement)


def _judgement_ids(store: ReplayStore) -> list[str]:
    with store.engine.connect() as conn:
        return list(conn.scalars(select(JudgementRow.episode_id).order_by(JudgementRow.episode_id)))


def test_a_judged_episode_round_trips_and_the_viewer_reads_its_row(tmp_path: Path) -> None:
    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as store:
        store.start_run("r", {})
        judged = _episode("r/it1/g/0/a0", _record())
        failed = _episode("r/it1/g/1/a0", _record(output=None, scores={}, reasons={}, score=None, reward=None,
                                                  latency_s=0.0, mode="single", group_position=None,
                                                  gate_failed="correct", error="judge timed out after 3 tries"))
        plain = _episode("r/it1/g/2/a0")
        store.add_episodes("r", 1, [judged, failed, plain])
        assert store.get_episode(judged.episode_id) == judged
        assert store.get_episode(judged.episode_id).judgement.prompt[0]["content"] == "grade\x00it"
        assert store.get_episode(failed.episode_id) == failed
        assert store.get_episode(plain.episode_id) == plain and store.get_episode(plain.episode_id).judgement is None
        assert _judgement_ids(store) == [judged.episode_id, failed.episode_id]  # none for the unjudged episode
        view = read.episode_view(store.db, judged.episode_id)
        assert view.judgement.model == "judge-7b" and view.judgement.scores == {"correct": 1.0, "style": 0.5}
        assert view.judgement.reasons[""] == "fine overall" and view.judgement.group_position == 2
        assert read.episode_view(store.db, plain.episode_id).judgement is None
        with store.engine.connect() as conn:
            assert conn.scalar(select(SchemaVersionRow.version)) == SCHEMA_VERSION == 10
            assert migrations.current_revision(conn) == migrations.HEAD == "0010"


def test_replacing_an_episode_replaces_or_removes_its_judgement(tmp_path: Path) -> None:
    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as store:
        store.start_run("r", {})
        eid = "r/it1/g/0/a0"
        store.add_episodes("r", 1, [_episode(eid, _record(0.25))])
        assert store.add_episodes("r", 1, [_episode(eid, _record(1.0, cached=True, latency_s=0.0))]) == 1
        back = store.get_episode(eid).judgement
        assert back.score == 1.0 and back.cached and _judgement_ids(store) == [eid]
        store.add_episodes("r", 1, [_episode(eid)])  # written again without a judgement: no row
        assert store.get_episode(eid).judgement is None and _judgement_ids(store) == []
        store.add_episodes("r", 1, [_episode(eid, _record())])
        assert store.rewind("r", 0) == 1 and _judgement_ids(store) == []  # deleted with its episode


def test_a_judgement_that_is_not_json_or_out_of_range_is_refused(tmp_path: Path) -> None:
    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as store:
        store.start_run("r", {})
        with pytest.raises(ContractError, match="judgement prompt is not JSON-serializable"):
            store.add_episodes("r", 1, [_episode("r/it1/g/0/a0", _record(prompt=[{"content": float("nan")}]))])
        with pytest.raises(ContractError, match=r"scores\['style'\]=1.5"):
            store.add_episodes("r", 1, [_episode("r/it1/g/0/a0", _record(scores={"style": 1.5}))])
        assert store.count_episodes("r") == 0


def _key(i: int) -> str:
    return hashlib.sha256(f"prompt {i}".encode()).hexdigest()


def test_the_judge_cache_keeps_the_first_answer_of_a_key(tmp_path: Path) -> None:
    digest = hashlib.sha256(b"rubric").hexdigest()
    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as store:
        assert store.judge_cache_get([_key(0)]) == {} and store.judge_cache_get([]) == {}
        store.judge_cache_put([(_key(0), "judge-7b", digest, "first"), (_key(0), "judge-7b", digest, "dup in batch")])
        store.judge_cache_put([(_key(0), "judge-7b", digest, "second"), (_key(1), "judge-7b", digest, "a\x00b")])
        store.judge_cache_put([])
        assert store.judge_cache_get([_key(0), _key(1), _key(2)]) == {_key(0): "first", _key(1): "a\x00b"}
        many = [(_key(i), "judge-7b", digest, f"answer {i}") for i in range(1200)]  # several IN chunks
        store.judge_cache_put(many)
        got = store.judge_cache_get([k for k, *_ in many] + [_key(5000)])
        assert len(got) == 1200 and got[_key(0)] == "first" and got[_key(1199)] == "answer 1199"
        for bad, what in (("ABC", "hex sha256"), (_key(0).upper(), "hex sha256")):
            with pytest.raises(ContractError, match=what):
                store.judge_cache_put([(bad, "judge-7b", digest, "x")])
        with pytest.raises(ContractError, match="output=None"):
            store.judge_cache_put([(_key(9000), "judge-7b", digest, None)])  # type: ignore[list-item]
        assert store.judge_cache_get([_key(9000)]) == {}


def _schema9_db(path: Path) -> list[Episode]:
    """A SQLite replay database at revision ``0009`` holding two episodes of run ``r``."""
    eps = [_episode("r/it1/g/0/a0"), _episode("r/it1/g/1/a0")]
    with ReplayStore(f"sqlite:///{path}") as store:
        store.start_run("r", {})
        store.add_episodes("r", 1, eps)
        store.judge_cache_put([(_key(0), "judge-7b", "d", "x")])
    downgrade(f"sqlite:///{path}", "0009")
    return eps


def test_a_schema_9_database_is_upgraded_on_open(tmp_path: Path) -> None:
    path = tmp_path / "replay.db"
    eps = _schema9_db(path)
    with sqlite3.connect(path) as con:
        assert con.execute("SELECT version_num FROM alembic_version").fetchone() == ("0009",)
        assert con.execute("SELECT version FROM schema_version").fetchone() == (9,)
        tables = {r[0] for r in con.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert not tables & {"judgements", "judge_cache"} and "episodes" in tables
    with ReplayStore(f"sqlite:///{path}") as store:
        assert [store.get_episode(e.episode_id) for e in eps] == eps
        assert store.judge_cache_get([_key(0)]) == {}  # the downgrade dropped the cache
        judged = _episode(eps[0].episode_id, _record())
        store.add_episodes("r", 1, [judged])
        assert store.get_episode(judged.episode_id) == judged
        with store.engine.connect() as conn:
            assert migrations.current_revision(conn) == "0010"
            assert conn.scalar(select(SchemaVersionRow.version)) == 10


def test_a_schema_9_database_read_only_reads_its_episodes_without_a_judgement(tmp_path: Path) -> None:
    path = tmp_path / "replay.db"
    eps = _schema9_db(path)
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    db = ReadOnlyDB(f"sqlite:///{path}")
    try:
        assert "judgements" not in db.tables
        for ep in eps:
            back = read.get_episode(db, ep.episode_id)
            assert back == ep and back.judgement is None
            assert read.episode_view(db, ep.episode_id).judgement is None
        assert read.judge_cache(db, [_key(0)]) == {}
    finally:
        db.close()
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before  # not upgraded, not written
