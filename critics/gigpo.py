"""GiGPO: Group-in-Group Policy Optimization (Feng et al. 2025, "Group-in-Group Policy
Optimization for LLM Agent Training", arXiv 2505.10978).

Two nested group-relative advantages, no critic:

* **episode level** (Eq. 3): the total return of a trajectory relative to the other
  trajectories of its episode group (same task instance and seed: ``Episode.group_id``);
* **step level** (Eq. 5-7): the discounted return from a step relative to every other step,
  in the same episode group, that acted from the same *anchor state* (``Turn.anchor``) —
  across trajectories and across time steps (a trajectory that revisits a state
  contributes each visit);
* combined per step (Eq. 8): ``A = A_E + step_weight * A_S``.

Vectorized with numpy (keys factorized once, group sums via ``np.bincount``): 1,000,000
steps take well under a second (``tests/benchmarks/bench_gigpo.py``).
``tests/unit/critics/critics_reference.py`` holds the per-sample loop this is tested against.
"""

from __future__ import annotations

import difflib
import itertools
import math
import numbers
from typing import Any, Hashable, Sequence

import numpy as np

from agentrl.errors import ConfigError, ContractError
from critics._common import (
    as_float_vector,
    check_unit_interval,
    factorize,
    group_normalize,
    to_numpy,
)

GIGPO_MODES = ("mean_norm", "mean_std_norm")
EPISODE_STATS = ("trajectory", "step")
GIGPO_EPS = 1e-6
"""Added to the std in ``mode="mean_std_norm"`` (as verl-agent's ``epsilon``)."""


def _rows(x: Any, name: str) -> list[Any]:
    """Per-trajectory rows of a ragged input (list of sequences / object array)."""
    if isinstance(x, (str, bytes)):
        raise ContractError(f"{name} is a string; expected one sequence per trajectory")
    try:
        rows = [to_numpy(row) for row in x]
    except TypeError as exc:
        raise ContractError(
            f"{name} is a {type(x).__name__}; expected one sequence per trajectory"
        ) from exc
    for i, row in enumerate(rows):
        if isinstance(row, (str, bytes)) or not hasattr(row, "__len__"):
            raise ContractError(
                f"{name}[{i}]={row!r} is not a sequence; expected one value per step of "
                f"trajectory {i}"
            )
        if isinstance(row, np.ndarray) and row.ndim != 1:
            raise ContractError(f"{name}[{i}] has shape {row.shape}; expected 1-D (steps)")
    return rows


def _flatten(x: Any, name: str, *, numeric: bool) -> tuple[Any, np.ndarray]:
    """``(flat values [N], lengths [n_traj] int64)`` from a 2-D array or a ragged list."""
    x = to_numpy(x)
    if isinstance(x, np.ndarray) and x.dtype.kind != "O":
        if x.ndim != 2:
            raise ContractError(
                f"{name} has shape {x.shape}; expected [num_trajectories, num_steps] or a "
                "list of per-trajectory sequences"
            )
        flat = x.reshape(-1)
        if numeric:
            flat = as_float_vector(flat, name, allow_missing=True)
        return flat, np.full(x.shape[0], x.shape[1], dtype=np.int64)
    rows = _rows(x, name)
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
    arrays = all(isinstance(r, np.ndarray) and r.dtype.kind in "biuf" for r in rows)
    if arrays and rows:
        flat = np.concatenate(rows)
        return (flat.astype(np.float64) if numeric else flat), lengths
    chained = list(itertools.chain.from_iterable(rows))
    if numeric:
        return as_float_vector(chained, name, allow_missing=True), lengths
    return chained, lengths


def discounted_returns(
    step_rewards_flat: np.ndarray, lengths: np.ndarray, gamma: float
) -> np.ndarray:
    """``R_t = r_t + gamma * R_{t+1}``, ``R_T = 0``, per trajectory (GiGPO Eq. 5).

    Args:
        step_rewards_flat: ``[N]`` float64 finite rewards, trajectories concatenated.
        lengths: ``[n_traj]`` int64 steps per trajectory, ``sum == N``.
        gamma: discount in [0, 1].

    Returns:
        ``[N]`` float64 returns. Vectorized over trajectories: one numpy step per time
        index (``max(lengths)`` of them), each touching the trajectories that long.
    """
    n_steps = step_rewards_flat.shape[0]
    returns = np.zeros(n_steps + 1, dtype=np.float64)  # slot N stays 0: "after the end"
    if n_steps == 0:
        return returns[:0]
    offsets = np.concatenate(([0], np.cumsum(lengths)[:-1])).astype(np.int64)
    order = np.argsort(-lengths, kind="stable")  # longest first
    sorted_len = lengths[order]
    starts = offsets[order]
    neg_len = -sorted_len  # ascending
    for t in range(int(sorted_len[0]) - 1, -1, -1):
        k = int(np.searchsorted(neg_len, -t, side="left"))  # trajectories with len > t
        idx = starts[:k] + t  # (k,)
        nxt = np.where(t + 1 < sorted_len[:k], idx + 1, n_steps)  # (k,)
        returns[idx] = step_rewards_flat[idx] + gamma * returns[nxt]
    return returns[:n_steps]


def _similarity_clusters(
    pair_group: np.ndarray,
    pair_anchor: np.ndarray,
    anchor_values: Sequence[Hashable] | np.ndarray,
    threshold: float,
) -> np.ndarray:
    """Cluster the distinct (episode group, anchor) pairs by text similarity.

    Within each episode group, distinct anchors are visited in sorted (lexicographic)
    order; each joins the first existing cluster whose first member ``rep`` has
    ``difflib.SequenceMatcher(None, anchor, rep).ratio() >= threshold``, else starts a new
    cluster. Returns ``[P]`` int64 cluster id per pair.
    """
    n_pairs = pair_group.shape[0]
    cluster_of_pair = np.empty(n_pairs, dtype=np.int64)
    order = np.argsort(pair_group, kind="stable")
    bounds = np.flatnonzero(np.diff(pair_group[order])) + 1
    next_id = 0
    for members in np.split(order, bounds):
        texts = []
        for p in members:
            a = anchor_values[int(pair_anchor[p])]
            if not isinstance(a, str):
                raise ContractError(
                    f"anchor {a!r} (type {type(a).__name__}) is not text; "
                    "similarity_threshold clusters text anchors only"
                )
            texts.append((a, int(p)))
        texts.sort()
        reps: list[difflib.SequenceMatcher] = []
        rep_ids: list[int] = []
        for text, p in texts:
            placed = -1
            for matcher, cid in zip(reps, rep_ids):
                matcher.set_seq1(text)  # seq2 = the cluster's first member (cached)
                if (
                    matcher.real_quick_ratio() >= threshold
                    and matcher.quick_ratio() >= threshold
                    and matcher.ratio() >= threshold
                ):
                    placed = cid
                    break
            if placed < 0:
                placed = next_id
                next_id += 1
                reps.append(difflib.SequenceMatcher(None, "", text))
                rep_ids.append(placed)
            cluster_of_pair[p] = placed
    return cluster_of_pair


def gigpo_advantages(
    step_rewards: Sequence[Sequence[float | None]] | Any,
    anchors: Sequence[Sequence[Hashable]] | Any,
    group_ids: Sequence[Hashable] | Any,
    *,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    mode: str = "mean_norm",
    episode_stats: str = "trajectory",
    similarity_threshold: float | None = None,
) -> list[np.ndarray]:
    """GiGPO advantages: one value per step of every trajectory (Feng et al. 2025).

    Let trajectory ``i`` have ``T_i`` steps, rewards ``r_t`` and episode group ``g(i)``.

    * Episode return (Eq. 3): ``R(i) = sum_t r_t`` (undiscounted total).
      ``A_E(i) = (R(i) - mean) / F``, the mean (and std) taken over the episode group.
      ``episode_stats="trajectory"`` (the paper): one sample per trajectory.
      ``episode_stats="step"`` (verl-agent's default, ``compute_mean_std_cross_steps``):
      one sample per *step*, i.e. ``R(i)`` repeated ``T_i`` times, so long trajectories
      weigh more in the mean and std.
    * Step return (Eq. 5): ``R_t = r_t + gamma * R_{t+1}``, ``R_{T_i} = 0``.
    * Step groups (Eq. 6): all steps ``(j, s)`` with ``g(j) == g(i)`` and
      ``anchors[j][s] == anchors[i][t]`` (any trajectory of the group, any time step;
      repeated visits count once each).
      ``A_S(i, t) = (R_t - mean) / F`` over that step group (Eq. 7).
    * ``A(i, t) = A_E(i) + step_weight * A_S(i, t)`` (Eq. 8).

    ``F = 1`` for ``mode="mean_norm"``; ``F = std + 1e-6`` (unbiased std, ddof=1, as
    ``torch.std`` in verl-agent) for ``mode="mean_std_norm"``.

    Edge cases. A group (episode or step level) with a single sample, or whose values
    are all equal (float tolerance as ``grpo_advantages``), gives exactly 0.0 at that
    level. (verl-agent differs for a singleton *episode* group: it uses mean 0, std 1,
    i.e. returns the raw total; here it is 0, docs/design.md invariant 6.) A trajectory
    whose step rewards contain ``None``/NaN/inf (a reward error) is excluded from every
    statistic and gets 0.0 on all its steps; other trajectories are computed as if it
    were absent. A trajectory with no steps gets an empty array and is excluded.

    Anchor similarity. With ``similarity_threshold`` in (0, 1], text anchors of one
    episode group are clustered instead of compared for equality: distinct anchors are
    visited in sorted order, and each joins the first cluster whose first member has
    ``difflib.SequenceMatcher(None, anchor, first).ratio() >= similarity_threshold``
    (greedy, deterministic, independent of trajectory order; verl-agent visits in batch
    order instead). Anchors must then be ``str``.

    Args:
        step_rewards: per trajectory, ``[T_i]`` rewards ``r_t`` received after step t:
            a list of sequences/arrays/tensors (ragged), or one ``[n, T]`` array/tensor.
        anchors: same layout, ``anchors[i][t]`` the hashable anchor state *before* step t
            (``Turn.anchor``), or an ``[n, T]`` numeric array.
        group_ids: ``[n]`` hashable episode-group keys (``Episode.group_id``).
        gamma: step discount in [0, 1] (paper and verl-agent: 0.95).
        step_weight: ``omega`` in Eq. 8, finite.
        mode: ``"mean_norm"`` or ``"mean_std_norm"``.
        episode_stats: ``"trajectory"`` or ``"step"``.
        similarity_threshold: ``None`` (exact anchors) or a number in (0, 1].

    Returns:
        ``n`` float64 numpy arrays, the i-th of shape ``[T_i]`` (``numpy.asarray`` of the
        list gives ``[n, T]`` when all trajectories have ``T`` steps).

    Raises:
        ContractError: ``step_rewards``, ``anchors`` and ``group_ids`` disagree on the
            number of trajectories, or trajectory i has different numbers of rewards and
            anchors (both lengths named); an unhashable anchor or group id; a reward that
            is not a number; a non-text anchor with ``similarity_threshold``.
        ConfigError: an option out of range (value and allowed values named).
    """
    if mode not in GIGPO_MODES:
        raise ConfigError(f"mode={mode!r}; expected one of {', '.join(GIGPO_MODES)}")
    if episode_stats not in EPISODE_STATS:
        raise ConfigError(
            f"episode_stats={episode_stats!r}; expected one of {', '.join(EPISODE_STATS)}"
        )
    gamma = check_unit_interval(gamma, "gamma")
    if not isinstance(step_weight, numbers.Real) or not math.isfinite(step_weight):
        raise ConfigError(f"step_weight={step_weight!r}; expected a finite number")
    if similarity_threshold is not None and (
        isinstance(similarity_threshold, bool)
        or not isinstance(similarity_threshold, numbers.Real)
        or not 0.0 < float(similarity_threshold) <= 1.0
    ):
        raise ConfigError(
            f"similarity_threshold={similarity_threshold!r}; expected None or a number in (0, 1]"
        )
    use_std = mode == "mean_std_norm"

    rewards, lengths = _flatten(step_rewards, "step_rewards", numeric=True)  # [N], [n]
    anchor_flat, anchor_lengths = _flatten(anchors, "anchors", numeric=False)  # [N], [n]
    g_codes, n_groups, _ = factorize(group_ids, "group_ids")  # [n]
    n_traj = lengths.shape[0]
    if not (n_traj == anchor_lengths.shape[0] == g_codes.shape[0]):
        raise ContractError(
            f"step_rewards has {n_traj} trajectories, anchors {anchor_lengths.shape[0]}, "
            f"group_ids {g_codes.shape[0]}; expected one entry per trajectory in each"
        )
    mismatch = np.flatnonzero(lengths != anchor_lengths)
    if mismatch.size:
        i = int(mismatch[0])
        raise ContractError(
            f"trajectory {i} has {int(lengths[i])} step_rewards but {int(anchor_lengths[i])} "
            "anchors; expected one anchor per step"
        )
    n_steps = rewards.shape[0]
    traj_of_step = np.repeat(np.arange(n_traj, dtype=np.int64), lengths)  # [N]

    # Validity: a trajectory with a missing reward, or no steps, is excluded entirely.
    bad_steps = np.bincount(traj_of_step, weights=~np.isfinite(rewards), minlength=n_traj)
    valid_traj = (bad_steps == 0) & (lengths > 0)  # [n]
    valid_step = valid_traj[traj_of_step]  # [N]
    clean = np.where(valid_step, rewards, 0.0)  # [N]

    # Episode level (Eq. 3).
    totals = np.bincount(traj_of_step, weights=clean, minlength=n_traj)  # [n]
    a_episode = np.zeros(n_traj, dtype=np.float64)  # [n]
    a_episode[valid_traj] = group_normalize(
        totals[valid_traj],
        g_codes[valid_traj],
        n_groups,
        use_std=use_std,
        eps=GIGPO_EPS,
        weights=lengths[valid_traj] if episode_stats == "step" else None,
    )

    # Step level (Eq. 5-7).
    step_returns = discounted_returns(clean, lengths, gamma)  # [N]
    a_codes, n_anchors, anchor_values = factorize(anchor_flat, "anchors")  # [N]
    sel = np.flatnonzero(valid_step)  # [M]
    pair_key = g_codes[traj_of_step[sel]] * np.int64(max(n_anchors, 1)) + a_codes[sel]  # [M]
    pair_codes, n_pairs, _ = factorize(pair_key, "step groups")  # [M]
    if similarity_threshold is not None and n_pairs:
        pair_group = np.empty(n_pairs, dtype=np.int64)
        pair_anchor = np.empty(n_pairs, dtype=np.int64)
        pair_group[pair_codes] = g_codes[traj_of_step[sel]]
        pair_anchor[pair_codes] = a_codes[sel]
        cluster = _similarity_clusters(
            pair_group, pair_anchor, anchor_values, float(similarity_threshold)
        )
        step_codes = cluster[pair_codes]
        n_step_groups = int(cluster.max()) + 1
    else:
        step_codes, n_step_groups = pair_codes, n_pairs
    a_step = group_normalize(
        step_returns[sel], step_codes, n_step_groups, use_std=use_std, eps=GIGPO_EPS
    )  # [M]

    # Eq. 8.
    adv = np.zeros(n_steps, dtype=np.float64)  # [N]
    adv[sel] = a_episode[traj_of_step[sel]] + float(step_weight) * a_step
    return np.split(adv, np.cumsum(lengths)[:-1]) if n_traj else []
