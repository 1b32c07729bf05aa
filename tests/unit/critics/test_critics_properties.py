"""Property tests (hypothesis): finite outputs, zero-sum groups, order invariance, agreement
with the loop references."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from critics import gae, gigpo_advantages, grpo_advantages
from critics_reference import gigpo_advantages_loop, grpo_advantages_loop

SETTINGS = settings(max_examples=60, deadline=None, derandomize=True, database=None)

finite_reward = st.floats(min_value=-1e3, max_value=1e3, allow_nan=False, allow_infinity=False)
# rewards drawn from a few values too, so equal-reward groups are common
reward = st.one_of(finite_reward, st.sampled_from([0.0, 1.0, 0.35]), st.none())
grpo_options = st.sampled_from(
    [
        {},
        {"norm_by_std": False},
        {"leave_one_out": True},
        {"leave_one_out": True, "norm_by_std": False},
        {"eps": 0.0},
    ]
)


@st.composite
def grpo_batch(draw):
    n = draw(st.integers(0, 24))
    rewards = draw(st.lists(reward, min_size=n, max_size=n))
    groups = draw(st.lists(st.sampled_from(["a", "b", "c", 3]), min_size=n, max_size=n))
    return rewards, groups


@st.composite
def gigpo_batch(draw):
    n = draw(st.integers(1, 8))
    rewards, anchors, groups = [], [], []
    for _ in range(n):
        t = draw(st.integers(1, 6))
        rewards.append(draw(st.lists(st.one_of(finite_reward, st.sampled_from([0.0, 1.0])), min_size=t, max_size=t)))
        anchors.append(draw(st.lists(st.sampled_from(["s0", "s1", "s2", 7]), min_size=t, max_size=t)))
        groups.append(draw(st.sampled_from(["g0", "g1"])))
    return rewards, anchors, groups


def _tol(values) -> float:
    flat = [abs(x) for x in values if x is not None]
    return 1e-9 * (1.0 + max(flat, default=0.0) * max(len(flat), 1))


@SETTINGS
@given(grpo_batch(), grpo_options)
def test_grpo_finite_zero_sum_and_matches_loop(batch, opts):
    rewards, groups = batch
    adv = grpo_advantages(rewards, groups, **opts)
    assert adv.shape == (len(rewards),) and np.all(np.isfinite(adv))
    valid = np.array([r is not None for r in rewards], dtype=bool)
    assert np.all(adv[~valid] == 0.0)
    scale = 1.0 if opts.get("norm_by_std", True) else max([abs(r) for r in rewards if r is not None] + [1.0])
    for g in set(groups):
        members = np.array([x == g and type(x) is type(g) for x in groups])
        assert abs(adv[members].sum()) <= 1e-9 * scale * max(members.sum(), 1)
    np.testing.assert_allclose(adv, grpo_advantages_loop(rewards, groups, **opts), rtol=1e-9, atol=1e-9 * scale)


@SETTINGS
@given(grpo_batch(), st.randoms(use_true_random=False), grpo_options)
def test_grpo_permutation_equivariance(batch, rnd, opts):
    rewards, groups = batch
    perm = list(range(len(rewards)))
    rnd.shuffle(perm)
    adv = grpo_advantages(rewards, groups, **opts)
    adv_p = grpo_advantages([rewards[i] for i in perm], [groups[i] for i in perm], **opts)
    np.testing.assert_allclose(adv_p, adv[perm], rtol=1e-9, atol=_tol(rewards))


@SETTINGS
@given(gigpo_batch(), st.sampled_from(["mean_norm", "mean_std_norm"]), st.sampled_from(["trajectory", "step"]))
def test_gigpo_finite_and_matches_loop(batch, mode, stats):
    rewards, anchors, groups = batch
    kw = dict(gamma=0.9, step_weight=0.5, mode=mode, episode_stats=stats)
    out = gigpo_advantages(rewards, anchors, groups, **kw)
    ref = gigpo_advantages_loop(rewards, anchors, groups, **kw)
    for a, b, r in zip(out, ref, rewards):
        assert a.shape == (len(r),) and np.all(np.isfinite(a))
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=_tol(r) * 10)


@SETTINGS
@given(gigpo_batch(), st.sampled_from(["trajectory", "step"]))
def test_gigpo_mean_norm_zero_sum_at_both_levels(batch, stats):
    rewards, anchors, groups = batch
    tol = _tol([x for r in rewards for x in r]) * 10
    kw = dict(gamma=0.8, mode="mean_norm", episode_stats=stats)
    episode = gigpo_advantages(rewards, anchors, groups, step_weight=0.0, **kw)
    full = gigpo_advantages(rewards, anchors, groups, step_weight=1.0, **kw)
    for g in set(groups):
        idx = [i for i, x in enumerate(groups) if x == g]
        if stats == "trajectory":  # one sample per trajectory
            assert abs(sum(episode[i][0] for i in idx)) <= tol
        else:  # one sample per step
            assert abs(sum(episode[i].sum() for i in idx)) <= tol
        # step level: A - A_E sums to 0 over every (group, anchor) step group
        for anchor in {a for i in idx for a in anchors[i]}:
            s = sum(
                full[i][t] - episode[i][t]
                for i in idx
                for t, a in enumerate(anchors[i])
                if a == anchor and type(a) is type(anchor)
            )
            assert abs(s) <= tol


@SETTINGS
@given(gigpo_batch(), st.randoms(use_true_random=False), st.sampled_from(["mean_norm", "mean_std_norm"]),
       st.sampled_from(["trajectory", "step"]))
def test_gigpo_trajectory_order_invariance(batch, rnd, mode, stats):
    rewards, anchors, groups = batch
    perm = list(range(len(rewards)))
    rnd.shuffle(perm)
    kw = dict(gamma=0.95, mode=mode, episode_stats=stats)
    out = gigpo_advantages(rewards, anchors, groups, **kw)
    out_p = gigpo_advantages([rewards[i] for i in perm], [anchors[i] for i in perm], [groups[i] for i in perm], **kw)
    tol = _tol([x for r in rewards for x in r]) * 10
    for k, i in enumerate(perm):
        np.testing.assert_allclose(out_p[k], out[i], rtol=1e-9, atol=tol)


@SETTINGS
@given(
    st.integers(1, 4).flatmap(
        lambda b: st.integers(1, 10).flatmap(
            lambda t: st.tuples(
                st.lists(st.lists(finite_reward, min_size=t, max_size=t), min_size=b, max_size=b),
                st.lists(st.lists(finite_reward, min_size=t, max_size=t), min_size=b, max_size=b),
                st.lists(st.lists(st.sampled_from([0, 1]), min_size=t, max_size=t), min_size=b, max_size=b),
            )
        )
    ),
    st.floats(0.0, 1.0),
    st.floats(0.0, 1.0),
)
def test_gae_finite_zero_off_mask_and_row_order(data, gamma, lam):
    r, v, m = (np.array(x, dtype=np.float64) for x in data)
    r = r * m
    adv, ret = gae(r, v, m, gamma=gamma, lam=lam)
    assert np.all(np.isfinite(adv)) and np.all(np.isfinite(ret))
    assert np.all(adv[m == 0] == 0.0) and np.all(ret[m == 0] == 0.0)
    np.testing.assert_allclose(ret[m == 1], (adv + v)[m == 1], rtol=1e-12, atol=1e-9)
    rev = slice(None, None, -1)
    adv_r, _ = gae(r[rev], v[rev], m[rev], gamma=gamma, lam=lam)
    np.testing.assert_array_equal(adv_r, adv[rev])
