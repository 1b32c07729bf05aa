"""DAPO dynamic sampling and overlong penalty; the estimator registry."""

from __future__ import annotations

import numpy as np
import pytest

from agentrl.errors import ConfigError, ContractError
from critics import (
    ESTIMATORS,
    EstimatorParams,
    drgrpo_advantages,
    dynamic_sampling_keep,
    estimator_names,
    get_estimator,
    gigpo_advantages,
    grpo_advantages,
    overlong_penalty,
    register_estimator,
    token_critic_advantages,
    turn_critic_advantages,
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


def test_registry_names_levels_and_functions():
    assert set(ESTIMATORS) >= {"grpo", "rloo", "drgrpo", "gigpo", "turn_critic", "gae"}
    assert {n: (get_estimator(n).level, get_estimator(n).needs_values)
            for n in ("grpo", "rloo", "drgrpo", "gigpo", "turn_critic", "gae")} == {
        "grpo": ("turn", False), "rloo": ("turn", False), "drgrpo": ("turn", False), "gigpo": ("turn", False),
        "turn_critic": ("turn", True), "gae": ("token", True)}
    assert estimator_names() == sorted(ESTIMATORS)
    # every built-in is the documented function under the turn-level signature
    rewards, anchors, groups = [[1.0], [2.0, 0.0], [6.0]], [["a"], ["a", "b"], ["a"]], ["g", "g", "g"]
    p = EstimatorParams(gamma=0.9, lam=0.8, token_gamma=0.7, token_lam=0.6, norm_by_std=True)
    totals = [1.0, 2.0, 6.0]
    for name, want in (("grpo", grpo_advantages(totals, groups)),
                       ("rloo", grpo_advantages(totals, groups, leave_one_out=True, norm_by_std=False)),
                       ("drgrpo", grpo_advantages(totals, groups, norm_by_std=False))):
        got = get_estimator(name).fn(rewards, anchors, groups, None, p)
        assert got == [[want[0]], [want[1]] * 2, [want[2]]], name
    # grpo follows norm_by_std; rloo and drgrpo never divide by the std
    unnormed = get_estimator("grpo").fn(rewards, anchors, groups, None, EstimatorParams(norm_by_std=False))
    assert [a[0] for a in unnormed] == list(drgrpo_advantages(totals, groups))
    for got, want in zip(get_estimator("gigpo").fn(rewards, anchors, groups, None, p),
                         gigpo_advantages(rewards, anchors, groups, gamma=0.9)):
        np.testing.assert_array_equal(got, want)
    values = [np.array([0.5]), np.array([0.1, 0.2]), np.array([0.0])]
    adv, ret = get_estimator("turn_critic").fn(rewards, anchors, groups, values, p)
    want_adv, want_ret = turn_critic_advantages(rewards, values, gamma=0.9, lam=0.8)
    for a, b in zip(adv + ret, want_adv + want_ret):
        np.testing.assert_array_equal(a, b)
    counts = [[2], [1, 2], [1]]
    tok_values = [np.zeros(2), np.array([0.1, 0.2, 0.3]), np.zeros(1)]
    adv, ret = get_estimator("gae").fn(rewards, anchors, groups, tok_values, counts, p)
    want_adv, want_ret = token_critic_advantages(counts, rewards, tok_values, gamma=0.7, lam=0.6)
    for a, b in zip(adv + ret, want_adv + want_ret):
        np.testing.assert_array_equal(a, b)


def test_unknown_estimator_lists_known_names_and_suggests_close_ones():
    with pytest.raises(ConfigError) as err:
        get_estimator("ppo2")
    msg = str(err.value)
    assert "'ppo2'" in msg
    for name in ("drgrpo", "gae", "gigpo", "grpo", "rloo", "turn_critic"):
        assert f"'{name}'" in msg
    with pytest.raises(ConfigError, match="unknown advantage estimator 'grpoo'; did you mean 'grpo'"):
        get_estimator("grpoo")


def test_register_estimator():
    def centered(rewards, anchors, group_ids, values, params):
        return [[0.0] * len(r) for r in rewards]

    try:
        assert register_estimator("test_centered", centered) is centered
        reg = get_estimator("test_centered")
        assert (reg.name, reg.fn, reg.level, reg.needs_values) == ("test_centered", centered, "turn", False)
        with pytest.raises(ConfigError, match="already registered"):
            register_estimator("test_centered", centered)
        with pytest.raises(ConfigError, match=r"estimator 'test_centered' \(level='token'\) has signature "
                                              r"test_centered\(rewards, anchors, group_ids, values, params\)"):
            register_estimator("test_centered", centered, level="token", overwrite=True)  # a turn signature
        assert get_estimator("test_centered").fn is centered  # the rejected one replaced nothing

        def centered_tokens(rewards, anchors, group_ids, values, turn_token_counts, params):
            return [[0.0] * sum(c) for c in turn_token_counts], [[0.0] * sum(c) for c in turn_token_counts]

        register_estimator("test_centered", centered_tokens, level="token", needs_values=True, overwrite=True)
        assert get_estimator("test_centered").level == "token" and get_estimator("test_centered").needs_values

        @register_estimator("test_decorated", level="token")
        def decorated(rewards, anchors, group_ids, values, turn_token_counts, params):
            return [[0.0] * sum(c) for c in turn_token_counts]

        assert get_estimator("test_decorated").fn is decorated and get_estimator("test_decorated").level == "token"
    finally:
        ESTIMATORS.pop("test_centered", None)
        ESTIMATORS.pop("test_decorated", None)
    with pytest.raises(ConfigError, match="not callable"):
        register_estimator("x1", 3)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="estimator name ''"):
        register_estimator("", centered)
    with pytest.raises(ConfigError, match="estimator 'x2': level='episode'; expected 'turn' or 'token'"):
        register_estimator("x2", centered, level="episode")
    assert "x1" not in ESTIMATORS and "x2" not in ESTIMATORS
