"""RunDir (agentrl/driver/checkpoint.py): checkpoints, the metrics log and what a resume
resets, on real files; the kill hook is off unless its variable is set. The SIGKILL runs
themselves are in tests/integration/cluster/test_resume_no_duplicates.py."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from agentrl.driver.checkpoint import CHECKPOINT_FORMAT, CONTROLLER_STATE, KILL_AT_ENV, RunDir, kill_point, upgrade_state
from agentrl.errors import CheckpointError


def _save(rd: RunDir, n: int, history: list[dict]) -> None:
    def save_trainers(d):
        (d / "trainer").mkdir()
        (d / "trainer" / "weights").write_text(f"weights after {n}")

    rd.save_checkpoint(n, {"run_id": "r", "iteration": n, "history": history}, save_trainers)


def test_checkpoints_are_pointed_at_last_and_the_newest_two_are_kept(tmp_path):
    rd = RunDir(tmp_path / "run")
    assert rd.latest_checkpoint() is None and not rd.holds_run()
    for n in (2, 4, 6):
        _save(rd, n, [])
    assert rd.latest_checkpoint() == rd.checkpoints / "iter_6" and rd.holds_run()
    assert sorted(p.name for p in rd.checkpoints.iterdir()) == ["iter_4", "iter_6", "latest"]
    assert rd.load_state(rd.latest_checkpoint())["iteration"] == 6
    assert (rd.checkpoints / "iter_6" / "trainer" / "weights").read_text() == "weights after 6"
    (rd.checkpoints / "iter_6" / CONTROLLER_STATE).unlink()
    with pytest.raises(CheckpointError, match="has no controller.json"):
        rd.latest_checkpoint()


def test_rewind_keeps_exactly_the_checkpoints_history_and_drops_abandoned_checkpoints(tmp_path):
    rd = RunDir(tmp_path / "run")
    rd.path.mkdir()
    lines = [{"iteration": float(i), "rollout/reward_mean": i / 10, "x": None} for i in (1, 2, 3)]
    for line in lines:
        rd.append_metrics(line)
    with rd.metrics_path.open("a") as f:
        f.write('{"iteration": 4.0, "rollout/rew')  # a line torn by the SIGKILL
    _save(rd, 2, lines[:2])
    (rd.checkpoints / "iter_4").mkdir()  # written whole, never named by `latest` (killed mid-checkpoint)
    (rd.checkpoints / ".iter_4.tmp").mkdir()  # half-written
    state = rd.load_state(rd.latest_checkpoint())
    rd.rewind(state["iteration"], state["history"])
    assert [json.loads(x) for x in rd.metrics_path.read_text().splitlines()] == lines[:2]
    assert sorted(p.name for p in rd.checkpoints.iterdir()) == ["iter_2", "latest"]
    assert not list(rd.path.glob(".metrics*"))  # the temporary file was renamed over the log
    rd.rewind(0, [])  # a new run in a directory where an earlier start reached no checkpoint
    assert rd.metrics_path.read_text() == ""


def test_config_round_trip_and_a_directory_without_one(tmp_path):
    from agentrl.config import load_config

    rd = RunDir(tmp_path / "run")
    with pytest.raises(CheckpointError, match="not a run directory"):
        rd.load_config([])
    rd.write_config(load_config(None, ["run.iterations=2"]).model_dump(mode="json"))
    cfg = rd.load_config(["run.iterations=5"])
    assert cfg.run.iterations == 5 and cfg.run.dir == str(rd.path)
    assert rd.replay_url() == f"sqlite:///{(rd.path / 'replay.db').resolve()}"


def test_kill_point_is_off_unless_set_and_refuses_an_unknown_phase(monkeypatch):
    monkeypatch.delenv(KILL_AT_ENV, raising=False)
    kill_point("after_replay_write", 1)  # unset: nothing happens
    monkeypatch.setenv(KILL_AT_ENV, "after_replay_write:it=2")
    kill_point("after_replay_write", 1)  # another iteration: nothing happens
    kill_point("mid_checkpoint", 2)  # another phase: nothing happens
    monkeypatch.setenv(KILL_AT_ENV, "after_replay:it=2")
    with pytest.raises(CheckpointError, match="phase one of"):
        kill_point("after_replay_write", 2)


def test_kill_point_sigkills_the_process_at_its_phase():
    code = "from agentrl.driver.checkpoint import kill_point; kill_point('after_metrics', 3); print('alive')"
    proc = subprocess.run([sys.executable, "-c", code], env={KILL_AT_ENV: "after_metrics:it=3", "PATH": ""},
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == -9 and "alive" not in proc.stdout


def test_a_checkpoint_of_format_1_is_read_numbered_from_1_and_an_unknown_format_is_refused(tmp_path, caplog):
    old = {"run_id": "r", "iteration": 2, "policy_version": 2,
           "tasks": {"cursor": 4, "seed": 0, "num_tasks": 8,
                     "skip": {"skip_task_ids": ["a"], "policy_version": 0, "iteration": 0}},
           "eval": {"pending": [{"iteration": 1, "policy_version": 2, "name": "eval"},
                                {"iteration": 0, "policy_version": 0, "name": "eval_before"}]},
           "async": {"pending_requests": [{"run_id": "r", "iteration": 1, "task_id": "t"}]}}
    ckpt = tmp_path / "checkpoints" / "iter_2"
    ckpt.mkdir(parents=True)
    (ckpt / CONTROLLER_STATE).write_text(json.dumps(old))
    (tmp_path / "profiles").mkdir()
    (tmp_path / "profiles" / "iter_0.json").write_text("{}")
    with caplog.at_level("WARNING"):
        state = RunDir(tmp_path).load_state(ckpt)
    assert state["format"] == CHECKPOINT_FORMAT == 2 and state["iteration"] == 2  # a count: unchanged
    assert state["tasks"]["skip"]["iteration"] == 1  # the profile before iteration 1
    assert [p["iteration"] for p in state["eval"]["pending"]] == [2, 0]  # the eval before training stays 0
    assert state["async"]["pending_requests"][0]["iteration"] == 2
    assert "numbered from 1" in caplog.text and "profiles/iter_K.json" in caplog.text
    assert upgrade_state(state, "x") is state  # format 2: as it is
    assert old["tasks"]["skip"]["iteration"] == 0  # the state read is not changed
    with pytest.raises(CheckpointError, match=r"controller.json: checkpoint format 3"):
        upgrade_state({**old, "format": 3}, ckpt / CONTROLLER_STATE)
    with pytest.raises(CheckpointError, match=r"x: tasks.skip.iteration = 'a'"):
        upgrade_state({**old, "tasks": {"skip": {"iteration": "a"}}}, "x")
