"""GRPO / RLOO / Dr. GRPO advantages: hand-computed values, cases C05 and C12."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from agentrl.errors import ConfigError, ContractError
from critics import (
    drgrpo_advantages,
    grpo_advantages,
    rloo_advantages,
    valid_reward_mask,
)
from critics_reference import grpo_advantages_loop

EPS = 1e-6


def test_grpo_known_values_two_groups():
    # group "a": rewards 1, 0, 0, 1 -> mean 0.5; deviations +-0.5;
    #   unbiased var = (4 * 0.25) / 3 = 1/3, std = 0.5773502692
    #   A = +-0.5 / (0.5773502692 + 1e-6)
    # group "b": rewards 2, 4 -> mean 3; deviations -1, +1; var = 2 / 1 = 2, std = sqrt(2)
    #   A = -+1 / (sqrt(2) + 1e-6)
    adv = grpo_advantages([1, 0, 2, 0, 1, 4], ["a", "a", "b", "a", "a", "b"])
    sa = 0.5 / (math.sqrt(1 / 3) + EPS)
    sb = 1.0 / (math.sqrt(2) + EPS)
    np.testing.assert_allclose(adv, [sa, -sa, -sb, -sa, sa, sb], rtol=0, atol=1e-12)
    assert adv.dtype == np.float64 and adv.shape == (6,)


def test_drgrpo_is_mean_baseline_without_std():
    # group 0: 1, 2, 6 -> mean 3 -> -2, -1, 3 ; group 1: 5, 7 -> mean 6 -> -1, 1
    r, g = [1, 2, 6, 5, 7], [0, 0, 0, 1, 1]
    expected = [-2.0, -1.0, 3.0, -1.0, 1.0]
    np.testing.assert_array_equal(grpo_advantages(r, g, norm_by_std=False), expected)
    np.testing.assert_array_equal(drgrpo_advantages(r, g), expected)


def test_rloo_leave_one_out_baseline():
    # rewards 1, 2, 6 (one group):
    #   A_0 = 1 - (2 + 6)/2 = -3 ; A_1 = 2 - (1 + 6)/2 = -1.5 ; A_2 = 6 - (1 + 2)/2 = 4.5
    #   (= n/(n-1) * (r - mean) = 1.5 * (-2, -1, 3))
    adv = grpo_advantages([1, 2, 6], [7, 7, 7], leave_one_out=True, norm_by_std=False)
    np.testing.assert_allclose(adv, [-3.0, -1.5, 4.5], rtol=0, atol=1e-12)
    np.testing.assert_allclose(rloo_advantages([1, 2, 6], [7, 7, 7]), adv, rtol=0, atol=0)
    # with the std: unbiased std of (1, 2, 6) = sqrt((4 + 1 + 9) / 2) = sqrt(7)
    adv_std = grpo_advantages([1, 2, 6], [7, 7, 7], leave_one_out=True)
    np.testing.assert_allclose(adv_std, np.array([-3.0, -1.5, 4.5]) / (math.sqrt(7) + EPS), atol=1e-12)


@pytest.mark.parametrize("norm_by_std", [True, False])
@pytest.mark.parametrize("leave_one_out", [True, False])
def test_C05_equal_rewards_and_singletons_give_exact_zero(norm_by_std, leave_one_out):
    rewards = [0.35] * 4 + [1, 1, 1, 1] + [0.7]
    groups = ["p"] * 4 + ["q"] * 4 + ["single"]
    adv = grpo_advantages(rewards, groups, norm_by_std=norm_by_std, leave_one_out=leave_one_out)
    assert adv.tolist() == [0.0] * 9  # exactly 0.0: no NaN, no inf, no float-noise blow-up
    # eps=0 must not divide 0 by 0 either
    adv0 = grpo_advantages(rewards, groups, eps=0.0, norm_by_std=norm_by_std, leave_one_out=leave_one_out)
    assert adv0.tolist() == [0.0] * 9


def test_C05_float_noise_std_does_not_blow_up():
    # 0.1 + 0.2 = 0.30000000000000004 != 0.3: the two rewards differ by 5.6e-17 (float
    # error). Their std is ~4e-17; without the equal-rewards rule, eps=0 would give +-0.707.
    rewards = [0.1 + 0.2, 0.3, 0.3, 0.1 + 0.2]
    assert rewards[0] != rewards[1]
    for eps in (1e-6, 0.0):
        assert grpo_advantages(rewards, [0] * 4, eps=eps).tolist() == [0.0] * 4
    # a float mean of identical values that is not representable exactly
    assert grpo_advantages([0.35] * 7, [1] * 7, eps=0.0).tolist() == [0.0] * 7


def test_C12_missing_reward_excluded_and_other_groups_unchanged():
    rewards = [1, None, 0, 1, 0.2, 0.9, 0.4]
    groups = ["g1", "g1", "g1", "g1", "g2", "g2", "g2"]
    adv = grpo_advantages(rewards, groups)
    assert np.all(np.isfinite(adv))
    # g1's statistics use its 3 valid rewards 1, 0, 1: mean 2/3; deviations 1/3, -2/3, 1/3;
    # unbiased var = (1/9 + 4/9 + 1/9) / 2 = 1/3 -> std = 0.57735
    s = math.sqrt(1 / 3) + EPS
    np.testing.assert_allclose(adv[:4], [(1 / 3) / s, 0.0, (-2 / 3) / s, (1 / 3) / s], atol=1e-12)
    assert adv[1] == 0.0  # the failed sample: never scored, advantage 0.0 ...
    assert valid_reward_mask(rewards).tolist() == [True, False, True, True, True, True, True]
    # ... and g2's advantages are identical to computing g2 alone
    alone = grpo_advantages([0.2, 0.9, 0.4], ["g2"] * 3)
    np.testing.assert_array_equal(adv[4:], alone)
    # and identical to computing g1 without the failed sample
    np.testing.assert_allclose(adv[[0, 2, 3]], grpo_advantages([1, 0, 1], ["g1"] * 3), atol=1e-15)


def test_C12_nan_and_inf_rewards_are_missing_too():
    rewards = np.array([1.0, np.nan, 0.0, np.inf])
    adv = grpo_advantages(rewards, [0, 0, 0, 0])
    assert valid_reward_mask(rewards).tolist() == [True, False, True, False]
    # valid 1, 0: mean 0.5, std sqrt(0.5) -> +-0.5 / (0.70710678 + 1e-6)
    s = 0.5 / (math.sqrt(0.5) + EPS)
    np.testing.assert_allclose(adv, [s, 0.0, -s, 0.0], atol=1e-12)


def test_C12_all_rewards_of_a_group_missing_gives_zero():
    adv = grpo_advantages([None, None, 1.0, 3.0], ["x", "x", "y", "y"])
    assert adv[:2].tolist() == [0.0, 0.0]
    assert np.all(np.isfinite(adv))


def test_C12_wrong_length_names_both_lengths():
    # "a reward function returns 1 value for 3 samples"
    with pytest.raises(ContractError) as err:
        grpo_advantages([1.0], ["a", "a", "a"])
    assert "1" in str(err.value) and "3" in str(err.value)
    assert "rewards" in str(err.value) and "group_ids" in str(err.value)


def test_groups_keyed_by_id_not_position_and_any_hashable():
    # interleaved group members; int and tuple keys
    r = [1.0, 10.0, 3.0, 30.0]
    for g in ([0, 1, 0, 1], [("t", 0), ("t", 1), ("t", 0), ("t", 1)], np.array([5, 9, 5, 9])):
        adv = grpo_advantages(r, g, norm_by_std=False)
        np.testing.assert_array_equal(adv, [-1.0, -10.0, 1.0, 10.0])


def test_accepts_numpy_and_torch_inputs():
    r = [0.0, 1.0, 1.0, 0.5]
    g = [0, 0, 1, 1]
    expected = grpo_advantages(r, g)
    # 0, 0.5 and 1 are exact in float32, so the float32 input gives the same float64 output
    out_np = grpo_advantages(np.array(r, dtype=np.float32), np.array(g))
    assert out_np.dtype == np.float64
    np.testing.assert_array_equal(out_np, expected)
    out_t = grpo_advantages(torch.tensor(r, dtype=torch.float64), torch.tensor(g))
    assert isinstance(out_t, np.ndarray) and out_t.dtype == np.float64
    np.testing.assert_array_equal(out_t, expected)


def test_bad_inputs_raise_clear_errors():
    with pytest.raises(ContractError, match="rewards\\[1\\]='x'"):
        grpo_advantages([1.0, "x"], [0, 0])
    with pytest.raises(ContractError, match="not hashable"):
        grpo_advantages([1.0, 2.0], [[0], [0]])
    with pytest.raises(ContractError, match="1-D"):
        grpo_advantages(np.zeros((2, 2)), [0, 0])
    with pytest.raises(ConfigError, match="eps=-1"):
        grpo_advantages([1.0, 2.0], [0, 0], eps=-1)


def test_empty_input():
    adv = grpo_advantages([], [])
    assert adv.shape == (0,) and adv.dtype == np.float64


def test_matches_loop_reference_on_random_inputs():
    rng = np.random.default_rng(3)
    for _ in range(20):
        n = int(rng.integers(1, 40))
        r = rng.choice([0.0, 0.5, 1.0, 0.25], size=n).tolist()
        r = [None if rng.random() < 0.1 else x for x in r]
        g = rng.integers(0, 5, size=n).tolist()
        for kw in ({}, {"norm_by_std": False}, {"leave_one_out": True}):
            np.testing.assert_allclose(
                grpo_advantages(r, g, **kw), grpo_advantages_loop(r, g, **kw), rtol=1e-12, atol=1e-12
            )
