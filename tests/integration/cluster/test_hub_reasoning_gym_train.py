"""One real training iteration on a reasoning-gym mix (``hub/ReasoningGym-v0``; real Ray, vLLM
with the tiny model, a real update and weight sync): three families, two attempts per task
with feedback (GiGPO's step groups on the attempt anchors). The driver lists the tasks with the
run's ``env.kwargs`` (families, size), the rollout actors make the env through the entry point,
and no episode ends as an infrastructure or reward error."""

from __future__ import annotations

import json

import pytest

pytestmark = pytest.mark.slow
pytest.importorskip("reasoning_gym")

ENV_ID = "hub/ReasoningGym-v0"
KWARGS = {"families": {"basic_arithmetic": 2, "spell_backward": 1, "gcd": 1}, "size": 8, "attempts": 2}


def _cfg(tmp_path, tiny_model_path, *extra):
    from agentrl.config import load_config

    kwargs = json.dumps(KWARGS)  # YAML flow style reads JSON
    return load_config(None, [
        f"run.dir={tmp_path}", "run.iterations=1", f"model.path={tiny_model_path}", f"env.id={ENV_ID}",
        f"env.kwargs={kwargs}", "env.tasks_per_iteration=2", "env.group_size=2", "rollout.max_turns=2",
        "rollout.max_new_tokens=12", "rollout.max_context_tokens=1024", "algorithm.advantage=gigpo",
        # a stop string that random text soon holds: the tiny random model's turns end before
        # max_new_tokens (which would end the episode), so the env answers them with feedback
        # and a second attempt follows
        'rollout.stop_strings=["e"]', "trainer.micro_batch_size=2", *extra])


def test_one_iteration_on_a_mix(ray_session, tmp_path, tiny_model_path):
    from agentrl.driver.controller import train
    from agentrl.hubs.reasoning_gym import ReasoningGymEnv
    from agentrl.replay import ReplayStore

    summary = train(_cfg(tmp_path, tiny_model_path))
    assert summary.policy_version == 1
    m = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert m["rollout/episodes"] == 4 and m["filter/infra_errors"] == 0 and m["filter/reward_errors"] == 0
    assert m["tokens/trained"] > 0
    listed = set(ReasoningGymEnv.task_ids("train", env_kwargs=KWARGS))
    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as store:
        eps = [store.get_episode(e.episode_id) for e in store.list_episodes(summary.run_id)]
    assert len(eps) == 4
    for ep in eps:
        assert ep.env_id == ENV_ID and ep.task_id in listed and 1 <= len(ep.turns) <= 2
        assert not ep.is_error and ep.total_reward is not None and 0.0 <= ep.total_reward <= 1.0
    two = [ep for ep in eps if len(ep.turns) == 2]
    assert two, [(len(ep.turns), ep.termination_reason) for ep in eps]  # the feedback turn ran in training
    for ep in two:
        assert [tuple(t.anchor) for t in ep.turns] == [(ep.task_id, 0), (ep.task_id, 1)]
        assert "1 attempt left" in ep.turns[0].observation_text and "No attempts left" in ep.turns[1].observation_text
        assert [t.reward for t in ep.turns] == [0.0, 0.0]  # no answer in random text: 0, never an error
