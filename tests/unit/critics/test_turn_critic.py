"""critics.turn_critic: turn boundary positions and turn-level GAE over episodes."""

from __future__ import annotations

import numpy as np
import pytest

import critics
from agentrl.errors import ConfigError, ContractError
from critics import turn_boundaries, turn_critic_advantages, turn_gae


def test_turn_boundaries_known_values():
    # PPP CC OO CCC OO C  -> last token before each completion: 2, 6, 11
    assert turn_boundaries([3, 2, 2], [2, 3, 1]) == [2, 6, 11]
    assert turn_boundaries([3, 2], [4, 5]) == [2, 8]
    assert turn_boundaries([1], [7]) == [0]
    assert turn_boundaries([], []) == []


def test_turn_boundaries_empty_observation_reads_previous_completion_end():
    # turn 1 has no tokens before its completion: its state ends with completion 0's last token
    assert turn_boundaries([2, 0], [3, 2]) == [1, 4]


def test_turn_boundaries_accepts_numpy_and_every_index_is_before_its_completion():
    p, c = np.array([4, 1, 3]), np.array([2, 2, 5])
    b = turn_boundaries(p, c)
    starts = np.cumsum(np.r_[0, (p + c)[:-1]]) + p  # first completion token of each turn
    assert b == (starts - 1).tolist()
    assert all(x < int(p.sum() + c.sum()) for x in b)


@pytest.mark.parametrize(
    ("p", "c", "match"),
    [
        ([2, 1], [3], "turn_prompt_lens has 2 values but turn_completion_lens has 1"),
        ([0, 1], [3, 1], r"turn_prompt_lens\[0\]=0"),
        ([2, -1], [3, 1], r"turn_prompt_lens\[1\]=-1"),
        ([2, 1], [3, 1.5], r"turn_completion_lens\[1\]=1.5"),
        ([True], [1], r"turn_prompt_lens\[0\]=True"),
    ],
)
def test_turn_boundaries_rejects_bad_input(p, c, match):
    with pytest.raises(ContractError, match=match):
        turn_boundaries(p, c)


def test_turn_critic_advantages_known_values():
    adv, ret = turn_critic_advantages(
        [[0.0, 0.0, 1.0], [1.0], []],
        [[0.2, 0.4, 0.6], [0.5], []],
        gamma=0.9,
        lam=0.8,
        bootstrap_values=[0.0, 2.0, 0.0],
    )
    # by hand: delta_2 = 1 - .6 = .4; delta_1 = .9*.6 - .4 = .14; delta_0 = .9*.4 - .2 = .16
    # A_2 = .4, A_1 = .14 + .72*.4 = .428, A_0 = .16 + .72*.428 = .46816
    np.testing.assert_allclose(adv[0], [0.46816, 0.428, 0.4], rtol=0, atol=1e-12)
    np.testing.assert_allclose(ret[0], [0.66816, 0.828, 1.0], rtol=0, atol=1e-12)
    # truncated episode: delta = 1 + .9*2 - .5 = 2.3
    np.testing.assert_allclose(adv[1], [2.3], rtol=0, atol=1e-12)
    np.testing.assert_allclose(ret[1], [2.8], rtol=0, atol=1e-12)
    assert adv[2].shape == ret[2].shape == (0,)
    assert all(a.dtype == np.float64 for a in adv + ret)


def test_turn_critic_advantages_equals_turn_gae_per_episode():
    rng = np.random.default_rng(0)
    rewards = [rng.normal(size=k) for k in (1, 4, 2)]
    values = [rng.normal(size=k) for k in (1, 4, 2)]
    adv, ret = turn_critic_advantages(rewards, values, gamma=0.95, lam=0.9)
    for r, v, a, g in zip(rewards, values, adv, ret):
        want_a, want_r = turn_gae(r, v, gamma=0.95, lam=0.9)
        np.testing.assert_array_equal(a, want_a)
        np.testing.assert_array_equal(g, want_r)


def test_turn_critic_advantages_lambda_one_zero_values_is_discounted_return():
    adv, ret = turn_critic_advantages([[1.0, 2.0, 3.0]], [[0.0, 0.0, 0.0]], gamma=0.5, lam=1.0)
    np.testing.assert_allclose(ret[0], [1 + 0.5 * 2 + 0.25 * 3, 2 + 0.5 * 3, 3.0])
    np.testing.assert_array_equal(adv[0], ret[0])


def test_turn_critic_advantages_errors_name_the_problem():
    with pytest.raises(ContractError, match="rewards has 2 episodes but values has 1"):
        turn_critic_advantages([[1.0], [1.0]], [[0.0]], gamma=1.0, lam=1.0)
    with pytest.raises(ContractError, match="episode 1: rewards has 2 values but values has 1"):
        turn_critic_advantages([[1.0], [1.0, 2.0]], [[0.0], [0.0]], gamma=1.0, lam=1.0)
    with pytest.raises(ContractError, match="bootstrap_values has 1 values but there are 2 episodes"):
        turn_critic_advantages([[1.0], [1.0]], [[0.0], [0.0]], gamma=1.0, lam=1.0, bootstrap_values=[0.0])
    with pytest.raises(ContractError, match=r"bootstrap_values\[0\]=nan"):
        turn_critic_advantages([[1.0]], [[0.0]], gamma=1.0, lam=1.0, bootstrap_values=[float("nan")])
    with pytest.raises(ContractError, match="episode 0: values"):
        turn_critic_advantages([[1.0]], [[float("inf")]], gamma=1.0, lam=1.0)
    with pytest.raises(ConfigError, match="gamma=1.5"):
        turn_critic_advantages([[1.0]], [[0.0]], gamma=1.5, lam=1.0)


def test_exported_from_package():
    assert critics.turn_boundaries is turn_boundaries
    assert critics.turn_critic_advantages is turn_critic_advantages
