"""From episodes to a TokenBatch: error exclusion (C12), shaping, dynamic sampling, token accounting."""

import pytest

from agentrl.config import AlgorithmConfig
from agentrl.credit import assign_credit, shaped_turn_rewards
from agentrl.types import Episode, SamplingRecord, TerminationReason, Turn


def _ep(group, rewards, *, invalid=(), lens=None, reason=TerminationReason.ENV_TERMINATED):
    ep = Episode(group_id=group, env_id="e", task_id=group, seed=0)
    for k, r in enumerate(rewards):
        n = (lens or [2] * len(rewards))[k]
        ep.turns.append(Turn(prompt_ids=[1, 2], completion_ids=[5] * n, behavior_log_probs=[-0.5] * n,
                             reward=r, invalid_action=k in invalid))
    ep.termination_reason = reason
    ep.terminated = reason == TerminationReason.ENV_TERMINATED
    ep.truncated = not ep.terminated and not reason.is_error
    return ep


def test_C12_errored_samples_are_excluded_counted_and_leave_other_groups_unchanged():
    good = [_ep("a", [1.0]), _ep("a", [0.0]), _ep("b", [1.0]), _ep("b", [0.0]), _ep("b", [1.0])]
    bad = _ep("a", [1.0], reason=TerminationReason.REWARD_ERROR)
    infra = _ep("b", [0.0], reason=TerminationReason.INFRA_ERROR)
    with_err = assign_credit(good + [bad, infra], AlgorithmConfig(), SamplingRecord())
    without = assign_credit(good, AlgorithmConfig(), SamplingRecord())
    assert with_err.metrics["filter/reward_errors"] == 1 and with_err.metrics["filter/infra_errors"] == 1
    assert bad.episode_id not in with_err.turn_advantages and infra.episode_id not in with_err.turn_advantages
    assert bad.total_reward is None  # never scored 0
    for e in good:
        assert with_err.turn_advantages[e.episode_id] == without.turn_advantages[e.episode_id]
    assert with_err.metrics["tokens/discarded"] == 4 and with_err.batch.num_rows == 5


def test_drop_group_policy_drops_the_errored_group():
    eps = [_ep("a", [1.0]), _ep("a", [0.0], reason=TerminationReason.INFRA_ERROR), _ep("b", [1.0]), _ep("b", [0.0])]
    res = assign_credit(eps, AlgorithmConfig(error_policy="drop_group"), SamplingRecord())
    assert res.batch.group_ids == ("b", "b")


def test_invalid_action_penalty_hits_that_step_only_and_overlong_is_soft():
    cfg = AlgorithmConfig(invalid_action_penalty=0.5, overlong_buffer_tokens=4, overlong_penalty=1.0)
    ep = _ep("a", [0.0, 0.0, 1.0], invalid=(1,), lens=[2, 7, 8])
    # max_new_tokens=8, buffer 4: free up to 4 tokens; 7 -> (4 - 7)/4 = -0.75; 8 -> -1.0
    assert shaped_turn_rewards(ep, cfg, max_new_tokens=8) == pytest.approx([0.0, -0.5 - 0.75, 1.0 - 1.0])
    assert [t.reward for t in ep.turns] == [0.0, 0.0, 1.0]  # recorded env rewards unchanged


def test_dynamic_sampling_drops_equal_reward_groups_and_counts_their_tokens():
    eps = [_ep("a", [1.0]), _ep("a", [1.0]), _ep("b", [1.0]), _ep("b", [0.0])]
    res = assign_credit(eps, AlgorithmConfig(dynamic_sampling=True), SamplingRecord())
    assert res.metrics["filter/dynamic_sampling_dropped_groups"] == 1
    assert res.metrics["tokens/discarded"] == 4 and res.metrics["tokens/trained"] == 4
    assert res.metrics["tokens/generated"] == res.metrics["tokens/trained"] + res.metrics["tokens/discarded"]
    assert set(res.batch.group_ids) == {"b"}


@pytest.mark.parametrize("advantage", ["grpo", "rloo", "drgrpo", "gigpo"])
def test_C05_equal_rewards_give_exact_zero_advantages(advantage):
    eps = [_ep("a", [0.35]) for _ in range(4)] + [_ep("solo", [1.0])]
    res = assign_credit(eps, AlgorithmConfig(advantage=advantage), SamplingRecord())
    assert all(a == 0.0 for adv in res.turn_advantages.values() for a in adv)
    assert float(res.batch.advantages.abs().sum()) == 0.0
