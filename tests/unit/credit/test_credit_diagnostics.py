"""The per-update credit diagnostics (``agentrl.credit.diagnostics``) against hand-computed
numbers, alone and as ``assign_credit`` writes them."""

from __future__ import annotations

import pytest

import critics
from agentrl.config import AlgorithmConfig
from agentrl.credit import assign_credit
from agentrl.credit.diagnostics import gigpo_step_metrics, turn_spread_metrics, zero_grad_update
from agentrl.types import Episode, SamplingRecord, TerminationReason, TokenBatch, TokenSequence, Turn

# Group g: A visits x then y (rewards 0, 1); B stays in x twice (0, 0). Group h: one-step C (1) and D (0).
REWARDS = [[0.0, 1.0], [0.0, 0.0], [1.0], [0.0]]
ANCHORS = [["x", "y"], ["x", "x"], ["u"], ["v"]]
GROUPS = ["g", "g", "h", "h"]


def _ep(group, rewards, anchors, episode_id):
    ep = Episode(group_id=group, env_id="e", task_id=group, seed=0,
                 termination_reason=TerminationReason.ENV_TERMINATED, terminated=True)
    ep.episode_id = episode_id
    for r, a in zip(rewards, anchors):
        ep.turns.append(Turn(prompt_ids=[1, 2], completion_ids=[5, 6], behavior_log_probs=[-0.5, -0.5], reward=r,
                             anchor=a))
    return ep


def _episodes():
    return [_ep(g, r, a, f"e{i}") for i, (g, r, a) in enumerate(zip(GROUPS, REWARDS, ANCHORS))]


def test_gigpo_step_metrics_hand_computed():
    # Step groups: (g,x) = {A0, B0, B1}, (g,y) = {A1}, (h,u) = {C0}, (h,v) = {D0}: sizes 3, 1, 1, 1.
    # gamma 0.5: step returns A0 = 0.5, A1 = 1, B0 = B1 = 0, C0 = 1, D0 = 0. Only (g,x) has >= 2
    # steps: mean 1/6, so A_S = 1/3, -1/6, -1/6 there and 0 elsewhere. A_E = +-0.5 in both groups.
    m = gigpo_step_metrics(REWARDS, ANCHORS, GROUPS, critics.EstimatorParams(gamma=0.5))
    assert m["gigpo/step_groups"] == 4
    assert m["gigpo/step_group_size_mean"] == pytest.approx(1.5)
    assert m["gigpo/step_group_size_max"] == 3
    assert m["gigpo/steps_in_groups_ge2_frac"] == pytest.approx(3 / 6)
    assert m["gigpo/later_steps_in_groups_ge2_frac"] == pytest.approx(1 / 2)  # A1 alone, B1 in (g,x)
    assert m["gigpo/step_adv_abs_mean"] == pytest.approx((1 / 3 + 1 / 6 + 1 / 6) / 6)
    assert m["gigpo/step_adv_nonzero_frac"] == pytest.approx(3 / 6)
    assert m["gigpo/episode_adv_abs_mean"] == pytest.approx(0.5)
    # omega scales the step term only
    m2 = gigpo_step_metrics(REWARDS, ANCHORS, GROUPS, critics.EstimatorParams(gamma=0.5, gigpo_step_weight=2.0))
    assert m2["gigpo/step_adv_abs_mean"] == pytest.approx(2 / 9)
    assert m2["gigpo/episode_adv_abs_mean"] == pytest.approx(0.5)


def test_gigpo_singleton_step_groups_give_no_step_term():
    m = gigpo_step_metrics([[0.0, 1.0], [0.0, 0.0]], [["a", "b"], ["c", "d"]], ["g", "g"], critics.EstimatorParams())
    assert m["gigpo/steps_in_groups_ge2_frac"] == 0.0 and m["gigpo/step_adv_abs_mean"] == 0.0
    assert m["gigpo/step_group_size_mean"] == 1.0
    assert gigpo_step_metrics([], [], [], critics.EstimatorParams())["gigpo/step_groups"] == 0.0


def test_turn_spread_hand_computed():
    m = turn_spread_metrics({"a": [1.0, 1.0], "b": [1.0, 2.0], "c": [None, 3.0], "d": [0.5]})
    # 6 turns in the loss; b's two differ from their mean 1.5; a, b are the multi-turn episodes
    assert m["credit/turn_adv_differs_frac"] == pytest.approx(2 / 6)
    assert m["credit/multi_turn_frac"] == pytest.approx(4 / 6)
    assert turn_spread_metrics({}) == {"credit/turn_adv_differs_frac": 0.0, "credit/multi_turn_frac": 0.0}
    # float noise below the tolerance is not a difference
    assert turn_spread_metrics({"a": [0.1 + 0.2, 0.3]})["credit/turn_adv_differs_frac"] == 0.0


def test_zero_grad_update_reads_loss_tokens_only():
    def batch(adv):
        row = TokenSequence(input_ids=[1, 2, 3], loss_mask=[0, 1, 1], behavior_log_probs=[-0.1, -0.1],
                            advantages=adv, group_id="g", policy_version=0, episode_id="e")
        return TokenBatch.pack([row], SamplingRecord())

    assert zero_grad_update(None) == 1.0
    assert zero_grad_update(batch([0.0, 0.0, 0.0])) == 1.0
    assert zero_grad_update(batch([0.0, 0.5, 0.5])) == 0.0


def test_assign_credit_writes_the_diagnostics():
    grpo = assign_credit(_episodes(), AlgorithmConfig(), SamplingRecord()).metrics
    assert grpo["credit/turn_adv_differs_frac"] == 0.0  # one number per episode
    assert grpo["credit/multi_turn_frac"] == pytest.approx(4 / 6)
    assert grpo["credit/zero_grad_update"] == 0.0
    assert not any(k.startswith("gigpo/") for k in grpo)

    gigpo = assign_credit(_episodes(), AlgorithmConfig(advantage="gigpo", gamma=0.5), SamplingRecord()).metrics
    # A: 0.5 + 1/3 and 0.5 + 0 differ; B: -0.5 - 1/6 twice do not; C, D one turn each
    assert gigpo["credit/turn_adv_differs_frac"] == pytest.approx(2 / 6)
    assert gigpo["gigpo/steps_in_groups_ge2_frac"] == pytest.approx(0.5)
    assert gigpo["gigpo/step_adv_abs_mean"] == pytest.approx(1 / 9)

    flat = [_ep("g", [1.0], ["s"], "f1"), _ep("g", [1.0], ["s"], "f2")]  # no variance: every advantage 0
    assert assign_credit(flat, AlgorithmConfig(), SamplingRecord()).metrics["credit/zero_grad_update"] == 1.0
    assert assign_credit([], AlgorithmConfig(), SamplingRecord()).metrics["credit/zero_grad_update"] == 1.0
