"""Resume never duplicates (design.md, invariant 7): after a SIGKILL at any point and ``--resume``, the replay store, its
metrics table and ``metrics.jsonl`` hold each iteration exactly once, and the store calls an
iteration complete only once its checkpoint is written.

A real ``agentrl train`` (Ray, vLLM on CPU, the FSDP2 trainer, SQLite replay store) on the
tiny model and GuessNumber (no sandbox: the fastest env), 4 iterations of 2 tasks × 2
rollouts with ``run.checkpoint_every=2``, in full_history and per_step mode. The kills are
deterministic: the controller's test hook (``AGENTRL_TEST_KILL_AT``,
``agentrl.driver.checkpoint.kill_point``) SIGKILLs the driver at a named phase.

* killed mid-iteration: after iteration 4's episodes are stored (iteration 3 is stored
  whole but was never checkpointed; the checkpoint is iter_2);
* killed mid-checkpoint: iter_4 is on disk but ``latest`` still names iter_2.

The full_history run is killed mid-checkpoint, then resumed to its end, and every count is
one copy per iteration (each start of a run costs about 35 s on 2 cores; the asynchronous
chaos test in test_async_train.py kills at four more points through the same per-update
code).
"""

from __future__ import annotations

import json
import re
import signal
from pathlib import Path

import pytest

from tests.helpers.train_cli import train_cli

pytestmark = pytest.mark.slow
ITERATIONS, TASKS, GROUP = 4, 2, 2
PER_ITERATION = TASKS * GROUP
KILLS = {  # the SIGKILLs of each run, in order; after the last one the run is resumed to its end
    # one kill: the async chaos test (test_async_train.py) kills mid-rollout,
    # mid-update, mid-sync and mid-checkpoint-state through the same per-update code
    # (agentrl.driver.iteration), and its resumes rewind iterations stored after the
    # checkpoint as the after_replay_write kill did here; this one keeps the kill after
    # iter_4 is written but before `latest` names it, in sync mode
    "full_history": ["mid_checkpoint:it=4"],
    "per_step": ["after_replay_write:it=4", "mid_checkpoint:it=4"],
}


def _jsonl(run_dir: Path) -> list[dict]:
    return [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]


def _latest(run_dir: Path) -> str:
    return (run_dir / "checkpoints" / "latest").read_text().strip()


def _store(run_dir: Path):
    from agentrl.replay import ReplayStore

    store = ReplayStore(f"sqlite:///{run_dir / 'replay.db'}")
    (run,) = store.runs()
    return store, run.run_id


def _ids(store, run_id: str, it: int) -> list[str]:
    return sorted(s.episode_id for s in store.list_episodes(run_id, it, limit=1000))


# full_history only (the default mode): a per_step variant runs the same kills through the
# same store code and costs ~2 min of a CI run that the multi-node tests need
@pytest.mark.parametrize("mode", ["full_history"])
def test_sigkill_then_resume_stores_each_iteration_once(tmp_path, tiny_model_path, mode):
    run_dir = tmp_path / mode
    args = [f"run.name=resume-{mode.replace('_', '')}", f"run.dir={run_dir}", f"run.iterations={ITERATIONS}",
            "run.checkpoint_every=2", "run.seed=0", f"model.path={tiny_model_path}", "env.id=agentrl/GuessNumber-v0",
            f"env.tasks_per_iteration={TASKS}", f"env.group_size={GROUP}", "rollout.max_turns=2",
            "rollout.max_new_tokens=8", "rollout.max_context_tokens=1024", f"rollout.prompt_mode={mode}",
            "rollout.history_length=1", "trainer.micro_batch_size=2", "cluster.num_cpus=4",
            "eval.before_training=false", "eval.after_training=false"]  # the packaged default evaluates; not this test's subject

    first_ids: dict[int, list[str]] = {}
    for k, kill_at in enumerate(KILLS[mode]):
        rc, out = train_cli(["--resume", str(run_dir)] if k else args, kill_at)
        assert rc == -signal.SIGKILL, out[-3000:]
        assert _latest(run_dir) == "iter_2"  # the only complete checkpoint
        store, run_id = _store(run_dir)
        with store:
            # Iteration 4's episodes (and all of iteration 3) are stored, but only the
            # checkpointed iterations 1 and 2 count as complete.
            assert store.iterations(run_id) == [1, 2, 3, 4]
            assert store.completed_iterations(run_id) == [1, 2]
            assert store.count_episodes(run_id) == 4 * PER_ITERATION  # each once: a resume dropped its attempt
            assert store.count_episodes(run_id, complete_only=True) == 2 * PER_ITERATION
            assert sorted(store.metrics(run_id, complete_only=True)) == [1, 2]
            ids = {it: _ids(store, run_id, it) for it in range(1, 5)}
            assert ids == (first_ids or ids)  # a re-run iteration's episodes keep their ids
            first_ids = ids
            if kill_at.startswith("after_replay_write"):  # mid-iteration: iteration 4 has no metrics yet
                assert [m["iteration"] for m in _jsonl(run_dir)] == [1, 2, 3]
                assert sorted(store.metrics(run_id)) == [1, 2, 3]
            else:  # mid-checkpoint: iter_4 is written, `latest` does not name it yet
                assert (run_dir / "checkpoints" / "iter_4" / "controller.json").is_file()
                assert [m["iteration"] for m in _jsonl(run_dir)] == [1, 2, 3, 4]
                assert sorted(store.metrics(run_id)) == [1, 2, 3, 4]
        if k == 0:
            first_lines = _jsonl(run_dir)[:2]

    # --resume to the end.
    rc, out = train_cli(["--resume", str(run_dir)])
    assert rc == 0, out[-3000:]
    assert _latest(run_dir) == f"iter_{ITERATIONS}"
    lines = _jsonl(run_dir)
    assert [m["iteration"] for m in lines] == [1, 2, 3, 4]  # one line per iteration
    assert lines[:2] == first_lines  # the checkpointed iterations' lines are kept as written
    assert all(m["rollout/episodes"] == PER_ITERATION for m in lines)
    with _store(run_dir)[0] as store:
        assert store.get_run(run_id).resume_count == len(KILLS[mode]) and store.get_run(run_id).status.value == "finished"
        assert store.completed_iterations(run_id) == list(range(1, ITERATIONS + 1))
        assert store.iterations(run_id) == list(range(1, ITERATIONS + 1))
        for it in range(1, ITERATIONS + 1):
            assert store.count_episodes(run_id, it) == store.count_episodes(run_id, it, complete_only=True) == PER_ITERATION
            ids = _ids(store, run_id, it)
            assert ids == first_ids[it] and len(set(ids)) == PER_ITERATION
            # "{run_id}/it{iteration}/{task_id}@{position}/{index}/a{attempt}"
            pattern = re.compile(rf"{re.escape(run_id)}/it{it}/guess/\d+@({2 * it - 2}|{2 * it - 1})/[01]/a0")
            assert all(pattern.fullmatch(i) for i in ids), ids
            assert {s.complete for s in store.list_episodes(run_id, it)} == {True}
            assert {e.prompt_mode for e in map(store.get_episode, ids[:1])} == {mode}
        assert store.count_episodes(run_id) == ITERATIONS * PER_ITERATION
        metrics = store.metrics(run_id)
        assert sorted(metrics) == list(range(1, ITERATIONS + 1))
        for it in range(1, ITERATIONS + 1):  # the store's metrics row and the metrics.jsonl line are the same attempt's
            assert metrics[it]["iteration"] == it
            assert metrics[it]["rollout/reward_mean"] == pytest.approx(lines[it - 1]["rollout/reward_mean"])
            assert metrics[it]["time/iteration_s"] == lines[it - 1]["time/iteration_s"]
    assert not list((run_dir / "checkpoints").glob(".*"))  # no half-written checkpoint is left
