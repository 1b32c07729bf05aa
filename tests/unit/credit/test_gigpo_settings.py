"""``algorithm.gigpo``: GiGPO's step weight omega, normalisation mode and episode statistics
(Feng et al. 2025, Eq. 3, 7, 8) set from the run config reach the estimator through
``assign_credit``, and change the advantages as the paper's formula says."""

from __future__ import annotations

import numpy as np
import pytest

import critics
from agentrl.config import AlgorithmConfig, load_config
from agentrl.credit import assign_credit
from agentrl.errors import ConfigError
from agentrl.types import Episode, SamplingRecord, TerminationReason, Turn

# One episode group of three trajectories (gamma = 1, so a step's return is the sum of the
# rewards from it on): anchors s0 (all three), s1 (T1, T2), s2 (T2 alone).
REWARDS = {"T1": [0.0, 1.0], "T2": [0.0, 0.0, 0.0], "T3": [1.0]}
ANCHORS = {"T1": ["s0", "s1"], "T2": ["s0", "s1", "s2"], "T3": ["s0"]}


def _episodes() -> list[Episode]:
    out = []
    for name, rewards in REWARDS.items():
        ep = Episode(group_id="g", env_id="e", task_id="t", seed=0, episode_id=name, terminated=True,
                     termination_reason=TerminationReason.ENV_TERMINATED)
        for r, a in zip(rewards, ANCHORS[name]):
            ep.turns.append(Turn(prompt_ids=[1, 2], completion_ids=[5, 6], behavior_log_probs=[-0.5, -0.5],
                                 reward=r, anchor=a))
        out.append(ep)
    return out


def _normalise(x: float, samples: list[float], mode: str) -> float:
    """``(x - mean) / F`` over ``samples``; F = 1 (mean_norm) or the unbiased std + 1e-6
    (mean_std_norm); 0 for a group of one or of equal values."""
    s = np.asarray(samples, dtype=np.float64)
    if s.size < 2 or np.ptp(s) == 0:
        return 0.0
    f = 1.0 if mode == "mean_norm" else float(s.std(ddof=1)) + 1e-6
    return (x - float(s.mean())) / f


def _paper(step_weight: float, mode: str, episode_stats: str) -> dict[str, list[float]]:
    """GiGPO by its equations, written out for this group."""
    totals = {n: sum(r) for n, r in REWARDS.items()}  # Eq. 3: R(i), undiscounted
    ep_samples = [totals[n] for n in REWARDS for _ in (REWARDS[n] if episode_stats == "step" else [0])]
    returns = {n: [sum(r[t:]) for t in range(len(r))] for n, r in REWARDS.items()}  # Eq. 5, gamma 1
    out = {}
    for n in REWARDS:
        a_e = _normalise(totals[n], ep_samples, mode)
        adv = []
        for t, anchor in enumerate(ANCHORS[n]):
            group = [returns[m][s] for m in REWARDS for s, b in enumerate(ANCHORS[m]) if b == anchor]  # Eq. 6
            adv.append(a_e + step_weight * _normalise(returns[n][t], group, mode))  # Eq. 7, 8
        out[n] = adv
    return out


@pytest.mark.parametrize("mode", ["mean_norm", "mean_std_norm"])
@pytest.mark.parametrize("episode_stats", ["trajectory", "step"])
@pytest.mark.parametrize("step_weight", [0.0, 0.5, 1.0, 2.0])
def test_config_settings_give_the_papers_advantages(step_weight, mode, episode_stats):
    cfg = load_config(None, ["algorithm.advantage=gigpo", "algorithm.gamma=1.0",
                             f"algorithm.gigpo.step_weight={step_weight}", f"algorithm.gigpo.mode={mode}",
                             f"algorithm.gigpo.episode_stats={episode_stats}"]).algorithm
    res = assign_credit(_episodes(), cfg, SamplingRecord())
    want = _paper(step_weight, mode, episode_stats)
    for name in REWARDS:
        assert res.turn_advantages[name] == pytest.approx(want[name], abs=1e-12), name


def test_the_step_weight_scales_the_step_level_part_only():
    # mean_norm, trajectory stats: A_E = R - 2/3 = (1/3, -2/3, 1/3); step groups s0 (returns 1, 0, 1),
    # s1 (1, 0), s2 (0 alone): A_S = T1 (1/3, 1/2), T2 (-2/3, -1/2, 0), T3 (1/3).
    def adv(omega: float) -> dict[str, list[float]]:
        cfg = AlgorithmConfig(advantage="gigpo", gamma=1.0, gigpo={"step_weight": omega})
        return assign_credit(_episodes(), cfg, SamplingRecord()).turn_advantages

    half, one = adv(0.5), adv(1.0)
    assert one["T1"] == pytest.approx([1 / 3 + 1 / 3, 1 / 3 + 1 / 2], abs=1e-12)
    assert half["T1"] == pytest.approx([1 / 3 + 0.5 / 3, 1 / 3 + 0.25], abs=1e-12)
    assert half["T2"] == pytest.approx([-2 / 3 - 1 / 3, -2 / 3 - 0.25, -2 / 3], abs=1e-12)
    assert adv(0.0)["T3"] == pytest.approx([1 / 3], abs=1e-12)


def test_the_defaults_are_the_estimators_own():
    cfg = AlgorithmConfig(advantage="gigpo", gamma=1.0)
    assert (cfg.gigpo.step_weight, cfg.gigpo.mode, cfg.gigpo.episode_stats) == (1.0, "mean_norm", "trajectory")
    res = assign_credit(_episodes(), cfg, SamplingRecord())
    want = critics.gigpo_advantages(list(REWARDS.values()), list(ANCHORS.values()), ["g"] * 3, gamma=1.0)
    for name, w in zip(REWARDS, want):
        assert res.turn_advantages[name] == pytest.approx(list(w), abs=1e-12)


def test_the_config_offers_exactly_the_estimators_modes():
    from critics.gigpo import EPISODE_STATS, GIGPO_MODES
    from typing import get_args

    from agentrl.config import GiGPOSection

    assert get_args(GiGPOSection.model_fields["mode"].annotation) == GIGPO_MODES
    assert get_args(GiGPOSection.model_fields["episode_stats"].annotation) == EPISODE_STATS


@pytest.mark.parametrize("override, match", [
    ("algorithm.gigpo.step_weight=-0.5", r"algorithm\.gigpo\.step_weight=-0\.5: .*greater than or equal to 0"),
    ("algorithm.gigpo.step_weight=.inf", r"algorithm\.gigpo\.step_weight=inf: .*finite"),
    ("algorithm.gigpo.mode=std_norm", r"algorithm\.gigpo\.mode='std_norm': .*'mean_norm' or 'mean_std_norm'"),
    ("algorithm.gigpo.episode_stats=token", r"algorithm\.gigpo\.episode_stats='token': .*'trajectory' or 'step'"),
    ("algorithm.gigpo.omega=1", r"unknown key 'algorithm\.gigpo\.omega'; section 'algorithm\.gigpo' has: step_weight"),
])
def test_bad_settings_are_config_errors_naming_the_key_and_value(override, match):
    with pytest.raises(ConfigError, match=match):
        load_config(None, ["algorithm.advantage=gigpo", override])
