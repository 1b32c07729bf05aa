"""The difficulty profile and the hard-vs-wrong check on a reasoning-gym mix
(``hub/ReasoningGym-v0``), unchanged: ``agentrl tasks profile`` of the tiny model (real Ray,
vLLM on CPU) on the first two training tasks, 4 samples each (the fewest the hard-vs-wrong
check classes a task on), with the run's ``env.kwargs`` and two attempts per task; then
``agentrl diagnose`` on the profile's stored episodes: its ``wrong_reference`` check runs (is
not skipped) and counts the same samples and successes per task as the profile.

The random tiny model writes no ``<answer>`` tags, so every task is never solved; what the
check reads from real replies is pinned by tests/unit/hubs/test_reasoning_gym_diagnose.py."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("reasoning_gym")

ENV_ID = "hub/ReasoningGym-v0"
KWARGS = {"families": {"basic_arithmetic": 1, "spell_backward": 1}, "size": 2, "attempts": 2}
SAMPLES = 4
NUM_TASKS = 2


def test_the_profile_and_the_hard_vs_wrong_check_work_on_reasoning_gym(ray_session, tmp_path, tiny_model_path):
    from typer.testing import CliRunner

    from agentrl.cli import app
    from agentrl.eval.difficulty import read_profile
    from agentrl.hubs.reasoning_gym import ReasoningGymEnv
    from agentrl.replay import ReplayStore
    from agentrl.replay.diagnose import diagnose

    out = tmp_path / "profile.json"
    url = f"sqlite:///{tmp_path / 'eval.db'}"
    overrides = [f"env.kwargs={json.dumps(KWARGS)}", "rollout.max_turns=2", "rollout.max_new_tokens=12",
                 "rollout.max_context_tokens=1024", "rollout.num_engines=1",
                 # random text soon holds an "e": turns end before max_new_tokens, so the env
                 # answers them with feedback and the second attempt follows
                 'rollout.stop_strings=["e"]']
    res = CliRunner().invoke(app, ["tasks", "profile", tiny_model_path, *overrides, "--env", ENV_ID,
                                   "--split", "train", "--samples", str(SAMPLES), "--num-tasks", str(NUM_TASKS),
                                   "--seed", "0", "--out", str(out), "--replay-url", url])
    assert res.exit_code == 0, res.output
    prof = read_profile(out)
    listed = ReasoningGymEnv.task_ids("train", env_kwargs=KWARGS)
    assert prof.env_id == ENV_ID and prof.samples == SAMPLES and prof.policy_version == 0
    assert [t.task_id for t in prof.tasks] == listed[:NUM_TASKS]
    assert all(t.n == SAMPLES and t.errored == 0 for t in prof.tasks), prof.tasks  # no hub fault

    run_id = res.stdout.split("episodes: run ", 1)[1].split()[0]
    with ReplayStore(url, read_only=True) as store:
        eps = [store.get_episode(r.episode_id) for r in store.list_episodes(run_id, limit=100)]
        d = diagnose(store, run_id)
    assert len(eps) == NUM_TASKS * SAMPLES and {e.env_id for e in eps} == {ENV_ID}
    assert any(len(e.turns) == 2 for e in eps)  # the feedback turn ran
    finding = d.finding("wrong_reference")
    assert finding.skipped is None, finding.summary  # 4 scored samples a task: the check runs
    verdicts = {t.task_id: t for t in d.tasks}
    for t in prof.tasks:
        v = verdicts[t.task_id]
        assert (v.env_id, v.samples, v.successes) == (ENV_ID, t.n, t.c), (v, t)
        assert v.verdict in ({"unsolved", "wrong_reference"} if t.c == 0 else {"hard", "ok", "easy"}), v
    assert sorted(finding.tasks) == sorted(t for t, v in verdicts.items() if v.verdict == "wrong_reference")
