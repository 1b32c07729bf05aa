"""GiGPO (Feng et al. 2025): hand-computed values, options, inputs, errors, loop reference."""

from __future__ import annotations

import difflib
import math

import numpy as np
import pytest
import torch

from agentrl.errors import ConfigError, ContractError
from critics import gigpo_advantages
from critics.gigpo import discounted_returns
from critics_reference import gigpo_advantages_loop

E = 1e-6  # GiGPO's epsilon in mean_std_norm

# Two episode groups, gamma = 0.5. Three trajectories of group "A" revisit states at
# different time steps (s1 twice inside trajectory 2; s2 at t=2 and t=1); s3 is a singleton
# anchor; group "B" reuses the names s0/s1, which must not mix with group "A".
#
#   traj  group  anchors            rewards     discounted R_t (Eq. 5)     total (Eq. 3)
#   0     A      s0 s1 s2           0 0 1       0.25 0.5 1                 1
#   1     A      s0 s2              0 1         0.5 1                      1
#   2     A      s0 s1 s1 s3        0 0 0 0     0 0 0 0                    0
#   3     B      s0 s1              0 1         0.5 1                      1
#   4     B      s0                 0           0                          0
REWARDS = [[0, 0, 1], [0, 1], [0, 0, 0, 0], [0, 1], [0]]
ANCHORS = [["s0", "s1", "s2"], ["s0", "s2"], ["s0", "s1", "s1", "s3"], ["s0", "s1"], ["s0"]]
GROUPS = ["A", "A", "A", "B", "B"]
GAMMA = 0.5

# Step groups (Eq. 6) and their returns:
#   A/s0: 0.25 (0,0), 0.5 (1,0), 0 (2,0)   mean 0.25 -> dev 0, +0.25, -0.25
#         unbiased var = (0 + 0.0625 + 0.0625) / 2 = 0.0625 -> std 0.25
#   A/s1: 0.5 (0,1), 0 (2,1), 0 (2,2)      mean 1/6 -> dev 1/3, -1/6, -1/6
#         var = (1/9 + 1/36 + 1/36) / 2 = 1/12 -> std sqrt(1/12)
#   A/s2: 1 (0,2), 1 (1,1)                 all equal -> 0
#   A/s3: 0 (2,3)                          singleton -> 0
#   B/s0: 0.5 (3,0), 0 (4,0)               mean 0.25 -> dev +0.25, -0.25; var 0.125 / 1
#   B/s1: 1 (3,1)                          singleton -> 0
S_A0, S_A1, S_B0 = 0.25, math.sqrt(1 / 12), math.sqrt(0.125)


def step_adv(std: bool) -> list[list[float]]:
    fa0 = 1 / (S_A0 + E) if std else 1.0
    fa1 = 1 / (S_A1 + E) if std else 1.0
    fb0 = 1 / (S_B0 + E) if std else 1.0
    return [
        [0.0, (1 / 3) * fa1, 0.0],
        [0.25 * fa0, 0.0],
        [-0.25 * fa0, (-1 / 6) * fa1, (-1 / 6) * fa1, 0.0],
        [0.25 * fb0, 0.0],
        [-0.25 * fb0],
    ]


def episode_adv(std: bool, stats: str) -> list[float]:
    if stats == "trajectory":
        # A: totals 1, 1, 0 -> mean 2/3 -> dev 1/3, 1/3, -2/3; var = (1/9+1/9+4/9)/2 = 1/3
        # B: totals 1, 0   -> mean 1/2 -> dev 1/2, -1/2;     var = (1/4+1/4)/1 = 1/2
        fa = 1 / (math.sqrt(1 / 3) + E) if std else 1.0
        fb = 1 / (math.sqrt(1 / 2) + E) if std else 1.0
        return [(1 / 3) * fa, (1 / 3) * fa, (-2 / 3) * fa, 0.5 * fb, -0.5 * fb]
    # "step": each total repeated once per step.
    # A: 1 x3, 1 x2, 0 x4 (9 samples) -> mean 5/9 -> dev 4/9 (x5), -5/9 (x4)
    #    ss = 5 * 16/81 + 4 * 25/81 = 20/9; var = (20/9) / 8 = 5/18
    # B: 1 x2, 0 x1 (3 samples) -> mean 2/3 -> dev 1/3 (x2), -2/3; ss = 2/3; var = 1/3
    fa = 1 / (math.sqrt(5 / 18) + E) if std else 1.0
    fb = 1 / (math.sqrt(1 / 3) + E) if std else 1.0
    return [(4 / 9) * fa, (4 / 9) * fa, (-5 / 9) * fa, (1 / 3) * fb, (-2 / 3) * fb]


@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
@pytest.mark.parametrize("stats", ["trajectory", "step"])
def test_known_values_revisits_and_singletons(mode, stats):
    std = mode == "mean_std_norm"
    out = gigpo_advantages(REWARDS, ANCHORS, GROUPS, gamma=GAMMA, mode=mode, episode_stats=stats)
    a_e, a_s = episode_adv(std, stats), step_adv(std)
    assert len(out) == 5
    for i, adv in enumerate(out):
        assert adv.dtype == np.float64 and adv.shape == (len(REWARDS[i]),)
        expected = [a_e[i] + 1.0 * s for s in a_s[i]]  # Eq. 8, step_weight 1
        np.testing.assert_allclose(adv, expected, rtol=0, atol=1e-12)


def test_mean_norm_trajectory_values_spelled_out():
    # The same case as above, mean_norm / trajectory, the sums written out:
    # traj 0: A_E 1/3 + A_S (0, 1/3, 0)           = 1/3, 2/3, 1/3
    # traj 1: A_E 1/3 + A_S (0.25, 0)             = 7/12, 1/3
    # traj 2: A_E -2/3 + A_S (-0.25, -1/6, -1/6, 0) = -11/12, -5/6, -5/6, -2/3
    # traj 3: A_E 1/2 + A_S (0.25, 0)             = 3/4, 1/2
    # traj 4: A_E -1/2 + A_S (-0.25)              = -3/4
    out = gigpo_advantages(REWARDS, ANCHORS, GROUPS, gamma=GAMMA)
    expected = [[1 / 3, 2 / 3, 1 / 3], [7 / 12, 1 / 3], [-11 / 12, -5 / 6, -5 / 6, -2 / 3], [0.75, 0.5], [-0.75]]
    for adv, exp in zip(out, expected):
        np.testing.assert_allclose(adv, exp, rtol=0, atol=1e-12)


def test_step_weight_scales_only_the_step_part():
    base = gigpo_advantages(REWARDS, ANCHORS, GROUPS, gamma=GAMMA, step_weight=0.0)
    a_e = episode_adv(False, "trajectory")
    for i, adv in enumerate(base):
        np.testing.assert_allclose(adv, [a_e[i]] * len(REWARDS[i]), atol=1e-12)
    doubled = gigpo_advantages(REWARDS, ANCHORS, GROUPS, gamma=GAMMA, step_weight=2.0)
    a_s = step_adv(False)
    for i, adv in enumerate(doubled):
        np.testing.assert_allclose(adv, [a_e[i] + 2.0 * s for s in a_s[i]], atol=1e-12)


def test_episode_stats_step_matches_torch_std_like_verl_agent():
    # verl-agent (compute_mean_std_cross_steps=True): each step row carries its
    # trajectory's total; mean and torch.std (unbiased) over those rows; (x - m)/(s + 1e-6).
    rows = torch.tensor([1.0] * 3 + [1.0] * 2 + [0.0] * 4, dtype=torch.float64)
    m, s = rows.mean(), rows.std()
    expected_first = float((1.0 - m) / (s + 1e-6))
    out = gigpo_advantages(REWARDS[:3], ANCHORS[:3], GROUPS[:3], gamma=GAMMA, step_weight=0.0,
                           mode="mean_std_norm", episode_stats="step")
    np.testing.assert_allclose(out[0], [expected_first] * 3, rtol=0, atol=1e-12)


def test_singleton_episode_group_gives_zero():
    # one trajectory alone in its group, all anchors distinct: 0 at both levels
    # (verl-agent would return the raw total 3.0 at the episode level here)
    out = gigpo_advantages([[1.0, 2.0]], [["x", "y"]], ["solo"], mode="mean_std_norm")
    assert out[0].tolist() == [0.0, 0.0]


def test_discounted_returns_ragged():
    # gamma 0.5: [1, 2, 4] -> R2 = 4, R1 = 2 + 2 = 4, R0 = 1 + 2 = 3 ; [] ; [5] -> 5
    r = np.array([1.0, 2.0, 4.0, 5.0])
    out = discounted_returns(r, np.array([3, 0, 1]), 0.5)
    np.testing.assert_array_equal(out, [3.0, 4.0, 4.0, 5.0])


def test_failed_trajectory_is_excluded_everywhere():
    # adding a trajectory with a missing reward to group A changes nothing for the others
    rewards = REWARDS + [[0, None, 1]]
    anchors = ANCHORS + [["s0", "s1", "s2"]]
    groups = GROUPS + ["A"]
    for stats in ("trajectory", "step"):
        ref = gigpo_advantages(REWARDS, ANCHORS, GROUPS, gamma=GAMMA, mode="mean_std_norm", episode_stats=stats)
        out = gigpo_advantages(rewards, anchors, groups, gamma=GAMMA, mode="mean_std_norm", episode_stats=stats)
        assert out[-1].tolist() == [0.0, 0.0, 0.0]
        for a, b in zip(out[:-1], ref):
            np.testing.assert_array_equal(a, b)
    # an empty trajectory gets an empty array and does not count either
    out = gigpo_advantages(REWARDS + [[]], ANCHORS + [[]], GROUPS + ["A"], gamma=GAMMA)
    assert out[-1].shape == (0,)
    for a, b in zip(out[:-1], gigpo_advantages(REWARDS, ANCHORS, GROUPS, gamma=GAMMA)):
        np.testing.assert_array_equal(a, b)


def test_similarity_threshold_clusters_text_anchors():
    # "the cat sat" (11 chars) vs "the cat sat." (12): 11 matching -> ratio 2*11/23 = 0.9565
    assert difflib.SequenceMatcher(None, "the cat sat.", "the cat sat").ratio() == pytest.approx(22 / 23)
    rewards, anchors, groups = [[1.0], [0.0]], [["the cat sat"], ["the cat sat."]], ["g", "g"]
    # exact anchors: two singleton step groups -> A = A_E = +-0.5
    exact = gigpo_advantages(rewards, anchors, groups)
    assert [a.tolist() for a in exact] == [[0.5], [-0.5]]
    # clustered at 0.95: one step group with returns 1, 0 -> A_S = +-0.5 -> A = +-1
    close = gigpo_advantages(rewards, anchors, groups, similarity_threshold=0.95)
    assert [a.tolist() for a in close] == [[1.0], [-1.0]]
    # 0.96 > 22/23: not clustered
    far = gigpo_advantages(rewards, anchors, groups, similarity_threshold=0.96)
    assert [a.tolist() for a in far] == [[0.5], [-0.5]]


def test_similarity_clustering_is_greedy_against_first_member():
    # sorted: "aaaa", "aaab", "aabb". ratio(aaab, aaaa) = 2*3/8 = 0.75 -> joins;
    # ratio(aabb, aaaa) = 2*2/8 = 0.5 -> new cluster (although ratio(aabb, aaab) = 0.75).
    # Three trajectories, one step each, returns 1, 0, 1; step_weight isolates A_S:
    # cluster {aaaa: 1, aaab: 0} -> +-0.5; {aabb} singleton -> 0.
    rewards = [[1.0], [0.0], [1.0]]
    anchors = [["aaaa"], ["aaab"], ["aabb"]]
    full = gigpo_advantages(rewards, anchors, ["g"] * 3, similarity_threshold=0.7)
    episode = gigpo_advantages(rewards, anchors, ["g"] * 3, similarity_threshold=0.7, step_weight=0.0)
    a_s = [float(f[0] - e[0]) for f, e in zip(full, episode)]
    assert a_s == pytest.approx([0.5, -0.5, 0.0], abs=1e-12)
    # only within an episode group: the same texts in two groups never share a step group
    split = gigpo_advantages(rewards[:2], anchors[:2], ["g1", "g2"], similarity_threshold=0.7)
    assert [a.tolist() for a in split] == [[0.0], [0.0]]


def test_similarity_needs_text_anchors():
    with pytest.raises(ContractError, match="not text"):
        gigpo_advantages([[1.0], [0.0]], [[1], [2]], ["g", "g"], similarity_threshold=0.9)


def test_input_layouts_agree():
    rng = np.random.default_rng(0)
    r = rng.random((6, 5))
    a = rng.integers(0, 3, size=(6, 5))
    g = np.repeat([10, 20], 3)
    ref = gigpo_advantages(r.tolist(), a.tolist(), g.tolist(), mode="mean_std_norm")
    variants = [
        (r, a, g),  # 2-D numpy
        (torch.tensor(r), torch.tensor(a), torch.tensor(g)),  # 2-D torch
        (list(r), list(a), list(g)),  # list of 1-D arrays
        ([torch.tensor(x) for x in r], [[f"s{v}" for v in row] for row in a.tolist()], [str(x) for x in g]),
    ]
    for rr, aa, gg in variants:
        out = gigpo_advantages(rr, aa, gg, mode="mean_std_norm")
        np.testing.assert_allclose(np.asarray(out), np.asarray(ref), rtol=0, atol=1e-12)
    assert np.asarray(ref).shape == (6, 5)


def test_contract_errors_name_the_lengths():
    with pytest.raises(ContractError, match="step_rewards has 2 trajectories, anchors 2, group_ids 3"):
        gigpo_advantages([[1], [2]], [["a"], ["b"]], ["g", "g", "g"])
    with pytest.raises(ContractError, match="trajectory 1 has 2 step_rewards but 1 anchors"):
        gigpo_advantages([[1], [2, 3]], [["a"], ["b"]], ["g", "g"])
    with pytest.raises(ContractError, match="not hashable"):
        gigpo_advantages([[1], [2]], [[["a"]], [["b"]]], ["g", "g"])
    with pytest.raises(ContractError, match="not a sequence"):
        gigpo_advantages([[1], [2]], ["ab", "cd"], ["g", "g"])


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"mode": "std"}, "mode='std'; expected one of mean_norm, mean_std_norm"),
        ({"episode_stats": "token"}, "episode_stats='token'"),
        ({"gamma": 1.5}, "gamma=1.5"),
        ({"similarity_threshold": 0.0}, "similarity_threshold=0.0"),
        ({"similarity_threshold": 1.2}, "similarity_threshold=1.2"),
        ({"step_weight": float("nan")}, "step_weight=nan"),
    ],
)
def test_config_errors(kwargs, match):
    with pytest.raises(ConfigError, match=match):
        gigpo_advantages([[1.0]], [["a"]], ["g"], **kwargs)


def test_empty_batch():
    assert gigpo_advantages([], [], []) == []


def _random_case(rng, *, text: bool):
    n_groups = int(rng.integers(1, 4))
    rewards, anchors, groups = [], [], []
    for g in range(n_groups):
        for _ in range(int(rng.integers(1, 5))):
            t = int(rng.integers(1, 7))
            rewards.append([float(x) for x in rng.choice([0.0, 0.0, 1.0, -0.5, 2.0], size=t)])
            states = rng.integers(0, 4, size=t)
            anchors.append([f"room {s} with a lamp" if text else int(s) for s in states])
            groups.append(f"task{g}")
    if rng.random() < 0.3:  # a failed trajectory
        rewards[int(rng.integers(len(rewards)))][0] = None
    return rewards, anchors, groups


def test_matches_loop_reference_on_random_inputs():
    rng = np.random.default_rng(7)
    for case in range(30):
        text = case % 3 == 0
        rewards, anchors, groups = _random_case(rng, text=text)
        for mode in ("mean_norm", "mean_std_norm"):
            for stats in ("trajectory", "step"):
                # "room 0 with a lamp" vs "room 1 ...": ratio 34/36 = 0.944, so 0.9
                # merges the rooms of a group and 0.97 keeps them apart
                threshold = (0.9 if case % 2 else 0.97) if text else None
                kw = dict(gamma=0.9, step_weight=0.7, mode=mode, episode_stats=stats,
                          similarity_threshold=threshold)
                fast = gigpo_advantages(rewards, anchors, groups, **kw)
                slow = gigpo_advantages_loop(rewards, anchors, groups, **kw)
                assert len(fast) == len(slow)
                for a, b in zip(fast, slow):
                    np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-10)
