"""Faults a review of the judge rewards found, each pinned: the cache key holds every judge
setting that changes an answer; the judge's wait is summed over refill rounds; an eval's
identity holds the success threshold; one success rule for judged and rule-decided episodes;
an eval judge pool is placed; an eval group rubric is sized by eval.samples."""

from __future__ import annotations

import json
from concurrent.futures import Future
from types import SimpleNamespace

import pytest

from agentrl.cluster.actors.judge_service import check_rubric, judge_settings
from agentrl.cluster.actors.placement import judge_pool_engines
from agentrl.commands.evaluate import EvalTarget, eval_identity, eval_run_id
from agentrl.config import load_config
from agentrl.driver.iteration import judge_phase, judge_tail_s
from agentrl.errors import ConfigError
from agentrl.eval.passk import episode_success
from agentrl.rewards.rubric import Rubric
from agentrl.rewards.scorer import EpisodeScorer
from agentrl.rewards.types import JudgeReply
from agentrl.rollout import judging
from agentrl.types import Episode, JudgeItem, JudgeRecord, TerminationReason

RUBRIC = Rubric.from_dict({"name": "r", "criteria": [{"name": "ok", "description": "correct"}]})
ITEM = JudgeItem(task="t", reference="42", answer="42", transcript="x", tool_outputs=(), rule_reward=0.0)
JUDGE = "{kind: endpoint, model: judge, base_url: 'http://127.0.0.1:%d/v1', temperature: %s, max_tokens: %d}"


def _scorer(score: float, calls: list, cache: dict, settings: dict) -> EpisodeScorer:
    def complete(req):
        calls.append(req)
        return JudgeReply(json.dumps({"scores": {"ok": score}, "reason": ""}), "judge", 0.1)
    return EpisodeScorer(RUBRIC, complete, model="judge", combine_mode="judge", cache_get=cache.get,
                         cache_put=lambda k, m, d, o: cache.setdefault(k, o), judge_settings=settings)


def test_two_judges_of_one_model_name_on_two_servers_never_share_a_cached_answer():
    cfg = load_config(None, ["reward.judge=" + JUDGE % (8000, 0.0, 1024), "eval.judge=" + JUDGE % (9000, 1.0, 64)])
    train_s, eval_s = judge_settings(cfg.reward.judge), judge_settings(cfg.eval.judge)
    assert train_s == {"where": "http://127.0.0.1:8000/v1", "temperature": 0.0, "max_tokens": 1024, "structured": True}
    cache, calls_a, calls_b = {}, [], []
    ep = Episode(group_id="g", env_id="e", task_id="t", seed=0, episode_id="e0")
    a = _scorer(1.0, calls_a, cache, train_s).submit(ep, ITEM).result()
    b = _scorer(0.0, calls_b, cache, eval_s).submit(ep, ITEM).result()
    assert (a.reward, b.reward, len(calls_b), b.cached) == (1.0, 0.0, 1, False)
    c = _scorer(0.0, [], cache, eval_s).submit(ep, ITEM).result()  # the same judge again: the cache answers
    assert c.cached and c.reward == 0.0
    assert RUBRIC.request(ITEM, "judge").cache_key != RUBRIC.request(ITEM, "judge", train_s).cache_key


def _ep(i, sub, settle):
    rec = JudgeRecord(model="m", rubric="r", rubric_digest="d", submitted_at_s=sub, settled_at_s=settle)
    return Episode(group_id="g", env_id="e", task_id="a", seed=0, episode_id=f"e{i}", judgement=rec)


def test_the_judge_tail_is_summed_over_refill_rounds_and_clipped_to_each_round():
    # round 1 (from 0): last env end 10, last settle 20: 10 s; the refill (from 25): 40 -> 41: 1 s
    first, refill = [_ep(0, 0.0, 5.0), _ep(1, 10.0, 20.0)], [_ep(2, 30.0, 31.0), _ep(3, 40.0, 41.0)]
    tail = judge_tail_s(first, 0.0) + judge_tail_s(refill, 25.0)
    assert tail == 11.0
    m = judge_phase(first + refill, 0.0, tail)
    assert (m["time/judge_tail_s"], m["time/judge_s"], m["timeline/judge_start_s"], m["timeline/judge_end_s"]) == \
        (11.0, 41.0, 0.0, 41.0)
    # an async batch judged before the round began kept no one waiting
    assert judge_tail_s([_ep(4, 1.0, 3.0)], 50.0) == 0.0
    assert judge_tail_s([_ep(5, 49.0, 53.0)], 50.0) == 3.0
    assert judge_tail_s([Episode(group_id="g", env_id="e", task_id="a", seed=0)], 0.0) == 0.0


def test_the_success_threshold_enters_the_eval_identity():
    t = EvalTarget("model", "m", "m", 0, "/abs/m")
    j = "eval.judge=" + JUDGE % (9000, 0.0, 1024)
    lo, hi = (load_config(None, [j, f"reward.success_threshold={v}"]) for v in (0.5, 0.9))
    assert eval_identity(t, lo) != eval_identity(t, hi) and eval_run_id(t, lo) != eval_run_id(t, hi)


def test_one_success_rule_for_judged_and_rule_decided_episodes():
    out = []
    for judged, reward in ((False, 0.8), (True, 0.5), (True, 0.4)):  # rule_first with rule_pass 0.8, threshold 0.5
        ep = Episode(group_id="g", env_id="e", task_id="t", seed=0, episode_id=f"e{judged}{reward}")
        f = Future()
        f.set_result(JudgeRecord(model="m", rubric="r", rubric_digest="d", judged=judged, reward=reward))
        judging.apply_judgement(SimpleNamespace(episode=ep), f, lambda *a: None)
        ep.termination_reason = TerminationReason.ENV_TERMINATED
        out.append(episode_success(ep))
    assert out == [True, True, False]


def test_an_eval_judge_pool_is_placed_with_the_reward_judge_pool():
    pool = "{kind: pool, model: Qwen/Qwen2.5-0.5B-Instruct, num_engines: %d}"
    assert judge_pool_engines(load_config(None, ["eval.judge=" + pool % 2])) == 2
    assert judge_pool_engines(load_config(None, ["eval.judge=" + pool % 2, "reward.judge=" + pool % 1])) == 3
    assert judge_pool_engines(load_config(None, [])) == 0


def test_an_eval_group_rubric_is_sized_by_eval_samples():
    g = Rubric.from_dict({"name": "g", "mode": "group", "criteria": [{"name": "ok", "description": "correct"}]})
    cfg = load_config(None, ["eval.judge={kind: pool, model: Qwen/Qwen2.5-0.5B-Instruct, max_tokens: 200}",
                             "env.group_size=2", "eval.samples=32"])
    with pytest.raises(ConfigError, match=r"eval\.samples=32"):
        check_rubric(cfg, g, "eval")
    check_rubric(cfg, g, "reward") if cfg.reward.judge is not None else None
    small = load_config(None, ["eval.judge={kind: pool, model: Qwen/Qwen2.5-0.5B-Instruct, max_tokens: 200}",
                               "eval.samples=2"])
    check_rubric(small, g, "eval")
