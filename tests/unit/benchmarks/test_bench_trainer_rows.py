"""``tests/benchmarks/bench_trainer.py`` benchmarks the rows a run trains on, with that run's
micro-batches: the training episodes of one iteration (not the held-out eval episodes the
store keeps beside them, nor an ``agentrl eval`` run of the same store), and the run's own
``trainer.micro_batch_tokens`` / ``micro_batch_size`` from its stored config. A real SQLite
replay store with hand-made episodes."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from agentrl.config import load_default_config
from agentrl.replay import ReplayStore
from tests.helpers.episodes import make_episode

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import bench_trainer  # noqa: E402


def _store(tmp_path: Path) -> Path:
    db = tmp_path / "replay.db"
    cfg = load_default_config(["trainer.micro_batch_tokens=1536", "trainer.micro_batch_size=2"]).model_dump(mode="json")
    with ReplayStore(f"sqlite:///{db}") as store:
        store.start_run("train-run", cfg)
        train = [make_episode("full_history", episode_id=f"train-run/it0/t{i}") for i in range(2)]
        evals = [make_episode("full_history", completions=(5, 5), episode_id=f"train-run/eval-before/e{i}")
                 for i in range(3)]
        store.add_episodes("train-run", 0, evals, kind="eval")  # eval.before_training, stored with iteration 0
        store.add_episodes("train-run", 0, train)
        store.start_run("eval-model-v1", {"kind": "eval", "config": cfg})  # an `agentrl eval` of the run, newer
        store.add_episodes("eval-model-v1", 0, [make_episode("full_history", episode_id="eval-model-v1/e0")],
                           kind="eval")
    return db


def test_rows_are_the_training_episodes_of_the_newest_training_run(tmp_path):
    db = _store(tmp_path)
    rows, _, source, stored = bench_trainer.replay_rows(db, None, None)
    assert len(rows) == 2  # the 2 training episodes (full_history: one row each), not the 3 + 1 eval ones
    assert "run train-run" in source and "2 training episodes" in source
    assert {len(r.input_ids) for r in rows} == {10}  # make_episode's default: prompts 3 + 2, completions 2 + 3
    assert stored["trainer"]["micro_batch_tokens"] == 1536


def test_an_eval_run_is_not_benchmarked_and_a_named_unknown_run_is_refused(tmp_path):
    db = _store(tmp_path)
    with pytest.raises(SystemExit, match="no training episodes"):
        bench_trainer.replay_rows(db, "eval-model-v1", None)
    with pytest.raises(SystemExit, match="no run 'nope'"):
        bench_trainer.replay_rows(db, "nope", None)


def test_micro_batches_come_from_the_runs_config_unless_given(tmp_path):
    _, _, _, stored = bench_trainer.replay_rows(_store(tmp_path), None, None)
    cfg = bench_trainer.run_config(stored)
    assert bench_trainer.micro_batches(cfg, None, None)[:2] == (2, 1536)
    size, tokens, where = bench_trainer.micro_batches(cfg, None, 4096)
    assert (size, tokens) == (2, 4096) and "--micro-batch-tokens" in where
    default = load_default_config().trainer  # --synthetic: the embedded default job's own settings
    assert bench_trainer.micro_batches(bench_trainer.run_config(None), None, None)[:2] == (
        default.micro_batch_size, default.micro_batch_tokens)
