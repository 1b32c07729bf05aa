"""Turn-level and token-level GAE: hand-computed values, masking, errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from agentrl.errors import ConfigError, ContractError
from critics import gae, turn_gae


def test_turn_gae_three_turns():
    # gamma 0.9, lam 0.8 (gamma * lam = 0.72); rewards 0, 0, 1; values 0.5, 0.6, 0.8; V_3 = 0
    # delta_2 = 1 + 0.9*0   - 0.8 = 0.2    A_2 = 0.2
    # delta_1 = 0 + 0.9*0.8 - 0.6 = 0.12   A_1 = 0.12 + 0.72*0.2   = 0.264
    # delta_0 = 0 + 0.9*0.6 - 0.5 = 0.04   A_0 = 0.04 + 0.72*0.264 = 0.23008
    # returns = A + V = 0.73008, 0.864, 1.0
    adv, ret = turn_gae([0, 0, 1], [0.5, 0.6, 0.8], gamma=0.9, lam=0.8)
    np.testing.assert_allclose(adv, [0.23008, 0.264, 0.2], rtol=0, atol=1e-12)
    np.testing.assert_allclose(ret, [0.73008, 0.864, 1.0], rtol=0, atol=1e-12)
    assert adv.dtype == np.float64 and ret.dtype == np.float64


def test_turn_gae_bootstrap_for_truncated_episode():
    # one turn, r = 1, V_0 = 0.5, V_1 = bootstrap 2.0, gamma 0.5: delta = 1 + 1 - 0.5 = 1.5
    adv, ret = turn_gae([1.0], [0.5], gamma=0.5, lam=0.9, bootstrap_value=2.0)
    assert adv.tolist() == [1.5] and ret.tolist() == [2.0]


def test_turn_gae_limits():
    r, v = [1.0, -2.0, 3.0], [0.3, 0.1, -0.4]
    # lam = 1: A_k = discounted return - V_k; gamma 0.5 -> G = 1 - 1 + 0.75 = 0.75, -2 + 1.5 = -0.5, 3
    adv, ret = turn_gae(r, v, gamma=0.5, lam=1.0)
    np.testing.assert_allclose(ret, [0.75, -0.5, 3.0], atol=1e-12)
    # lam = 0: A_k = one-step TD error r_k + gamma V_{k+1} - V_k
    adv0, _ = turn_gae(r, v, gamma=0.5, lam=0.0)
    np.testing.assert_allclose(adv0, [1 + 0.05 - 0.3, -2 - 0.2 - 0.1, 3 + 0.4], atol=1e-12)


def test_turn_gae_errors_and_empty():
    with pytest.raises(ContractError, match="rewards has 2 values but values has 3"):
        turn_gae([1, 2], [1, 2, 3], gamma=1.0, lam=1.0)
    with pytest.raises(ContractError, match="not finite"):
        turn_gae([1, float("nan")], [1, 2], gamma=1.0, lam=1.0)
    with pytest.raises(ConfigError, match="lam=1.1"):
        turn_gae([1], [1], gamma=1.0, lam=1.1)
    adv, ret = turn_gae([], [], gamma=0.9, lam=0.9)
    assert adv.shape == (0,) and ret.shape == (0,)


def test_gae_skips_observation_tokens_and_padding():
    # gamma 0.9, lam 0.5 (gamma * lam = 0.45)
    # row 0: mask 1 1 0 0 1 (tokens 2-3 are an observation), reward 1 on the last token,
    #   values at masked positions 0.1, 0.2, 0.5 (9 on observation tokens: never read)
    #   t=4: delta = 1 + 0 - 0.5 = 0.5                  A = 0.5
    #   t=1: delta = 0 + 0.9*0.5 - 0.2 = 0.25 (bootstrap = value of the next *sampled* token)
    #        A = 0.25 + 0.45*0.5 = 0.475
    #   t=0: delta = 0 + 0.9*0.2 - 0.1 = 0.08           A = 0.08 + 0.45*0.475 = 0.29375
    #   returns = A + V = 0.39375, 0.675, -, -, 1.0
    # row 1: mask 1 1 1 0 0 (padding), reward 2 at t=2, values 0, 0.5, 1.0 (7 on padding)
    #   t=2: delta = 2 - 1 = 1                          A = 1
    #   t=1: delta = 0.9*1 - 0.5 = 0.4                  A = 0.4 + 0.45*1 = 0.85
    #   t=0: delta = 0.9*0.5 - 0 = 0.45                 A = 0.45 + 0.45*0.85 = 0.8325
    #   returns = 0.8325, 1.35, 2.0, -, -
    rewards = [[0, 0, 0, 0, 1], [0, 0, 2, 0, 0]]
    values = [[0.1, 0.2, 9, 9, 0.5], [0.0, 0.5, 1.0, 7, 7]]
    mask = [[1, 1, 0, 0, 1], [1, 1, 1, 0, 0]]
    adv, ret = gae(rewards, values, mask, gamma=0.9, lam=0.5)
    np.testing.assert_allclose(adv, [[0.29375, 0.475, 0, 0, 0.5], [0.8325, 0.85, 1.0, 0, 0]], rtol=0, atol=1e-12)
    np.testing.assert_allclose(ret, [[0.39375, 0.675, 0, 0, 1.0], [0.8325, 1.35, 2.0, 0, 0]], rtol=0, atol=1e-12)
    # exactly zero off the mask
    off = np.asarray(mask) == 0
    assert np.all(adv[off] == 0.0) and np.all(ret[off] == 0.0)


def test_gae_equals_turn_gae_on_the_masked_subsequence():
    rng = np.random.default_rng(1)
    r = rng.normal(size=(3, 12))
    v = rng.normal(size=(3, 12))
    m = (rng.random((3, 12)) < 0.6).astype(np.int64)
    r = r * m  # rewards only on sampled tokens
    adv, ret = gae(torch.tensor(r), torch.tensor(v), torch.tensor(m).bool(), gamma=0.97, lam=0.9)
    for b in range(3):
        on = m[b] == 1
        a_ref, ret_ref = turn_gae(r[b, on], v[b, on], gamma=0.97, lam=0.9)
        np.testing.assert_allclose(adv[b, on], a_ref, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(ret[b, on], ret_ref, rtol=1e-12, atol=1e-12)


def test_gae_row_without_sampled_tokens_is_zero():
    adv, ret = gae([[0.0, 0.0]], [[5.0, 5.0]], [[0, 0]], gamma=1.0, lam=1.0)
    assert adv.tolist() == [[0.0, 0.0]] and ret.tolist() == [[0.0, 0.0]]


def test_gae_errors():
    with pytest.raises(ContractError, match="expected equal \\[B, T\\] shapes"):
        gae([[0.0, 1.0]], [[0.0]], [[1, 1]], gamma=1.0, lam=1.0)
    with pytest.raises(ContractError, match="mask\\[0, 1\\]=0.5"):
        gae([[0.0, 1.0]], [[0.0, 0.0]], [[1, 0.5]], gamma=1.0, lam=1.0)
    with pytest.raises(ContractError, match="rewards\\[0, 1\\]=1.0 lies on a mask==0 position"):
        gae([[0.0, 1.0]], [[0.0, 0.0]], [[1, 0]], gamma=1.0, lam=1.0)
    with pytest.raises(ContractError, match="values\\[0, 0\\]=nan is not finite"):
        gae([[0.0, 1.0]], [[float("nan"), 0.0]], [[1, 1]], gamma=1.0, lam=1.0)
    with pytest.raises(ContractError, match="2 dimension"):
        gae([0.0, 1.0], [0.0, 0.0], [1, 1], gamma=1.0, lam=1.0)
    with pytest.raises(ConfigError, match="gamma=-0.1"):
        gae([[0.0]], [[0.0]], [[1]], gamma=-0.1, lam=1.0)
