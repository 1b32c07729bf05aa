"""Straightforward per-sample loop implementations, the oracles of the vectorized estimators.

Slow (pure Python) and deliberately simple: each one follows the paper's definition one
sample at a time, with dicts keyed by group, and shares no code with the vectorized
versions. Tests check that both agree; ``tests/benchmarks/bench_gigpo.py`` times them.
Same arguments, edge-case rules and outputs as the functions they mirror; input
validation is minimal (they trust their callers).
"""

from __future__ import annotations

import difflib
import math
from typing import Any, Hashable, Sequence

import numpy as np

_RTOL = 1e-12  # same "all equal" tolerance as critics._common.CONSTANT_RTOL


def _is_missing(x: Any) -> bool:
    return x is None or not math.isfinite(float(x))


def _normalize(values: list[float], use_std: bool, eps: float, loo: bool = False) -> list[float]:
    """Group-relative advantages of one group's values (ddof=1 std)."""
    n = len(values)
    if n <= 1:
        return [0.0] * n
    lo, hi = min(values), max(values)
    if hi - lo <= _RTOL * max(abs(lo), abs(hi)):
        return [0.0] * n
    total = sum(values)
    mean = total / n
    out = []
    for v in values:
        # RLOO baseline: mean of the other n - 1 samples
        out.append(v - (total - v) / (n - 1) if loo else v - mean)
    if use_std:
        std = math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1))
        if std + eps <= 0:
            return [0.0] * n
        out = [a / (std + eps) for a in out]
    return out


def grpo_advantages_loop(
    rewards: Sequence[float | None],
    group_ids: Sequence[Hashable],
    *,
    norm_by_std: bool = True,
    eps: float = 1e-6,
    leave_one_out: bool = False,
) -> np.ndarray:
    """Loop version of ``critics.grpo_advantages``. ``[N]`` float64."""
    members: dict[Hashable, list[int]] = {}
    for i, (r, g) in enumerate(zip(rewards, group_ids)):
        if not _is_missing(r):
            members.setdefault(g, []).append(i)
    out = np.zeros(len(rewards), dtype=np.float64)
    for idx in members.values():
        vals = [float(rewards[i]) for i in idx]  # type: ignore[arg-type]
        for i, a in zip(idx, _normalize(vals, norm_by_std, eps, leave_one_out)):
            out[i] = a
    return out


def gigpo_advantages_loop(
    step_rewards: Sequence[Sequence[float | None]],
    anchors: Sequence[Sequence[Hashable]],
    group_ids: Sequence[Hashable],
    *,
    gamma: float = 0.95,
    step_weight: float = 1.0,
    mode: str = "mean_norm",
    episode_stats: str = "trajectory",
    similarity_threshold: float | None = None,
) -> list[np.ndarray]:
    """Loop version of ``critics.gigpo_advantages`` (Feng et al. 2025, Eq. 3, 5-8)."""
    use_std = mode == "mean_std_norm"
    eps = 1e-6
    n = len(step_rewards)
    rows = [[None if r is None else float(r) for r in traj] for traj in step_rewards]
    valid = [len(row) > 0 and not any(_is_missing(r) for r in row) for row in rows]

    # Episode level (Eq. 3): one sample per trajectory, or one per step.
    ep_members: dict[Hashable, list[tuple[int, float]]] = {}
    for i in range(n):
        if valid[i]:
            total = sum(rows[i])  # type: ignore[arg-type]
            copies = len(rows[i]) if episode_stats == "step" else 1
            for _ in range(copies):
                ep_members.setdefault(group_ids[i], []).append((i, total))
    a_episode = [0.0] * n
    for samples in ep_members.values():
        for (i, _), a in zip(samples, _normalize([v for _, v in samples], use_std, eps)):
            a_episode[i] = a  # every copy of trajectory i gets the same value

    # Step level (Eq. 5): discounted return from each step.
    returns: list[list[float]] = []
    for i in range(n):
        ret = [0.0] * len(rows[i])
        running = 0.0
        for t in range(len(rows[i]) - 1, -1, -1):
            running = (rows[i][t] if valid[i] else 0.0) + gamma * running  # type: ignore[operator]
            ret[t] = running
        returns.append(ret)

    # Anchor groups (Eq. 6): key (episode group, anchor), or (group, cluster's first member).
    cluster_of: dict[tuple[Hashable, Hashable], Hashable] = {}
    if similarity_threshold is not None:
        by_group: dict[Hashable, set] = {}
        for i in range(n):
            if valid[i]:
                for a in anchors[i]:
                    by_group.setdefault(group_ids[i], set()).add(a)
        for g, distinct in by_group.items():
            firsts: list[str] = []
            for a in sorted(distinct):
                for rep in firsts:
                    if difflib.SequenceMatcher(None, a, rep).ratio() >= similarity_threshold:
                        cluster_of[(g, a)] = (g, rep)
                        break
                else:
                    firsts.append(a)
                    cluster_of[(g, a)] = (g, a)

    step_members: dict[Hashable, list[tuple[int, int]]] = {}
    for i in range(n):
        if not valid[i]:
            continue
        for t, a in enumerate(anchors[i]):
            key = (group_ids[i], a)
            key = cluster_of.get(key, key)
            step_members.setdefault(key, []).append((i, t))
    a_step = [[0.0] * len(rows[i]) for i in range(n)]
    for members in step_members.values():
        vals = [returns[i][t] for i, t in members]
        for (i, t), a in zip(members, _normalize(vals, use_std, eps)):
            a_step[i][t] = a

    # Eq. 8.
    out = []
    for i in range(n):
        if valid[i]:
            out.append(np.array([a_episode[i] + step_weight * s for s in a_step[i]], dtype=np.float64))
        else:
            out.append(np.zeros(len(rows[i]), dtype=np.float64))
    return out
