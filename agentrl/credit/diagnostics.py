"""What an update's credit did, per update: how much of it is per-turn, whether it can move the
policy at all, and for GiGPO what its anchor-state step groups held. ``assign_credit`` adds
these to ``CreditResult.metrics`` (so to ``metrics.jsonl``); each is a pure function of the
credit's inputs and outputs.

* ``credit/turn_adv_differs_frac``: share of the update's turns (those in the loss) whose
  advantage differs from the mean advantage of its episode's turns (``|a_k - mean_k a| >
  TURN_TOL * max(1, max_k |a_k|)``). 0 for GRPO, which puts one number on every turn of an
  episode; above 0 only where an estimator credits turns of one episode differently.
* ``credit/multi_turn_frac``: share of those turns that belong to an episode of >= 2 turns in
  the loss (the ceiling of the line above).
* ``credit/zero_grad_update``: 1.0 when no loss token carries a non-zero advantage (nothing
  kept, or every advantage 0), so the policy-gradient term is exactly 0; else 0.0.
* ``gigpo/*`` (``algorithm.advantage: gigpo`` only; ``gigpo_step_metrics``): step groups (steps
  of one episode group that share an anchor, Feng et al. 2025, Eq. 6) and the step-level term
  ``omega * A_S`` of Eq. 8.

The critic's own fit is the critic trainer's ``critic/explained_variance`` (``1 - Var(R - V) /
Var(R)`` over the update's value positions, ``agentrl.trainer.critic_trainer``).
"""

from __future__ import annotations

from collections import Counter
from typing import Hashable, Mapping, Sequence

import numpy as np

import critics
from agentrl.types import TokenBatch

TURN_TOL = 1e-9
"""Relative tolerance under which two advantages of one episode count as the same."""


def turn_spread_metrics(turn_advantages: Mapping[str, Sequence[float | None]]) -> dict[str, float]:
    """``credit/turn_adv_differs_frac`` and ``credit/multi_turn_frac`` (module docstring).

    Args:
        turn_advantages: ``episode_id -> [K_i]`` per-turn advantage (``CreditResult.turn_advantages``;
            a token-level estimator's per-turn mean); ``None`` entries (turns left out of the loss)
            are skipped.

    Returns:
        Both shares in [0, 1]; 0.0 for both when no turn is in the loss.
    """
    turns = differs = multi = 0
    for adv in turn_advantages.values():
        a = np.asarray([x for x in adv if x is not None], dtype=np.float64)  # [K]
        turns += a.size
        if a.size < 2:
            continue
        multi += a.size
        tol = TURN_TOL * max(1.0, float(np.abs(a).max()))
        differs += int((np.abs(a - a.mean()) > tol).sum())
    return {"credit/turn_adv_differs_frac": differs / turns if turns else 0.0,
            "credit/multi_turn_frac": multi / turns if turns else 0.0}


def zero_grad_update(batch: TokenBatch | None) -> float:
    """1.0 when ``batch`` is ``None`` or no token with ``loss_mask`` 1 has a non-zero advantage; else 0.0."""
    if batch is None:
        return 1.0
    mask = np.asarray(batch.loss_mask, dtype=np.float64) > 0  # [T]
    return 0.0 if np.any(np.asarray(batch.advantages, dtype=np.float64)[mask] != 0.0) else 1.0


def gigpo_step_metrics(rewards: Sequence[Sequence[float]], anchors: Sequence[Sequence[Hashable]],
                       group_ids: Sequence[Hashable], params: critics.EstimatorParams) -> dict[str, float]:
    """GiGPO's step groups and step-level term, over every step of the update's episodes.

    Args:
        rewards: ``[N][K_i]`` the rewards GiGPO saw (finite).
        anchors: ``[N][K_i]`` the anchor before each step.
        group_ids: ``[N]`` episode-group keys.
        params: the estimator settings (``gamma``, ``gigpo_*``), as the update used them.

    Returns:
        ``gigpo/step_groups`` (distinct (episode group, anchor) pairs), ``gigpo/step_group_size_mean``
        (steps per step group, mean over groups), ``gigpo/step_group_size_max``,
        ``gigpo/steps_in_groups_ge2_frac`` (share of steps whose step group holds >= 2 steps: the only
        steps that can get a step-level advantage), ``gigpo/later_steps_in_groups_ge2_frac`` (the same
        over steps after an episode's first, whose group is not the shared start state by construction;
        0.0 when there is none), ``gigpo/step_adv_abs_mean`` (mean ``|omega * A_S|`` over steps),
        ``gigpo/step_adv_nonzero_frac`` (share of steps with ``omega * A_S != 0``) and
        ``gigpo/episode_adv_abs_mean`` (mean ``|A_E|`` over steps, the scale to compare the step term
        with). All 0.0 when there is no step.
    """
    keys = [(g, a) for g, anc in zip(group_ids, anchors) for a in anc]  # [S]
    if not keys:
        return {k: 0.0 for k in ("gigpo/step_groups", "gigpo/step_group_size_mean", "gigpo/step_group_size_max",
                                 "gigpo/steps_in_groups_ge2_frac", "gigpo/later_steps_in_groups_ge2_frac",
                                 "gigpo/step_adv_abs_mean", "gigpo/step_adv_nonzero_frac",
                                 "gigpo/episode_adv_abs_mean")}
    size = Counter(keys)
    in_ge2 = np.asarray([size[k] >= 2 for k in keys], dtype=bool)  # [S]
    later = np.asarray([t > 0 for anc in anchors for t in range(len(anc))], dtype=bool)  # [S]
    kw = dict(gamma=params.gamma, mode=params.gigpo_mode, episode_stats=params.gigpo_episode_stats)
    full = np.concatenate(critics.gigpo_advantages(rewards, anchors, group_ids,
                                                   step_weight=params.gigpo_step_weight, **kw))  # [S]
    episode = np.concatenate(critics.gigpo_advantages(rewards, anchors, group_ids, step_weight=0.0, **kw))  # [S]
    step = full - episode  # [S] omega * A_S
    tol = TURN_TOL * max(1.0, float(np.abs(full).max()))
    counts = np.asarray(list(size.values()), dtype=np.float64)
    return {
        "gigpo/step_groups": float(len(size)),
        "gigpo/step_group_size_mean": float(counts.mean()),
        "gigpo/step_group_size_max": float(counts.max()),
        "gigpo/steps_in_groups_ge2_frac": float(in_ge2.mean()),
        "gigpo/later_steps_in_groups_ge2_frac": float(in_ge2[later].mean()) if later.any() else 0.0,
        "gigpo/step_adv_abs_mean": float(np.abs(step).mean()),
        "gigpo/step_adv_nonzero_frac": float((np.abs(step) > tol).mean()),
        "gigpo/episode_adv_abs_mean": float(np.abs(episode).mean()),
    }
