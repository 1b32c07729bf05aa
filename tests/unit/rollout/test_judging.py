"""Judge rewards in the rollout session (agentrl/rollout/judging.py): each episode that ends
without an error goes to the judge with what it reads (task, reference, final answer,
transcript, rule reward), is held until its judgement comes back, and its reward is
settled then; a judge that gives no reward or raises makes a reward error, never a 0;
errored episodes are not judged. Scripted engine and env (tests/unit/rollout/test_session.py)."""

from __future__ import annotations

import math
import threading
from concurrent.futures import Future, ThreadPoolExecutor

import gymnasium as gym

from agentrl.rollout.chat import ChatTokenizer
from agentrl.rollout.loop import RolloutLimits, RolloutWorker
from agentrl.types import EpisodeRequest, JudgeRecord, SamplingRecord, StepInfo, TerminationReason
from tests.helpers.char_tokenizer import STOP, CharTokenizer
from tests.unit.rollout.test_session import ScriptedEngine


class AnswerEnv(gym.Env):
    """Two steps: reward 0.25 then 0.5 (rule total 0.75); gives a reference and an answer."""

    def reset(self, *, seed=None, options=None):
        self.t = 0
        return f"what is {options['task_id']}?", StepInfo(reference_answer="42").to_info()

    def step(self, action):
        self.t += 1
        done = self.t >= 2
        info = StepInfo(final_answer="forty-two").to_info() if done else {}
        return "obs", 0.25 * self.t, done, False, info


class FakeJudge:
    """Answers each submit after ``release`` is set, with ``reward(item)``."""

    def __init__(self, reward):
        self.reward, self.items = reward, []
        self.release = threading.Event()
        self.pool = ThreadPoolExecutor(2)

    def submit(self, episode, item) -> Future:
        self.items.append(item)

        def judge():
            self.release.wait(10)
            r = self.reward(item)
            if isinstance(r, Exception):
                raise r
            return JudgeRecord(model="m", rubric="r", rubric_digest="d", score=r, reward=r,
                               rule_reward=item.rule_reward, error=None if r is not None else "unparseable")

        return self.pool.submit(judge)


def _worker(judge, env_cls=AnswerEnv):
    return RolloutWorker(ScriptedEngine(3), ChatTokenizer(CharTokenizer(), (STOP,)), lambda req: (env_cls(), None),
                         RolloutLimits(max_turns=4, max_new_tokens=8, max_context_tokens=4096), SamplingRecord(),
                         env_workers=2, judge=judge)


def _reqs(n):
    return [EpisodeRequest("x/E-v0", f"t{i}", 0, f"g{i}", sample_seed=i) for i in range(n)]


def test_each_episode_is_judged_with_what_it_holds_and_its_reward_settled():
    judge = FakeJudge(lambda item: 1.0)
    judge.release.set()
    eps = _worker(judge).run(_reqs(2), policy_version=0)
    assert [e.total_reward for e in eps] == [1.0, 1.0]
    assert [[t.reward for t in e.turns] for e in eps] == [[0.25, 0.75], [0.25, 0.75]]  # the last turn settles it
    assert all(e.judgement is not None and e.judgement.rule_reward == 0.75 for e in eps)
    item = judge.items[0]
    assert (item.task, item.reference, item.answer, item.rule_reward) == ("what is t0?", "42", "forty-two", 0.75)
    assert "[turn 0 action]" in item.transcript and "[turn 1 observation]\nobs" in item.transcript


def test_an_episode_waits_for_its_judgement_before_it_is_handed_back():
    from agentrl.rollout.session import RolloutSession

    judge = FakeJudge(lambda item: 0.0)
    session = RolloutSession(_worker(judge), 0)
    try:
        session.submit(_reqs(1))
        out = []
        for _ in range(200):
            out += session.step_once(wait_s=0.05)
            if judge.items:
                break
        assert judge.items and out == [] and session.in_flight() == 1 and not session.idle()
        judge.release.set()
        for _ in range(200):
            out += session.step_once(wait_s=0.05)
            if out:
                break
        assert [e.total_reward for e in out] == [0.0] and session.in_flight() == 0
    finally:
        session.shutdown()


def test_no_reward_or_a_raising_judge_is_a_reward_error_never_a_zero():
    judge = FakeJudge(lambda item: None if item.task.endswith("t0?") else RuntimeError("judge pool gone"))
    judge.release.set()
    eps = _worker(judge).run(_reqs(2), policy_version=0)
    assert [e.termination_reason for e in eps] == [TerminationReason.REWARD_ERROR] * 2
    assert all(e.total_reward is None for e in eps)
    assert "unparseable" in eps[0].error["message"] and "judge pool gone" in eps[1].error["message"]
    assert eps[0].judgement is not None  # the audit record of the failed judgement is kept


class BrokenEnv(AnswerEnv):
    def step(self, action):
        raise RuntimeError("env bug")


def test_an_errored_episode_is_not_judged():
    judge = FakeJudge(lambda item: 1.0)
    judge.release.set()
    [ep] = _worker(judge, BrokenEnv).run(_reqs(1), policy_version=0)
    assert ep.termination_reason == TerminationReason.INFRA_ERROR and judge.items == []


def test_the_batch_metrics_count_calls_cache_hits_errors_and_latency():
    from agentrl.rollout.loop import rollout_metrics

    answers = iter([1.0, None])
    judge = FakeJudge(lambda item: next(answers))
    judge.release.set()
    eps = _worker(judge).run(_reqs(2), policy_version=0)
    eps[0].judgement.calls, eps[0].judgement.latency_s = 2, 0.5
    eps[1].judgement.calls, eps[1].judgement.cached = 0, True
    m = rollout_metrics(eps)
    assert m["judge/episodes"] == 2 and m["judge/calls"] == 2 and m["judge/cache_hits"] == 1
    assert m["judge/errors"] == 1 and m["judge/latency_p50_s"] == 0.5 and m["judge/score_mean"] == 1.0
    assert "judge/episodes" not in rollout_metrics(_worker(None).run(_reqs(1), policy_version=0))


class GroupJudge(FakeJudge):
    """A group-mode judge: one call per group, reward = position / 10."""

    group_mode = True

    def __init__(self):
        super().__init__(lambda item: 0.0)
        self.groups = []

    def submit(self, episode, item):
        raise AssertionError("a group-mode judge gets whole groups")

    def submit_group(self, episodes, items):
        self.groups.append([e.episode_id for e in episodes])

        def judge():
            return [JudgeRecord(model="m", rubric="r", rubric_digest="d", mode="group", group_position=i,
                                score=i / 10, reward=i / 10) for i in range(len(items))]

        return self.pool.submit(judge)


def _group_reqs(groups, size):
    return [EpisodeRequest("x/E-v0", f"t{g}", 0, f"g{g}", index=k, sample_seed=10 * g + k)
            for g in range(groups) for k in range(size)]


def test_a_group_judge_gets_each_group_once_all_its_members_have_finished():
    judge = GroupJudge()
    eps = _worker(judge).run(_group_reqs(2, 3), policy_version=0)
    assert sorted(len(g) for g in judge.groups) == [3, 3]
    assert all(len({eid.split("/")[1] for eid in g}) == 1 for g in judge.groups)  # one group per call
    assert sorted(e.total_reward for e in eps) == [0.0, 0.0, 0.1, 0.1, 0.2, 0.2]
    assert all(e.judgement.mode == "group" for e in eps)


class FailsForT1(AnswerEnv):
    def step(self, action):
        if self._id == "t1" and self._k == 1:
            raise RuntimeError("env bug")
        return super().step(action)

    def reset(self, *, seed=None, options=None):
        self._id = options["task_id"]
        FailsForT1.count[self._id] = FailsForT1.count.get(self._id, 0) + 1
        self._k = FailsForT1.count[self._id]
        return super().reset(seed=seed, options=options)


def test_an_errored_member_is_handed_back_at_once_and_the_rest_of_its_group_is_judged():
    FailsForT1.count = {}
    judge = GroupJudge()
    eps = _worker(judge, FailsForT1).run(_group_reqs(2, 2), policy_version=0)
    errored = [e for e in eps if e.is_error]
    assert len(errored) == 1 and errored[0].judgement is None
    assert sorted(len(g) for g in judge.groups) == [1, 2]


def test_a_cut_answer_scored_0_by_score_truncated_false_is_not_judged():
    judge = FakeJudge(lambda item: 1.0)
    judge.release.set()
    worker = RolloutWorker(ScriptedEngine(50), ChatTokenizer(CharTokenizer(), (STOP,)), lambda req: (AnswerEnv(), None),
                           RolloutLimits(max_turns=4, max_new_tokens=4, max_context_tokens=4096, score_truncated=False),
                           SamplingRecord(), env_workers=2, judge=judge)
    [ep] = worker.run(_reqs(1), policy_version=0)
    assert ep.termination_reason == TerminationReason.LENGTH and ep.total_reward == 0.0
    assert judge.items == [] and ep.judgement is None


def test_a_group_goes_to_the_judge_in_request_order_whatever_order_it_finished_in():
    judge = GroupJudge()
    reqs = _group_reqs(1, 3)[::-1]  # submitted (and so finishing) in reverse
    _worker(judge).run(reqs, policy_version=0)
    assert [int(eid.split("/")[2]) for eid in judge.groups[0]] == [0, 1, 2]


def test_the_stream_of_async_mode_hands_back_judged_episodes_across_a_weight_load():
    from agentrl.rollout.session import WeightLoad
    from agentrl.rollout.stream import StreamRunner

    judge = FakeJudge(lambda item: 0.5)
    engine = ScriptedEngine(6)
    engine.step_sleep_s = 0.005
    worker = RolloutWorker(engine, ChatTokenizer(CharTokenizer(), (STOP,)), lambda req: (AnswerEnv(), None),
                           RolloutLimits(max_turns=4, max_new_tokens=8, max_context_tokens=4096), SamplingRecord(),
                           env_workers=2, judge=judge)
    stream = StreamRunner(worker, policy_version=0)
    stream.start()
    try:
        stream.submit(_reqs(2))
        got = []
        while len(engine.live) < 2:
            got += stream.collect(0.005)
        stream.load(WeightLoad(apply=lambda: engine.update_weights(1), policy_version=1))  # continue mode
        for _ in range(400):
            got += stream.collect(0.02)
            if judge.items:
                break
        assert got == [] and stream.in_flight() == 2  # generated, held for their judgements
        judge.release.set()
        while len(got) < 2:
            got += stream.collect(5.0)
        assert [e.total_reward for e in got] == [0.5, 0.5] and stream.in_flight() == 0
        assert all(e.policy_version_range() == (0, 1) and e.judgement is not None for e in got)
    finally:
        stream.stop()


class SaysFailedEnv(AnswerEnv):
    """AnswerEnv whose last step reports ``success=False`` (the rule's own verdict)."""

    def step(self, action):
        obs, r, done, trunc, info = super().step(action)
        return obs, r, done, trunc, ({**info, "success": False} if done else info)


class ThresholdJudge(FakeJudge):
    """Judges t0 at 0.75 and t1 at 0.25; t2 is decided by the rule alone (``judged=False``)."""

    def __init__(self, threshold=None):
        super().__init__(lambda item: {"t0": 0.75, "t1": 0.25, "t2": 1.0}[item.task[8:10]])
        if threshold is not None:
            self.success_threshold = threshold
        self.release.set()

    def submit(self, episode, item):
        fut = super().submit(episode, item)
        if item.task[8:10] != "t2":
            return fut
        out = Future()
        out.set_result(JudgeRecord(model="m", rubric="r", rubric_digest="d", judged=False, reward=1.0))
        return out


def test_every_episode_with_a_judgement_succeeds_by_its_reward_and_the_threshold():
    eps = {e.task_id: e for e in _worker(ThresholdJudge(), SaysFailedEnv).run(_reqs(3), policy_version=0)}
    assert [eps[t].total_reward for t in ("t0", "t1", "t2")] == [0.75, 0.25, 1.0]
    assert (eps["t0"].success, eps["t1"].success) == (True, False)  # reward >= 0.5 (the default threshold)
    # the rule decided alone (the env itself says failed): one rule for the run, reward 1.0 >= 0.5
    assert eps["t2"].success is True and not eps["t2"].judgement.judged
    strict = {e.task_id: e for e in _worker(ThresholdJudge(0.8), SaysFailedEnv).run(_reqs(2), policy_version=0)}
    assert (strict["t0"].success, strict["t1"].success) == (False, False)  # 0.75 < 0.8


def test_each_judgement_is_stamped_when_it_went_to_the_judge_and_when_it_settled():
    import time

    judge = FakeJudge(lambda item: 1.0)
    judge.release.set()
    before = time.time()
    eps = _worker(judge).run(_reqs(2), policy_version=0)
    after = time.time()
    for e in eps:
        j = e.judgement
        assert before <= j.submitted_at_s <= j.settled_at_s <= after
    group = _worker(GroupJudge()).run(_group_reqs(1, 2), policy_version=0)
    assert len({(e.judgement.submitted_at_s, e.judgement.settled_at_s) for e in group}) == 1  # one call, one wait


def test_the_wait_percentiles_run_from_submit_to_settle_per_episode():
    from agentrl.rollout.judging import judge_metrics
    from agentrl.types import Episode

    def ep(i, submitted, settled):
        rec = JudgeRecord(model="m", rubric="r", rubric_digest="d", score=1.0, reward=1.0,
                          submitted_at_s=submitted, settled_at_s=settled)
        return Episode(group_id=f"g{i}", env_id="x/E-v0", task_id=f"t{i}", seed=0, judgement=rec)

    # waits 0.5, 1.0, 2.0, 3.5 (one episode without stamps is left out of the wait)
    eps = [ep(0, 100.0, 100.5), ep(1, 100.5, 101.5), ep(2, 101.0, 103.0), ep(3, 100.0, 103.5), ep(4, None, None)]
    m = judge_metrics(eps)
    assert m["judge/wait_p50_s"] == 2.0 and m["judge/wait_p99_s"] == 3.5  # nearest rank: index round(0.5 * 3) = 2
    assert m["judge/episodes"] == 5.0 and math.isnan(m["judge/latency_p50_s"])  # no calls recorded
    assert math.isnan(judge_metrics([ep(5, None, None)])["judge/wait_p50_s"])
