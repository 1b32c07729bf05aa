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


def _episode(mode: str):
    from agentrl.types import Episode, Turn

    turns = [
        Turn(prompt_ids=[1, 2, 3], completion_ids=[4, 5], behavior_log_probs=[-0.1, -0.2], reward=0.0),
        Turn(prompt_ids=[6, 7], completion_ids=[8, 9, 10], behavior_log_probs=[-0.1] * 3, reward=0.0),
        Turn(prompt_ids=[11, 12], completion_ids=[13], behavior_log_probs=[-0.3], reward=1.0),
    ]
    return Episode(group_id="g", env_id="e", task_id="t", seed=0, turns=turns, prompt_mode=mode, episode_id="ep")


@pytest.mark.parametrize("mode", ["full_history", "per_step"])
def test_episode_boundaries_follow_training_sequences_layout(mode):
    ep = _episode(mode)
    bounds = critics.episode_boundaries(ep)
    rows = ep.training_sequences([0.0, 0.0, 0.0])
    assert len(bounds) == len(rows)
    for b, row in zip(bounds, rows):
        mask = list(row.loss_mask)
        for i in b:
            # the boundary is a prompt token and the next token is the turn's first sampled one
            assert mask[i] == 0 and mask[i + 1] == 1
    assert sum(len(b) for b in bounds) == len(ep.turns)
    if mode == "full_history":
        assert bounds == [[2, 6, 11]]
    else:
        assert bounds == [[2], [1], [1]]


@pytest.mark.parametrize("mode", ["full_history", "per_step"])
def test_split_per_row_matches_episode_boundaries(mode):
    ep = _episode(mode)
    split = critics.split_per_row(ep, np.array([0.5, 1.5, 2.5]))
    assert [len(x) for x in split] == [len(b) for b in critics.episode_boundaries(ep)]
    assert [v for row in split for v in row] == [0.5, 1.5, 2.5]
    with pytest.raises(ContractError, match="got 2 per-turn values for episode ep of 3 turns"):
        critics.split_per_row(ep, [1.0, 2.0])


def test_episode_boundaries_reject_a_row_without_prompt():
    ep = _episode("per_step")
    ep.turns[1].prompt_ids = []
    with pytest.raises(ContractError, match="episode ep turn 1 has no prompt_ids"):
        critics.episode_boundaries(ep)
    ep = _episode("full_history")
    ep.turns[0].prompt_ids = []
    with pytest.raises(ContractError, match=r"episode ep: turn_prompt_lens\[0\]=0"):
        critics.episode_boundaries(ep)
