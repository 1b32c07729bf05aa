"""critics.turn_critic, token level (the ``gae`` estimator): where a token-level critic reads
each sampled token's value (``p - 1``), rewards on tokens, and GAE over episodes."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import critics
from agentrl.errors import ConfigError, ContractError
from agentrl.types import Episode
from tests.helpers.episodes import make_episode
from critics import (
    gae,
    token_critic_advantages,
    token_value_positions,
    turn_rewards_on_tokens,
)


_episode = make_episode


def test_token_value_positions_are_one_before_each_sampled_token():
    # P P C C O C: sampled tokens at 2, 3, 5 -> values read at 1, 2, 4
    assert token_value_positions([0, 0, 1, 1, 0, 1]) == [1, 2, 4]
    # PPP CC OO CCC (the 2-turn example of the credit tests): sampled at 3,4,7,8,9
    assert token_value_positions([0, 0, 0, 1, 1, 0, 0, 1, 1, 1]) == [2, 3, 6, 7, 8]
    assert token_value_positions([0, 0, 0]) == []
    assert token_value_positions([]) == []
    # numpy, bool and float32 tensors (TokenBatch.loss_mask) give the same
    assert token_value_positions(np.array([0, 1, 1])) == [0, 1]
    assert token_value_positions(torch.tensor([0.0, 1.0, 0.0, 1.0])) == [0, 2]
    assert token_value_positions([False, True]) == [0]


def test_token_value_positions_rejects_bad_masks():
    with pytest.raises(ContractError, match=r"loss_mask\[0\]=1"):
        token_value_positions([1, 0, 1])
    with pytest.raises(ContractError, match=r"loss_mask\[2\]=2.0; expected 0 or 1"):
        token_value_positions([0, 1, 2])
    with pytest.raises(ContractError, match="loss_mask"):
        token_value_positions([0, None, 1])


def _counts(ep: Episode) -> list[int]:
    return [len(t.completion_ids) for t in ep.turns]


def test_turn_rewards_land_on_each_turns_last_sampled_token():
    # completions 2, 3; rewards 0.5, 1.0
    np.testing.assert_array_equal(turn_rewards_on_tokens([2, 3], [0.5, 1.0]), [0.0, 0.5, 0.0, 0.0, 1.0])
    # an empty completion has no token: its reward goes on the previous sampled token, or on
    # the first sampled token when none precedes it; nothing is lost
    np.testing.assert_allclose(turn_rewards_on_tokens([0, 2, 0, 1], [0.1, 0.2, 0.3, 0.4]), [0.1, 0.5, 0.4], atol=1e-15)
    assert turn_rewards_on_tokens([0], [1.0]).shape == (0,)
    assert turn_rewards_on_tokens(np.array([1, 1]), np.array([1.0, 2.0])).tolist() == [1.0, 2.0]
    with pytest.raises(ContractError, match="got 1 turn rewards for 2 turns"):
        turn_rewards_on_tokens([2, 3], [1.0])
    with pytest.raises(ContractError, match="not finite"):
        turn_rewards_on_tokens([2, 3], [1.0, float("nan")])
    with pytest.raises(ContractError, match=r"turn_token_counts\[1\]=-1"):
        turn_rewards_on_tokens([2, -1], [1.0, 1.0])


def test_token_critic_advantages_equal_gae_on_the_full_token_stream():
    """The packed (sampled tokens only) run equals critics.gae on the whole stream with its
    loss_mask, observation tokens included, for several episodes of different lengths."""
    rng = np.random.default_rng(0)
    eps = [_episode("full_history", episode_id="a"),
           _episode("per_step", completions=(4, 1, 2), prompts=(2, 3, 1), rewards=(0.0, -1.0, 2.0), episode_id="b"),
           _episode("full_history", completions=(1,), prompts=(5,), rewards=(3.0,), episode_id="c")]
    rewards = [[t.reward for t in e.turns] for e in eps]
    values = [rng.normal(size=e.num_generated_tokens()) for e in eps]
    adv, ret = token_critic_advantages([_counts(e) for e in eps], rewards, values, gamma=0.97, lam=0.9)
    for e, r, v, a, g in zip(eps, rewards, values, adv, ret):
        mask = np.asarray(e.loss_mask(), dtype=np.float64)  # [L], rows concatenated in either mode
        on = mask == 1
        r_full, v_full = np.zeros_like(mask), np.full_like(mask, np.nan)  # NaN: never read off-mask
        r_full[on], v_full[on] = turn_rewards_on_tokens(_counts(e), r), v
        want_a, want_r = gae(r_full[None], v_full[None], mask[None], gamma=0.97, lam=0.9)
        np.testing.assert_allclose(a, want_a[0, on], rtol=0, atol=1e-12)
        np.testing.assert_allclose(g, want_r[0, on], rtol=0, atol=1e-12)
        np.testing.assert_allclose(g, a + v, rtol=0, atol=1e-12)
        assert a.dtype == np.float64 and a.shape == (e.num_generated_tokens(),)


def test_token_critic_advantages_gamma_lam_one_zero_values_is_the_undiscounted_return_to_go():
    ep = _episode("per_step")  # rewards 0.5 after turn 0 (token 1), 1.0 after turn 1 (token 4)
    adv, ret = token_critic_advantages([_counts(ep)], [[0.5, 1.0]], [np.zeros(5)], gamma=1.0, lam=1.0)
    np.testing.assert_array_equal(adv[0], [1.5, 1.5, 1.0, 1.0, 1.0])
    np.testing.assert_array_equal(ret[0], adv[0])


def test_token_critic_advantages_errors_name_the_problem():
    c = [2, 3]
    with pytest.raises(ContractError, match="got 1 token-count lists, 2 reward lists and 1 value lists"):
        token_critic_advantages([c], [[0.0, 1.0], [1.0]], [np.zeros(5)], gamma=1.0, lam=1.0)
    with pytest.raises(ContractError, match="episode 0: 4 values for 5 sampled tokens"):
        token_critic_advantages([c], [[0.0, 1.0]], [np.zeros(4)], gamma=1.0, lam=1.0)
    with pytest.raises(ContractError, match="episode 0: .*not finite"):
        token_critic_advantages([c], [[0.0, 1.0]], [[0.0, 0.0, float("inf"), 0.0, 0.0]], gamma=1.0, lam=1.0)
    with pytest.raises(ContractError, match="episode 0: got 1 turn rewards"):
        token_critic_advantages([c], [[1.0]], [np.zeros(5)], gamma=1.0, lam=1.0)
    with pytest.raises(ConfigError, match="lam=1.5"):
        token_critic_advantages([c], [[0.0, 1.0]], [np.zeros(5)], gamma=1.0, lam=1.5)
    assert token_critic_advantages([], [], [], gamma=0.9, lam=0.9) == ([], [])


def test_exported_from_package():
    for name in ("token_value_positions", "turn_rewards_on_tokens", "token_critic_advantages"):
        assert name in critics.__all__ and getattr(critics, name) is not None
