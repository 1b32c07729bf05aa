"""DAPO's batch filters and length shaping (Yu et al. 2025, "DAPO: An Open-Source LLM
Reinforcement Learning System at Scale")."""

from __future__ import annotations

import numbers
from typing import Any, Hashable, Sequence

import numpy as np

from agentrl.errors import ConfigError, ContractError
from critics._common import (
    as_float_vector,
    check_same_length,
    constant_groups,
    factorize,
)


def dynamic_sampling_keep(
    rewards: Sequence[float | None] | Any,
    group_ids: Sequence[Hashable] | Any,
) -> np.ndarray:
    """Dynamic sampling (DAPO §3.2): keep only groups whose rewards are not all equal.

    A group whose valid rewards are all equal (accuracy 0 or 1, or any constant reward),
    or that has fewer than two valid rewards, carries no group-relative signal: all its
    advantages are 0 (see ``grpo_advantages``). Such groups are dropped, and the caller
    refills the batch or counts the dropped tokens. "Equal" uses the same float tolerance
    as ``grpo_advantages``, so ``keep[i]`` is False for every sample whose group would get
    all-zero advantages.

    Args:
        rewards: ``[N]`` numbers; ``None``/NaN/inf for failed samples.
        group_ids: ``[N]`` hashable group keys.

    Returns:
        ``[N]`` bool numpy array: True for valid samples of groups with at least two
        distinct valid rewards. Failed samples (``None``/NaN/inf) are always False; they
        do not count toward their group's rewards.

    Raises:
        ContractError: lengths differ (both named), a reward is not a number, or a group
            id is unhashable.
    """
    r = as_float_vector(rewards, "rewards", allow_missing=True)  # [N]
    codes, n_groups, _ = factorize(group_ids, "group_ids")  # [N]
    check_same_length(r.shape[0], "rewards", codes.shape[0], "group_ids", "sample")
    valid = np.isfinite(r)
    const = constant_groups(r[valid], codes[valid], n_groups)  # [G]
    return valid & ~const[codes]


def overlong_penalty(
    lengths: Sequence[int] | Any,
    *,
    max_len: int,
    cache_len: int,
    penalty: float = 1.0,
) -> np.ndarray:
    """Soft overlong punishment (DAPO Eq. 13), a length-aware reward to add to the task
    reward.

    With ``L_max = max_len`` and ``L_cache = cache_len``, for a response of ``|y|`` tokens::

        R_length(y) = 0                                   if |y| <= L_max - L_cache
                    = ((L_max - L_cache) - |y|) / L_cache  if L_max - L_cache < |y| <= L_max
                    = -1                                  if |y| > L_max

    and the result is ``penalty * R_length(y)``: 0 up to the soft limit, then linearly down
    to ``-penalty`` at ``max_len``, and ``-penalty`` beyond. (DAPO used ``L_max = 20480``,
    ``L_cache = 4096``.)

    Args:
        lengths: ``[N]`` non-negative integers, response lengths in tokens (generated tokens
            of the episode, i.e. ``sum(loss_mask)``).
        max_len: ``L_max`` in tokens, > 0.
        cache_len: ``L_cache`` in tokens, ``0 <= cache_len <= max_len``. 0 gives a hard
            step from 0 to ``-penalty`` above ``max_len``.
        penalty: scale (>= 0) of the punishment.

    Returns:
        ``[N]`` float64 numpy array, values in ``[-penalty, 0]``.

    Raises:
        ConfigError: ``max_len``/``cache_len``/``penalty`` out of range.
        ContractError: a length is negative, not an integer or not finite.
    """
    for name, v in (("max_len", max_len), ("cache_len", cache_len)):
        if isinstance(v, bool) or not isinstance(v, numbers.Integral):
            raise ConfigError(f"{name}={v!r}; expected an integer number of tokens")
    if max_len <= 0:
        raise ConfigError(f"max_len={max_len}; expected > 0 tokens")
    if not 0 <= cache_len <= max_len:
        raise ConfigError(f"cache_len={cache_len}; expected 0 <= cache_len <= max_len={max_len}")
    if not isinstance(penalty, numbers.Real) or not np.isfinite(penalty) or penalty < 0:
        raise ConfigError(f"penalty={penalty!r}; expected a finite number >= 0")
    n = as_float_vector(lengths, "lengths", allow_missing=False)  # [N]
    bad = np.flatnonzero((n < 0) | (n != np.round(n)))
    if bad.size:
        raise ContractError(
            f"lengths[{int(bad[0])}]={float(n[bad[0]]):g}; expected a non-negative integer token count"
        )
    soft = max_len - cache_len
    out = np.zeros_like(n)
    mid = (n > soft) & (n <= max_len)
    if cache_len > 0:
        out[mid] = (soft - n[mid]) / cache_len
    out[n > max_len] = -1.0
    return out * float(penalty)
