"""One real training iteration on each built-in environment (real vLLM, real bubblewrap
sandbox, real update and sync), in full-history mode, and in per-step mode for the long-horizon
ones (Sokoban, TextWorld). HumanEval's iteration is in test_train_loop.py; ShellTasks' is the
first of the viewer's real runs (the session fixture ``real_runs``: the same GiGPO, bubblewrap,
full-history set-up, which paid a run of its own here)."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow


def _check_one_iteration(run_dir, db_url, run_id, env_id, mode, episodes):
    from agentrl.replay import ReplayStore

    m = json.loads((run_dir / "metrics.jsonl").read_text().splitlines()[0])
    assert m["rollout/episodes"] == episodes and m["filter/infra_errors"] == 0 and m["filter/reward_errors"] == 0
    assert m["tokens/trained"] > 0 and m["policy_version"] == 1
    with ReplayStore(db_url) as store:
        ep = store.get_episode(store.list_episodes(run_id)[0].episode_id)
    assert ep.prompt_mode == mode and ep.env_id == env_id
    if mode == "per_step" and len(ep.turns) > 1:
        assert m["tokens/packed"] > 0  # one row per step
    return m


def test_one_iteration_on_shell_tasks(ray_session, request):
    """ShellTasks, full history, GiGPO, bubblewrap: the first run of ``real_runs`` (2 tasks x 2
    rollouts). Asked for here, after ``ray_session``, so the runs use this Ray instance
    (a session fixture in the signature would be set up before the module's ``ray_session``)."""
    runs = request.getfixturevalue("real_runs")
    _check_one_iteration(runs.run_dirs[0], runs.db_url, runs.run_ids[0], "agentrl/ShellTasks-v0", "full_history", 4)


@pytest.mark.parametrize("env_id, mode", [
    ("agentrl/Sokoban-v0", "per_step"),
    ("agentrl/TextWorld-v0", "full_history"),
])  # each env once, each prompt mode twice (the modes live in the env-agnostic loop: unit tests);
# GuessNumber trains in the resume and async tests (test_resume_no_duplicates.py, test_async_train.py)
def test_one_iteration_on_builtin_env(ray_session, tmp_path, tiny_model_path, env_id, mode):
    from agentrl.driver.controller import train
    from agentrl.config import load_config

    name = env_id.split("/")[1].replace("-", "") + "_" + mode
    cfg = load_config(None, [
        f"run.dir={tmp_path / name}", "run.iterations=1", f"model.path={tiny_model_path}", f"env.id={env_id}",
        "env.tasks_per_iteration=1", "env.group_size=2", "rollout.max_turns=3", "rollout.max_new_tokens=12",
        "rollout.max_context_tokens=2048", f"rollout.prompt_mode={mode}", "rollout.history_length=1",
        "sandbox.backend=bwrap", "algorithm.advantage=gigpo", "trainer.micro_batch_size=2",
    ])
    summary = train(cfg)
    assert summary.policy_version == 1
    _check_one_iteration(tmp_path / name, f"sqlite:///{tmp_path / name / 'replay.db'}", summary.run_id, env_id, mode, 2)
