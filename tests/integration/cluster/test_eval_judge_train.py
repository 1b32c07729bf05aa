"""An eval LLM judge of its own in a real training run (real Ray, vLLM with the tiny model, two
real HTTP OpenAI-compatible judge servers with scripted judgements:
tests/helpers/scripted_judge.py): one sync iteration on MathAnswer-v0 rewarded by one judge
(``reward.judge``), then the final policy's eval (``eval.after_training``) on the rollout
engines, scored by the other (``eval.judge``, its own service and health check). The training
episodes carry the reward judge's judgements, the eval episodes the eval judge's."""

from __future__ import annotations

import json

import pytest

from tests.helpers.scripted_judge import ScriptedJudge, digit_judgement

pytestmark = pytest.mark.slow


def test_eval_episodes_are_judged_by_the_eval_judge_and_training_ones_by_the_reward_judge(
        ray_session, tmp_path, tiny_model_path):
    from agentrl.config import load_config
    from agentrl.driver.controller import train
    from agentrl.replay import ReplayStore

    reward_judge = ScriptedJudge(digit_judgement, model="reward-judge")
    eval_judge = ScriptedJudge(digit_judgement, model="eval-judge")
    try:
        cfg = load_config(None, [
            f"run.dir={tmp_path}", "run.iterations=1", f"model.path={tiny_model_path}", "env.id=agentrl/MathAnswer-v0",
            "env.tasks_per_iteration=2", "env.group_size=2", "rollout.max_turns=1", "rollout.max_new_tokens=12",
            "rollout.max_context_tokens=1024", "trainer.micro_batch_size=2", "controller.mode=sync",
            "reward.judge.model=reward-judge", f"reward.judge.base_url={reward_judge.base_url}",
            "reward.judge.timeout_s=30", "reward.combine=rule_first",
            "eval.after_training=true", "eval.before_training=false", "eval.every=0", "eval.num_tasks=2",
            "eval.samples=2", "eval.max_turns=1", "eval.max_new_tokens=12", "eval.max_context_tokens=1024",
            "eval.judge.model=eval-judge", f"eval.judge.base_url={eval_judge.base_url}", "eval.judge.timeout_s=30"])
        summary = train(cfg)
    finally:
        reward_judge.shutdown()
        eval_judge.shutdown()
    assert summary.policy_version == 1
    (m,) = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert m["eval/policy_version"] == 1 and m["eval/samples_errored"] == 0 and m["eval/samples_scored"] == 4
    assert m["judge/episodes"] == 4 and m["judge/errors"] == 0
    # each judge: its own health check, then its own calls (what the cache served is not asked again)
    assert len(eval_judge.requests) > 1 and len(reward_judge.requests) == 1 + m["judge/calls"]
    assert {r["model"] for r in eval_judge.requests} == {"eval-judge"}
    assert {r["model"] for r in reward_judge.requests} == {"reward-judge"}
    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as store:
        trained = [store.get_episode(e.episode_id) for e in store.list_episodes(summary.run_id, kind="train")]
        evals = [store.get_episode(e.episode_id) for e in store.list_episodes(summary.run_id, kind="eval")]
    assert len(trained) == 4 and len(evals) == 4
    assert all(e.judgement is not None and e.judgement.model == "reward-judge" for e in trained)
    assert all(e.judgement is not None and e.judgement.model == "eval-judge" for e in evals)
    for e in evals:  # under rule_first the tiny model's answers fail the rule: the eval judge's score is the reward
        j = e.judgement
        assert j.rubric == "math-answer-equivalence" and e.total_reward == j.reward
        if j.judged:
            assert j.output.startswith('{"scores"') and j.reward == j.score
    judged = [e for e in evals if e.judgement.judged and not e.judgement.cached]
    assert len(eval_judge.requests) == 1 + sum(e.judgement.calls for e in judged)
