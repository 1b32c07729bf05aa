"""DAPO dynamic sampling and overlong penalty; the estimator registry."""

from __future__ import annotations

import numpy as np
import pytest

from agentrl.errors import ConfigError, ContractError
from critics import (
    ESTIMATORS,
    drgrpo_advantages,
    dynamic_sampling_keep,
    gae,
    get_estimator,
    gigpo_advantages,
    grpo_advantages,
    overlong_penalty,
    register_estimator,
    rloo_advantages,
    turn_gae,
)


def test_dynamic_sampling_drops_constant_groups():
    # group 0: 1, 1, 0 -> mixed, kept; group 1: 1, 1 -> all correct, dropped;
    # group 2: 0, 0 -> all wrong, dropped; group 3: single sample -> dropped;
    # group 4: 1, None, 1 -> valid rewards equal, dropped (None is never kept);
    # group 5: 0.1 + 0.2 and 0.3 -> equal up to float noise, dropped
    rewards = [1, 1, 0, 1, 1, 0, 0, 0.5, 1, None, 1, 0.1 + 0.2, 0.3]
    groups = [0, 0, 0, 1, 1, 2, 2, 3, 4, 4, 4, 5, 5]
    keep = dynamic_sampling_keep(rewards, groups)
    assert keep.dtype == bool
    assert keep.tolist() == [True] * 3 + [False] * 10
    # consistent with the advantages: a dropped group has all-zero advantages
    adv = grpo_advantages(rewards, groups)
    assert np.all(adv[~keep] == 0.0) and np.all(adv[keep] != 0.0)


def test_dynamic_sampling_missing_sample_in_a_kept_group():
    keep = dynamic_sampling_keep([1.0, None, 0.0], ["a", "a", "a"])
    assert keep.tolist() == [True, False, True]
    with pytest.raises(ContractError, match="rewards has 2 values but group_ids has 3"):
        dynamic_sampling_keep([1.0, 0.0], ["a", "a", "a"])


def test_overlong_penalty_eq13():
    # L_max = 20, L_cache = 4 -> soft limit 16
    # |y| = 10, 16 -> 0 ; 17 -> (16 - 17)/4 = -0.25 ; 18 -> -0.5 ; 20 -> -1 ; 21, 100 -> -1
    out = overlong_penalty([10, 16, 17, 18, 20, 21, 100], max_len=20, cache_len=4)
    np.testing.assert_allclose(out, [0, 0, -0.25, -0.5, -1.0, -1.0, -1.0], rtol=0, atol=1e-15)
    assert out.dtype == np.float64
    # penalty scales; DAPO's numbers: L_max 20480, L_cache 4096 -> 18432 tokens: -0.5
    scaled = overlong_penalty([18432, 30000], max_len=20480, cache_len=4096, penalty=2.0)
    np.testing.assert_allclose(scaled, [-1.0, -2.0])
    # cache_len = 0: a hard step above max_len
    assert overlong_penalty([20, 21], max_len=20, cache_len=0).tolist() == [0.0, -1.0]


@pytest.mark.parametrize(
    "kwargs, err, match",
    [
        ({"max_len": 0, "cache_len": 0}, ConfigError, "max_len=0"),
        ({"max_len": 10, "cache_len": 11}, ConfigError, "cache_len=11"),
        ({"max_len": 10.5, "cache_len": 1}, ConfigError, "max_len=10.5"),
        ({"max_len": 10, "cache_len": 2, "penalty": -1.0}, ConfigError, "penalty=-1.0"),
    ],
)
def test_overlong_penalty_config_errors(kwargs, err, match):
    with pytest.raises(err, match=match):
        overlong_penalty([1, 2], **kwargs)


def test_overlong_penalty_bad_lengths():
    with pytest.raises(ContractError, match="lengths\\[1\\]=-3"):
        overlong_penalty([1, -3], max_len=10, cache_len=2)
    with pytest.raises(ContractError, match="lengths\\[0\\]=2.5"):
        overlong_penalty([2.5], max_len=10, cache_len=2)


def test_registry_names_and_functions():
    assert set(ESTIMATORS) >= {"grpo", "rloo", "drgrpo", "gigpo", "turn_critic", "gae"}
    assert get_estimator("grpo") is grpo_advantages
    assert get_estimator("rloo") is rloo_advantages
    assert get_estimator("drgrpo") is drgrpo_advantages
    assert get_estimator("gigpo") is gigpo_advantages
    assert get_estimator("turn_critic") is turn_gae
    assert get_estimator("gae") is gae
    # rloo = leave-one-out baseline (no std, as in the RLOO papers); drgrpo = no std
    r, g = [1.0, 2.0, 6.0], [0, 0, 0]
    np.testing.assert_array_equal(get_estimator("rloo")(r, g), grpo_advantages(r, g, leave_one_out=True, norm_by_std=False))
    np.testing.assert_array_equal(get_estimator("drgrpo")(r, g), grpo_advantages(r, g, norm_by_std=False))


def test_unknown_estimator_lists_known_names():
    with pytest.raises(ConfigError) as err:
        get_estimator("ppo2")
    msg = str(err.value)
    assert "'ppo2'" in msg
    for name in ("drgrpo", "gae", "gigpo", "grpo", "rloo", "turn_critic"):
        assert name in msg


def test_register_estimator():
    def centered(rewards, group_ids):
        return grpo_advantages(rewards, group_ids, norm_by_std=False)

    try:
        register_estimator("test_centered", centered)
        assert get_estimator("test_centered") is centered
        with pytest.raises(ConfigError, match="already registered"):
            register_estimator("test_centered", centered)
        register_estimator("test_centered", drgrpo_advantages, overwrite=True)
        assert get_estimator("test_centered") is drgrpo_advantages
    finally:
        ESTIMATORS.pop("test_centered", None)
    with pytest.raises(ConfigError, match="not callable"):
        register_estimator("x1", 3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="estimator name ''"):
        register_estimator("", centered)
