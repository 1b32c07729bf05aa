"""Group-relative outcome advantages: GRPO, RLOO, Dr. GRPO.

One scalar reward per sample (an episode or a completion); samples of the same task
instance and seed share a ``group_id`` (``Episode.group_id``). The advantage of a sample is
its reward minus a baseline computed from its group, optionally scaled by the group's std.
The trainer broadcasts it onto the sample's sampled tokens (``agentrl.types.broadcast_turn_values``).

Missing rewards (reward errors). A reward that is ``None``, NaN or ±inf marks a failed
sample (the reward function raised, or an infrastructure error; docs/cases.md, C12): such a sample is
*never* scored 0 for the statistics. It is excluded: its group's mean and std are computed
over the group's valid samples only, its own advantage is 0.0, and
``valid_reward_mask(rewards)`` tells the caller which samples they were so it can drop them
from the loss and count them. Other groups are not affected at all.
"""

from __future__ import annotations

from typing import Any, Hashable, Sequence

import numpy as np

from critics._common import (
    as_float_vector,
    check_eps,
    check_same_length,
    factorize,
    group_normalize,
)


def valid_reward_mask(rewards: Sequence[float | None] | Any) -> np.ndarray:
    """Which rewards are usable.

    Args:
        rewards: ``[N]`` numbers, ``None`` or NaN for a failed sample (list, numpy array or
            torch tensor).

    Returns:
        ``[N]`` bool numpy array: True where the reward is a finite number. Samples with
        False get advantage 0.0 from ``grpo_advantages`` and must be excluded from the
        loss and counted as reward errors (docs/design.md; docs/cases.md, C12).

    Raises:
        ContractError: an element is not a number (e.g. a string) or ``rewards`` is not 1-D.
    """
    return np.isfinite(as_float_vector(rewards, "rewards", allow_missing=True))


def grpo_advantages(
    rewards: Sequence[float | None] | Any,
    group_ids: Sequence[Hashable] | Any,
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    leave_one_out: bool = False,
) -> np.ndarray:
    """Group-relative outcome advantages (GRPO; RLOO and Dr. GRPO as options).

    For the valid samples ``i`` of a group ``g`` with ``n`` valid rewards, mean ``m`` and
    unbiased std ``s`` (ddof=1):

    * baseline (GRPO, Shao et al. 2024, DeepSeekMath §4.1.2): ``A_i = r_i - m``;
    * ``leave_one_out=True`` (RLOO, Kool et al. 2019; Ahmadian et al. 2024 §3):
      ``A_i = r_i - mean_{j != i} r_j = n/(n-1) * (r_i - m)``;
    * ``norm_by_std=True`` divides the above by ``s + eps`` (GRPO's default);
      ``norm_by_std=False`` is Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like
      Training", §3.1), which drops the std to remove its difficulty bias.

    Edge cases (docs/design.md invariant 6; docs/cases.md, C05): a group with one valid sample, or whose
    valid rewards are all equal, gets exactly 0.0 for every sample. "All equal" is decided
    before any division and tolerates float noise (spread <= 1e-12 x the largest |reward|,
    so ``[0.1 + 0.2, 0.3]`` counts as equal); a tiny std from float error can therefore
    never blow up. Outputs are always finite.

    Missing rewards (docs/cases.md, C12): ``None``/NaN/inf rewards are excluded from their group's
    statistics and get 0.0; see ``valid_reward_mask``. Other groups are unaffected.

    Args:
        rewards: ``[N]`` real numbers (list, numpy array or torch tensor, any float/int
            dtype); ``None``/NaN for failed samples.
        group_ids: ``[N]`` hashable group keys (``Episode.group_id``: str or int). Groups are
            keyed by this id only, never by prompt text.
        norm_by_std: divide by the group std (+ ``eps``).
        eps: added to the std; finite, >= 0.
        leave_one_out: use the leave-one-out mean as baseline (RLOO).

    Returns:
        ``[N]`` float64 numpy array of advantages.

    Raises:
        ContractError: ``len(rewards) != len(group_ids)`` (the message names both lengths),
            a reward that is not a number, or an unhashable group id.
        ConfigError: ``eps`` negative or not finite.
    """
    eps = check_eps(eps)
    r = as_float_vector(rewards, "rewards", allow_missing=True)  # [N]
    codes, n_groups, _ = factorize(group_ids, "group_ids")  # [N]
    check_same_length(r.shape[0], "rewards", codes.shape[0], "group_ids", "sample")
    valid = np.isfinite(r)  # [N]
    adv = np.zeros(r.shape[0], dtype=np.float64)
    adv[valid] = group_normalize(
        r[valid], codes[valid], n_groups, use_std=bool(norm_by_std), eps=eps,
        leave_one_out=bool(leave_one_out),
    )
    return adv


def rloo_advantages(
    rewards: Sequence[float | None] | Any,
    group_ids: Sequence[Hashable] | Any,
    *,
    norm_by_std: bool = False,
    eps: float = 1e-6,
) -> np.ndarray:
    """RLOO advantages: ``grpo_advantages(..., leave_one_out=True, norm_by_std=False)``.

    ``A_i = r_i - mean_{j != i} r_j`` (Kool et al. 2019; Ahmadian et al. 2024 §3), without
    std scaling as in the papers; pass ``norm_by_std=True`` to add it. Shapes, edge cases
    and errors as ``grpo_advantages``. Registered as ``"rloo"``.
    """
    return grpo_advantages(
        rewards, group_ids, norm_by_std=norm_by_std, eps=eps, leave_one_out=True
    )


def drgrpo_advantages(
    rewards: Sequence[float | None] | Any,
    group_ids: Sequence[Hashable] | Any,
) -> np.ndarray:
    """Dr. GRPO advantages: ``grpo_advantages(..., norm_by_std=False)``, i.e.
    ``A_i = r_i - mean_g(r)`` (Liu et al. 2025 §3.1). Shapes, edge cases and errors as
    ``grpo_advantages``. Registered as ``"drgrpo"``."""
    return grpo_advantages(rewards, group_ids, norm_by_std=False)
