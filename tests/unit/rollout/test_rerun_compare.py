"""``agentrl.rollout.rerun.rerun_episode``'s rules on a small in-process environment (real
``gymnasium.Env`` subclasses, no sandbox): what is compared on each turn, the rollout loop's
own rules replayed (a cut completion not handed to the env, an unparseable cut answer scored
0), and errors that are never divergences. The sandboxed cases are in
tests/integration/replay/test_rerun.py."""

from __future__ import annotations

import gymnasium
import pytest

from agentrl.errors import ContractError, RewardError, SandboxError
from agentrl.rollout.rerun import rerun_episode
from agentrl.types import Episode, TerminationReason, Turn


class EchoEnv(gymnasium.Env):
    """Observation ``"k:action"``, reward ``k``; ends after ``end_after`` steps. ``fail_at``:
    the step that raises ``fail`` instead; ``invalid`` actions set ``info["invalid_action"]``
    and earn -1; the anchor is a tuple ``(k,)`` when ``tuple_anchor``."""

    def __init__(self, end_after=3, fail_at=None, fail=None, tuple_anchor=False, reward_bias=0.0):
        self.end_after, self.fail_at, self.fail = end_after, fail_at, fail
        self.tuple_anchor, self.reward_bias = tuple_anchor, reward_bias
        self.k = 0

    def _info(self, **kw):
        return {"anchor": (self.k,) if self.tuple_anchor else None, **kw}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.k = 0
        return f"task {options['task_id']} seed {seed}", self._info()

    def step(self, action):
        if self.fail_at == self.k:
            raise self.fail
        invalid = action == "garbage"
        reward = -1.0 if invalid else float(self.k) + self.reward_bias
        self.k += 1
        return f"{self.k}:{action}", reward, self.k >= self.end_after, False, self._info(invalid_action=invalid)


def record(actions, **env_kwargs):
    """The episode the rollout loop would record for ``actions`` on ``EchoEnv(**env_kwargs)``."""
    env = EchoEnv(**env_kwargs)
    obs, info = env.reset(seed=7, options={"task_id": "t"})
    turns, reason = [], TerminationReason.MAX_TURNS
    for a in actions:
        anchor = info["anchor"] if info["anchor"] is not None else obs
        obs, r, term, trunc, info = env.step(a)
        turns.append(Turn(prompt_ids=[1], completion_ids=[2], behavior_log_probs=[-0.1], anchor=anchor,
                          action_text=a, observation_text=obs, reward=r))
        if term:
            reason = TerminationReason.ENV_TERMINATED
            break
    return Episode(group_id="g", env_id="test/Echo-v0", task_id="t", seed=7, turns=turns, terminated=reason.value == "env_terminated",
                   truncated=False, termination_reason=reason, episode_id="ep")


def factory(**kw):
    return lambda req: (EchoEnv(**kw), None)


def test_a_deterministic_env_is_the_same_on_every_turn():
    ep = record(["a", "b", "c"], tuple_anchor=True)
    r = rerun_episode(ep, factory(tuple_anchor=True))
    assert (r.outcome, r.first_divergent_turn, r.exit_code) == ("same", None, 0)
    assert [t.status for t in r.turns] == ["same"] * 3 and r.to_json()["same"] is True


def test_a_reward_that_differs_is_reported_with_its_values():
    r = rerun_episode(record(["a", "b", "c"]), factory(reward_bias=0.5))
    assert (r.outcome, r.first_divergent_turn, r.exit_code) == ("different", 0, 1)
    (f,) = r.turns[0].fields
    assert f.field == "reward" and (f.recorded, f.rerun) == ("0.0", "0.5") and "-0.0\n+0.5" in f.diff


def test_an_env_that_ends_earlier_differs_in_its_end_flags_and_the_rest_is_not_reached():
    r = rerun_episode(record(["a", "b", "c"]), factory(end_after=2))
    assert r.first_divergent_turn == 1 and [f.field for f in r.turns[1].fields] == ["done"]
    assert r.turns[1].fields[0].diff.splitlines()[-2:] == ["-terminated=False truncated=False",
                                                           "+terminated=True truncated=False"]
    assert r.turns[2].status == "not_reached"


def test_a_cut_completion_the_rollout_did_not_score_is_not_stepped():
    ep = record(["a"], end_after=3)
    ep.turns[0].finish_reason = "length"
    ep.turns[0].reward, ep.turns[0].observation_text = 0.0, ""  # what the loop records without score_truncated
    ep.termination_reason, ep.terminated, ep.truncated = TerminationReason.LENGTH, False, True
    r = rerun_episode(ep, factory(), score_truncated=False)
    assert r.outcome == "same" and r.turns[0].status == "not_executed"


def test_an_unparseable_cut_answer_is_scored_0_as_the_loop_scored_it():
    ep = record(["garbage"])
    ep.turns[0].finish_reason, ep.turns[0].reward = "length", 0.0  # the loop's C08a rule: -1 becomes 0
    ep.termination_reason, ep.terminated, ep.truncated = TerminationReason.LENGTH, False, True
    r = rerun_episode(ep, factory(), score_truncated=True)
    assert r.outcome == "same" and r.turns[0].rerun_reward == 0.0


def test_an_infrastructure_fault_is_an_error_not_a_divergence():
    r = rerun_episode(record(["a", "b", "c"]), factory(fail_at=1, fail=SandboxError("container gone")))
    assert (r.outcome, r.same, r.exit_code, r.first_divergent_turn) == ("error", None, 2, None)
    assert r.error["kind"] == "infrastructure" and r.error["turn_index"] == 1 and "container gone" in r.error["message"]
    assert [t.status for t in r.turns] == ["same", "error", "not_reached"]


def test_a_factory_that_cannot_make_the_env_is_an_error():
    def broken(req):
        raise SandboxError("bwrap: cannot start a sandbox here")

    r = rerun_episode(record(["a"]), broken)
    assert r.outcome == "error" and r.error["turn_index"] is None and [t.status for t in r.turns] == ["not_reached"]


def test_a_recorded_reward_error_that_happens_again_is_reproduced():
    ep = record(["a", "b"], end_after=3)
    ep.turns[-1].reward, ep.turns[-1].observation_text = None, ""  # the step raised: no reward recorded
    ep.termination_reason = TerminationReason.REWARD_ERROR
    ep.error = {"type": "RewardError", "message": "verifier timed out"}
    again = rerun_episode(ep, factory(fail_at=1, fail=RewardError("verifier timed out")))
    assert again.outcome == "same" and [t.status for t in again.turns] == ["same", "reproduced"]
    gone = rerun_episode(ep, factory())
    assert gone.outcome == "same" and gone.turns[1].status == "error_not_reproduced"


def test_an_episode_without_turns_has_nothing_to_replay():
    ep = Episode(group_id="g", env_id="test/Echo-v0", task_id="t", seed=7, turns=[],
                 termination_reason=TerminationReason.ABORTED, episode_id="ep")
    with pytest.raises(ContractError, match="no turns"):
        rerun_episode(ep, factory())
