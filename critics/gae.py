"""Generalized advantage estimation with a learned critic: per turn and per token.

GAE (Schulman et al. 2016, "High-Dimensional Continuous Control Using Generalized
Advantage Estimation", Eq. 16): ``A_t = sum_l (gamma lam)^l delta_{t+l}`` with the TD error
``delta_t = r_t + gamma V(s_{t+1}) - V(s_t)``, computed backwards as
``A_t = delta_t + gamma lam A_{t+1}``. The value targets are ``returns_t = A_t + V(s_t)``
(the lambda-return).
"""

from __future__ import annotations

import math
import numbers
from typing import Any, Sequence

import numpy as np

from agentrl.errors import ContractError
from critics._common import as_float_array, as_float_vector, check_unit_interval


def turn_gae(
    rewards: Sequence[float] | Any,
    values: Sequence[float] | Any,
    *,
    gamma: float,
    lam: float,
    bootstrap_value: float = 0.0,
) -> tuple[np.ndarray, np.ndarray]:
    """Turn-level GAE for one episode with a turn-level critic (``"turn_critic"``).

    The MDP step is a whole agent turn, as in ArCHer's high-level critic (Zhou et al. 2024,
    "ArCHer", §4) and the turn level of RAGEN's bi-level GAE. For turns ``k = 0..K-1``::

        V_K     = bootstrap_value            (0: the episode ended; V(s_K) = 0)
        delta_k = r_k + gamma * V_{k+1} - V_k
        A_k     = delta_k + gamma * lam * A_{k+1},   A_K = 0     (GAE Eq. 16)
        returns_k = A_k + V_k

    Pass ``bootstrap_value = V(s_K)`` for a *truncated* episode (Gymnasium semantics);
    keep 0 for a terminated one. The trainer spreads ``A_k`` onto turn k's sampled tokens.

    Args:
        rewards: ``[K]`` finite env rewards after each turn.
        values: ``[K]`` finite critic values ``V(s_k)`` of the state before turn k.
        gamma: discount per turn, in [0, 1].
        lam: GAE lambda, in [0, 1] (0: one-step TD; 1: Monte-Carlo return minus V).
        bootstrap_value: ``V(s_K)``, finite.

    Returns:
        ``(advantages [K], returns [K])``, float64 numpy arrays. ``K = 0`` gives two empty
        arrays.

    Raises:
        ContractError: ``len(rewards) != len(values)`` (both named), non-finite input.
        ConfigError: ``gamma`` or ``lam`` outside [0, 1].
    """
    gamma = check_unit_interval(gamma, "gamma")
    lam = check_unit_interval(lam, "lam")
    if not isinstance(bootstrap_value, numbers.Real) or not math.isfinite(bootstrap_value):
        raise ContractError(f"bootstrap_value={bootstrap_value!r}; expected a finite number")
    r = as_float_vector(rewards, "rewards", allow_missing=False)  # [K]
    v = as_float_vector(values, "values", allow_missing=False)  # [K]
    if r.shape[0] != v.shape[0]:
        raise ContractError(
            f"rewards has {r.shape[0]} values but values has {v.shape[0]}; expected one "
            "value per turn"
        )
    k_turns = r.shape[0]
    adv = np.zeros(k_turns, dtype=np.float64)
    next_value = float(bootstrap_value)
    running = 0.0
    for k in range(k_turns - 1, -1, -1):
        delta = r[k] + gamma * next_value - v[k]
        running = delta + gamma * lam * running
        adv[k] = running
        next_value = v[k]
    return adv, adv + v


def gae(
    rewards: Any,
    values: Any,
    mask: Any,
    *,
    gamma: float,
    lam: float,
) -> tuple[np.ndarray, np.ndarray]:
    """Token-level GAE for PPO with a token-level critic (``"gae"``), multi-turn aware.

    Each row is one episode's token stream. The recursion runs over the positions with
    ``mask == 1`` (sampled tokens) only, in order; positions with ``mask == 0``
    (observation tokens, chat-template glue, padding) are skipped, so the value of the
    *next sampled token* is the bootstrap and an observation never breaks the chain. For
    the sampled positions ``p_1 < ... < p_m`` of a row (GAE Eq. 16 on that sub-sequence)::

        delta_j = r[p_j] + gamma * V[p_{j+1}] - V[p_j]      (V[p_{m+1}] = 0: episode end)
        A_j     = delta_j + gamma * lam * A_{j+1}           (A_{m+1} = 0)
        returns[p_j] = A_j + V[p_j]

    This is what verl's ``compute_gae_advantage_return`` does for multi-turn batches (it
    carries the next value and the running advantage across ``response_mask == 0``
    positions). Unlike verl, no whitening is applied here (do it in the loss if wanted),
    and both outputs are exactly 0.0 where ``mask == 0``.

    Args:
        rewards: ``[B, T]`` token rewards (typically the episode/turn reward on a turn's
            last sampled token, minus any KL penalty). Must be 0 where ``mask == 0``: a
            reward placed on an observation token would be silently lost, so it raises.
        values: ``[B, T]`` critic values; ignored (may be anything finite or not) where
            ``mask == 0``.
        mask: ``[B, T]`` 0/1 (bool, int or float), the ``loss_mask``.
        gamma: discount per sampled token, in [0, 1].
        lam: GAE lambda, in [0, 1].

    Returns:
        ``(advantages [B, T], returns [B, T])``, float64 numpy arrays, 0.0 where
        ``mask == 0``. A row without sampled tokens is all zeros.

    Raises:
        ContractError: shapes differ (all named), ``mask`` not 0/1, a non-finite reward or
            value on a sampled position, or a non-zero reward where ``mask == 0``.
        ConfigError: ``gamma`` or ``lam`` outside [0, 1].
    """
    gamma = check_unit_interval(gamma, "gamma")
    lam = check_unit_interval(lam, "lam")
    r = as_float_array(rewards, "rewards", 2)  # [B, T]
    v = as_float_array(values, "values", 2)  # [B, T]
    m = as_float_array(mask, "mask", 2)  # [B, T]
    if not (r.shape == v.shape == m.shape):
        raise ContractError(
            f"rewards has shape {r.shape}, values {v.shape}, mask {m.shape}; expected "
            "equal [B, T] shapes"
        )
    if not np.all((m == 0) | (m == 1)):
        bad = np.argwhere((m != 0) & (m != 1))[0]
        raise ContractError(f"mask[{bad[0]}, {bad[1]}]={float(m[tuple(bad)])!r}; expected 0 or 1")
    on = m == 1  # [B, T] bool
    for name, arr in (("rewards", r), ("values", v)):
        bad_pos = np.argwhere(on & ~np.isfinite(arr))
        if bad_pos.size:
            b, t = bad_pos[0]
            raise ContractError(f"{name}[{b}, {t}]={float(arr[b, t])!r} is not finite at a sampled position")
    off_reward = np.argwhere(~on & (r != 0))
    if off_reward.size:
        b, t = off_reward[0]
        raise ContractError(
            f"rewards[{b}, {t}]={float(r[b, t])!r} lies on a mask==0 position (observation or "
            "padding); put rewards on sampled tokens (e.g. the turn's last one)"
        )
    bsz, seq_len = r.shape
    adv = np.zeros((bsz, seq_len), dtype=np.float64)  # (B, T)
    next_value = np.zeros(bsz, dtype=np.float64)  # (B,) V of the next sampled token
    running = np.zeros(bsz, dtype=np.float64)  # (B,) A of the next sampled token
    v_on = np.where(on, v, 0.0)  # (B, T) values outside the mask never read
    for t in range(seq_len - 1, -1, -1):
        m_t = on[:, t]  # (B,)
        delta = r[:, t] + gamma * next_value - v_on[:, t]  # (B,)
        a_t = delta + gamma * lam * running  # (B,)
        running = np.where(m_t, a_t, running)
        next_value = np.where(m_t, v_on[:, t], next_value)
        adv[:, t] = np.where(m_t, a_t, 0.0)
    returns = np.where(on, adv + v_on, 0.0)  # (B, T)
    return adv, returns

