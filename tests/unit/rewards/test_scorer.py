"""The episode scorer (agentrl/rewards/scorer.py) over a scripted judge callable: the rule
decides where it may (no call paid), the cache is asked first and filled only with answers
that parsed, an unparseable answer is asked again bypassing the cache, and a judge that
fails or keeps answering garbage gives a record with no reward (a reward error), never 0."""

from __future__ import annotations

import json

import pytest

from agentrl.errors import ConfigError, JudgeError
from agentrl.rewards.rubric import Criterion, Rubric
from agentrl.rewards.scorer import EpisodeScorer
from agentrl.rewards.types import JudgeReply
from agentrl.types import Episode, JudgeItem

RUBRIC = Rubric("math", (Criterion("correct", "equivalent to the reference", weight=1.0),
                         Criterion("format", "ends with Answer:", weight=1.0, gate=True)))
EP = Episode(group_id="g", env_id="x/E-v0", task_id="t", seed=0)


def ok(correct: float, fmt: float = 1.0) -> str:
    return json.dumps({"scores": {"correct": correct, "format": fmt}, "reason": "because"})


class Script:
    """A judge call answering from ``answers`` in order (an exception is raised)."""

    def __init__(self, *answers):
        self.answers, self.requests = list(answers), []

    def __call__(self, req):
        self.requests.append(req)
        a = self.answers.pop(0)
        if isinstance(a, Exception):
            raise a
        return JudgeReply(text=a, model="judge-1", latency_s=0.5)


class Cache(dict):
    def get_(self, key):
        return self.get(key)

    def put_(self, key, model, digest, text):
        self.setdefault(key, text)


def _score(scorer, rule=0.0, answer="0.96"):
    return scorer.submit(EP, JudgeItem(task="96% of 1?", reference="0.96", answer=answer, rule_reward=rule)).result(10)


def test_a_judged_episode_gets_the_combined_reward_and_a_full_record():
    judge = Script(ok(0.8))
    rec = _score(EpisodeScorer(RUBRIC, judge, model="judge-1", combine_mode="weighted", rule_weight=0.25), rule=0.0)
    assert rec.judged and rec.score == 0.8 and rec.reward == pytest.approx(0.75 * 0.8)
    assert rec.scores == {"correct": 0.8, "format": 1.0} and rec.model == "judge-1" and rec.latency_s == 0.5
    assert rec.rubric == "math" and rec.rubric_digest == RUBRIC.digest() and rec.rule_reward == 0.0
    assert rec.prompt == [dict(m) for m in judge.requests[0].messages] and rec.output == ok(0.8)


def test_rule_first_trusts_a_passing_rule_and_pays_no_call():
    judge = Script()
    scorer = EpisodeScorer(RUBRIC, judge, model="judge-1")
    rec = _score(scorer, rule=1.0)
    assert not rec.judged and rec.reward == 1.0 and judge.requests == [] and scorer.stats["rule_decided"] == 1


def test_a_failed_gate_scores_zero():
    rec = _score(EpisodeScorer(RUBRIC, Script(ok(1.0, fmt=0.2)), model="judge-1", combine_mode="judge"))
    assert rec.reward == 0.0 and rec.gate_failed == "format"


def test_the_cache_is_asked_first_and_holds_only_answers_that_parsed():
    cache = Cache()
    judge = Script("not json", ok(1.0))
    scorer = EpisodeScorer(RUBRIC, judge, model="judge-1", cache_get=cache.get_, cache_put=cache.put_)
    first = _score(scorer)
    assert first.reward == 1.0 and len(judge.requests) == 2 and list(cache.values()) == [ok(1.0)]
    again = _score(scorer)  # the same prompt: from the cache, no call
    assert again.cached and again.reward == 1.0 and len(judge.requests) == 2
    assert scorer.stats == {"calls": 2, "cache_hits": 1, "parse_errors": 1, "failures": 0, "rule_decided": 0}


def test_a_garbage_cache_entry_is_a_miss_and_asked_fresh():
    cache = Cache()
    scorer = EpisodeScorer(RUBRIC, Script(ok(1.0)), model="judge-1", cache_get=cache.get_, cache_put=cache.put_)
    key = RUBRIC.request(JudgeItem(task="96% of 1?", reference="0.96", answer="0.96", rule_reward=0.0), "judge-1").cache_key
    cache[key] = "garbage"
    rec = _score(scorer)
    assert rec.reward == 1.0 and not rec.cached


def test_garbage_after_the_retries_or_a_failed_judge_is_no_reward_never_zero():
    rec = _score(EpisodeScorer(RUBRIC, Script("nope", '{"scores": {"correct": 2}}'), model="judge-1", parse_retries=1))
    assert rec.reward is None and "could not be parsed" in rec.error and "attempt 2" in rec.error
    assert rec.output == '{"scores": {"correct": 2}}'
    down = _score(EpisodeScorer(RUBRIC, Script(JudgeError("http://x/v1 did not answer after 4 attempts")),
                                model="judge-1"))
    assert down.reward is None and "did not answer" in down.error


def test_bad_settings_are_refused_by_name():
    with pytest.raises(ConfigError, match="combine_mode='best'"):
        EpisodeScorer(RUBRIC, Script(), model="m", combine_mode="best")
    with pytest.raises(ConfigError, match="rule_weight=2"):
        EpisodeScorer(RUBRIC, Script(), model="m", rule_weight=2)
    group = EpisodeScorer(Rubric("g", RUBRIC.criteria, mode="group"), Script(), model="m")
    with pytest.raises(ConfigError, match="hand over a group with submit_group"):
        group.submit(EP, JudgeItem(task="t", reference=None, answer="a"))
    with pytest.raises(ConfigError, match="use submit"):
        EpisodeScorer(RUBRIC, Script(), model="m").submit_group([EP], [JudgeItem(task="t", reference=None, answer="a")])


GROUP = Rubric("g", RUBRIC.criteria, mode="group")


def _group_answer(*correct):
    return json.dumps({"answers": [{"id": i, "scores": {"correct": c, "format": 1.0}, "reason": f"r{i}"}
                                   for i, c in reversed(list(enumerate(correct)))]})


def test_a_group_is_judged_in_one_call_and_each_member_combines_with_its_own_rule():
    judge = Script(_group_answer(0.9, 0.1, 0.5))
    scorer = EpisodeScorer(GROUP, judge, model="judge-1", combine_mode="rule_first")
    items = [JudgeItem(task="t", reference="r", answer=a, rule_reward=rule) for a, rule in
             (("x", 0.0), ("y", 0.0), ("z", 1.0))]
    recs = scorer.submit_group([EP] * 3, items).result(10)
    assert len(judge.requests) == 1 and "<answer id=\"2\">" in judge.requests[0].messages[-1]["content"]
    assert [r.group_position for r in recs] == [0, 1, 2] and all(r.mode == "group" for r in recs)
    assert [r.reward for r in recs] == [0.9, 0.1, 1.0]  # the third: its rule passed, the rule decides
    assert [r.judged for r in recs] == [True, True, False] and recs[0].reasons == {"": "r0"}


def test_a_group_the_rule_decides_pays_no_call_and_a_broken_group_answer_fails_every_member():
    judge = Script()
    items = [JudgeItem(task="t", reference="r", answer="a", rule_reward=1.0)] * 2
    recs = EpisodeScorer(GROUP, judge, model="m").submit_group([EP] * 2, items).result(10)
    assert judge.requests == [] and [r.reward for r in recs] == [1.0, 1.0]
    bad = Script('{"answers": [{"id": 0, "scores": {"correct": 1, "format": 1}, "reason": ""}]}', "still not")
    items = [JudgeItem(task="t", reference="r", answer=a, rule_reward=0.0) for a in "ab"]
    recs = EpisodeScorer(GROUP, bad, model="m").submit_group([EP] * 2, items).result(10)
    assert [r.reward for r in recs] == [None, None] and all("could not be parsed" in r.error for r in recs)


def test_a_failed_group_call_leaves_rule_decided_members_their_rule_and_counts_one_call():
    judge = Script(JudgeError("down"))
    items = [JudgeItem(task="t", reference="r", answer=a, rule_reward=rule) for a, rule in (("x", 0.0), ("y", 1.0),
                                                                                            ("z", 0.0))]
    recs = EpisodeScorer(GROUP, judge, model="m").submit_group([EP] * 3, items).result(10)
    assert [r.reward for r in recs] == [None, 1.0, None] and recs[1].error is None
    assert sum(r.calls for r in recs) == 1 == len(judge.requests)


def test_a_template_that_cannot_render_is_a_record_with_no_reward():
    typo = Rubric("typo", RUBRIC.criteria, template="{{ refrence }}")
    rec = _score(EpisodeScorer(typo, Script(), model="m"))
    assert rec.reward is None and "refrence" in rec.error
