"""Judge rewards in a real training run (real Ray, vLLM with the tiny model, a real HTTP
OpenAI-compatible judge server with scripted judgements: tests/helpers/scripted_judge.py):
one iteration on MathAnswer-v0 where the rule misses what the judge accepts. The tiny model's
answers fail the rule, so under ``rule_first`` each episode goes to the judge, whose score
is its reward; every judgement (prompt, raw answer, scores, latency) is in the replay store
and the judge cache holds each answer. A judge that is down stops the run at start-up,
before any engine starts."""

from __future__ import annotations

import json

import pytest

from tests.helpers.scripted_judge import ScriptedJudge, digit_judgement

pytestmark = pytest.mark.slow


def _cfg(tmp_path, tiny_model_path, base_url, *extra):
    from agentrl.config import load_config

    return load_config(None, [
        f"run.dir={tmp_path}", "run.iterations=1", f"model.path={tiny_model_path}", "env.id=agentrl/MathAnswer-v0",
        "env.tasks_per_iteration=2", "env.group_size=2", "rollout.max_turns=1", "rollout.max_new_tokens=12",
        "rollout.max_context_tokens=1024", "trainer.micro_batch_size=2", "reward.judge.model=scripted-judge",
        f"reward.judge.base_url={base_url}", "reward.judge.timeout_s=30", "reward.combine=rule_first", *extra])


def test_one_iteration_rewarded_by_a_judge_records_every_judgement(ray_session, tmp_path, tiny_model_path):
    from agentrl.driver.controller import train
    from agentrl.replay import ReplayStore

    judge = ScriptedJudge(digit_judgement)
    cfg = _cfg(tmp_path, tiny_model_path, judge.base_url)
    try:
        summary = train(cfg)
    finally:
        judge.shutdown()
    assert summary.policy_version == 1
    m = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert m["rollout/episodes"] == 4 and m["filter/reward_errors"] == 0 and m["tokens/trained"] > 0
    assert m["judge/episodes"] == 4 and m["judge/errors"] == 0 and m["judge/parse_errors"] == 0
    assert m["judge/judged"] + m["judge/rule_decided"] == 4
    assert m["judge/calls"] + m["judge/cache_hits"] == m["judge/judged"]
    # the health check, then one call per judged episode not served by the cache
    assert len(judge.requests) == 1 + m["judge/calls"]
    assert all(r["response_format"]["type"] == "json_schema" for r in judge.requests[1:])
    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as store:
        eps = [store.get_episode(e.episode_id) for e in store.list_episodes(summary.run_id)]
        keys = [e.judgement for e in eps if e.judgement is not None and e.judgement.judged]
        for ep in eps:
            j = ep.judgement
            assert j is not None and j.rubric == "math-answer-equivalence" and j.model == "scripted-judge"
            assert ep.total_reward == j.reward  # the reward the judge gave is the episode's
            if j.judged:
                assert j.output.startswith('{"scores"') and j.scores["equivalent"] in (0.0, 1.0)
                assert j.reward == j.score and j.rule_reward == 0.0
                assert "Reference answer" in j.prompt[-1]["content"]
        # every answer the judge gave is in the cache, under its request's key
        keys = {_key(j, cfg.reward.judge): j.output for j in keys}
        assert store.judge_cache_get(list(keys)) == keys


def _key(record, judge):
    """The cache key of ``record``'s question: the model, the rubric, the prompt and the judge's
    settings (its server, temperature, max_tokens, structured output)."""
    from agentrl.rewards.rubric import Rubric, _hash
    from environments.math_answer import JUDGE_RUBRIC

    return _hash({"model": "scripted-judge", "rubric": Rubric.from_dict(JUDGE_RUBRIC).digest(),
                  "messages": record.prompt, "judge": {"where": judge.base_url.rstrip("/"), "temperature": 0.0,
                                                       "max_tokens": judge.max_tokens, "structured": True}})


def test_a_judge_that_is_down_stops_the_run_at_start_up(ray_session, tmp_path, tiny_model_path):
    from agentrl.driver.controller import train
    from agentrl.errors import JudgeError

    judge = ScriptedJudge()
    url = judge.base_url
    judge.shutdown()
    with pytest.raises(JudgeError, match="start-up check") as err:
        train(_cfg(tmp_path, tiny_model_path, url))
    assert "127.0.0.1" in str(err.value)


def test_one_iteration_rewarded_by_a_local_judge_pool(ray_session, tmp_path, tiny_model_path):
    """kind: pool: one vLLM engine of the tiny random model judges; under guided decoding its
    every answer parses, so no episode is a reward error."""
    from agentrl.config import load_config
    from agentrl.driver.controller import train
    from agentrl.replay import ReplayStore

    cfg = load_config(None, [
        f"run.dir={tmp_path}", "run.iterations=1", f"model.path={tiny_model_path}", "env.id=agentrl/MathAnswer-v0",
        "env.tasks_per_iteration=1", "env.group_size=2", "rollout.max_turns=1", "rollout.max_new_tokens=8",
        "rollout.max_context_tokens=1024", "trainer.micro_batch_size=2", "reward.judge.kind=pool",
        f"reward.judge.model={tiny_model_path}", "reward.judge.max_tokens=64", "reward.judge.kv_cache_gb=0.25",
        "reward.combine=judge"])
    summary = train(cfg)
    assert summary.policy_version == 1
    m = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert m["judge/judged"] == 2 and m["judge/errors"] == 0 and m["judge/parse_errors"] == 0
    assert m["filter/reward_errors"] == 0 and m["tokens/trained"] > 0
    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as store:
        for e in store.list_episodes(summary.run_id):
            j = store.get_episode(e.episode_id).judgement
            assert j is not None and j.judged and 0.0 <= j.score <= 1.0 and set(j.scores) == {"equivalent"}


def _group_judgement(messages):
    """Group mode: answer id i scores 1.0 when that answer holds a digit."""
    text = messages[-1]["content"]
    if "<answer" not in text:  # the start-up health check
        return '{"ok": true}'
    answers = []
    for block in text.split('<answer id="')[1:]:
        i, rest = block.split('">', 1)
        graded = rest.split("</answer>", 1)[0]
        answers.append({"id": int(i), "scores": {"equivalent": 1.0 if any(c.isdigit() for c in graded) else 0.0},
                        "reason": f"scripted {i}"})
    return json.dumps({"answers": answers})


def test_one_iteration_with_a_group_rubric_judges_each_group_in_one_call(ray_session, tmp_path, tiny_model_path):
    from agentrl.driver.controller import train
    from agentrl.replay import ReplayStore

    judge = ScriptedJudge(_group_judgement)
    try:
        summary = train(_cfg(tmp_path, tiny_model_path, judge.base_url, "reward.combine=judge",
                             "reward.rubric={name: g, mode: group, criteria: [{name: equivalent, description: same "
                             "value as the reference}]}"))
    finally:
        judge.shutdown()
    m = json.loads((tmp_path / "metrics.jsonl").read_text().splitlines()[0])
    assert m["judge/episodes"] == 4 and m["judge/errors"] == 0 and m["filter/reward_errors"] == 0
    assert m["judge/calls"] + m["judge/cache_hits"] == 2  # 2 groups of 2: one call (or cache hit) per group
    assert len(judge.requests) == 1 + m["judge/calls"]
    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as store:
        eps = [store.get_episode(e.episode_id) for e in store.list_episodes(summary.run_id)]
    for group in {e.group_id for e in eps}:
        members = [e for e in eps if e.group_id == group]
        assert sorted(e.judgement.group_position for e in members) == [0, 1]
        assert all(e.judgement.mode == "group" and e.total_reward == e.judgement.score for e in members)


def test_two_async_iterations_rewarded_by_a_judge(ray_session, tmp_path, tiny_model_path):
    """controller.mode async: the engines' rollout streams judge each episode as it ends, so
    every trained episode reaches the trainer with its judgement and the judge's reward;
    nothing is a reward error, and every judged answer is in the cache."""
    from agentrl.driver.controller import train
    from agentrl.replay import ReplayStore

    judge = ScriptedJudge(digit_judgement)
    try:
        summary = train(_cfg(tmp_path, tiny_model_path, judge.base_url, "run.iterations=2", "controller.mode=async",
                             "controller.max_staleness=1", "eval.after_training=false",
                             "eval.before_training=false"))
    finally:
        judge.shutdown()
    assert summary.policy_version == 2
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(lines) == 2
    for m in lines:
        assert m["judge/episodes"] == m["rollout/episodes"] >= 4 and m["judge/errors"] == 0
        assert m["filter/reward_errors"] == 0 and m["tokens/trained"] > 0
        assert m["judge/calls"] + m["judge/cache_hits"] == m["judge/judged"]
    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as store:
        eps = [store.get_episode(e.episode_id) for e in store.list_episodes(summary.run_id, limit=1000)]
    assert eps and all(e.judgement is not None and e.total_reward == e.judgement.reward for e in eps)
    digits = [e for e in eps if e.judgement.judged]
    assert all(e.judgement.score == (1.0 if any(c.isdigit() for c in e.judgement.prompt[-1]["content"].split(
        "<answer>", 1)[1].split("</answer>", 1)[0]) else 0.0) for e in digits)
