"""Benchmark: vectorized GiGPO vs the per-sample loop reference.

Run on demand (pytest does not collect this file)::

    OMP_NUM_THREADS=1 .venv/bin/python tests/benchmarks/bench_gigpo.py

Default workload: 4,096 trajectories x 256 steps (1,048,576 steps), episode groups of 8,
anchors drawn from a small state space (32 states) so that step groups are large. Times the
vectorized ``critics.gigpo_advantages`` (best of ``--repeats``) on two input layouts —
``[n, T]`` numpy arrays with integer anchors, and Python lists of lists with text anchors
(what a controller builds from ``Turn`` objects) — and the loop reference
``tests/unit/critics/critics_reference.gigpo_advantages_loop`` once, checks they agree, and prints the times
and the ratio. Target: vectorized < 1 s. Exits 1 if the results disagree.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit" / "critics"))  # the slow oracles

from critics import gigpo_advantages  # noqa: E402
from critics_reference import gigpo_advantages_loop  # noqa: E402


def make_workload(n_traj: int, steps: int, group_size: int, n_states: int, seed: int):
    """Rewards ``[n, T]`` float64, anchors ``[n, T]`` int64, group ids ``[n]`` int64."""
    rng = np.random.default_rng(seed)
    rewards = np.where(rng.random((n_traj, steps)) < 0.05, 0.1, 0.0)  # sparse shaping
    rewards[:, -1] += (rng.random(n_traj) < 0.3).astype(np.float64)  # success at the end
    anchors = rng.integers(0, n_states, size=(n_traj, steps))
    group_ids = np.arange(n_traj) // group_size
    return rewards, anchors, group_ids


def best_of(repeats: int, fn) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--trajectories", type=int, default=4096, help="number of trajectories (default 4096)")
    p.add_argument("--steps", type=int, default=256, help="steps per trajectory (default 256)")
    p.add_argument("--group-size", type=int, default=8, help="trajectories per episode group (default 8)")
    p.add_argument("--states", type=int, default=32, help="size of the anchor state space (default 32)")
    p.add_argument("--repeats", type=int, default=3, help="timing repeats for the vectorized runs (default 3)")
    p.add_argument("--mode", default="mean_std_norm", choices=["mean_norm", "mean_std_norm"])
    p.add_argument("--episode-stats", default="trajectory", choices=["trajectory", "step"])
    p.add_argument("--skip-reference", action="store_true", help="do not run the slow loop reference")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)

    rewards, anchors, group_ids = make_workload(
        args.trajectories, args.steps, args.group_size, args.states, args.seed
    )
    kw = dict(gamma=0.95, step_weight=1.0, mode=args.mode, episode_stats=args.episode_stats)
    n_steps = rewards.size
    print(
        f"GiGPO: {args.trajectories} trajectories x {args.steps} steps = {n_steps:,} steps, "
        f"groups of {args.group_size}, {args.states} anchor states, {kw}"
    )

    t_arr, out_arr = best_of(args.repeats, lambda: gigpo_advantages(rewards, anchors, group_ids, **kw))
    print(f"vectorized, numpy [n, T] arrays, int anchors:    {t_arr:8.3f} s (best of {args.repeats})")

    rewards_l = rewards.tolist()
    anchors_l = [[f"room {a}: a lamp, a door" for a in row] for row in anchors.tolist()]
    groups_l = [f"task-{g}" for g in group_ids.tolist()]
    t_lst, out_lst = best_of(args.repeats, lambda: gigpo_advantages(rewards_l, anchors_l, groups_l, **kw))
    print(f"vectorized, lists of lists, text anchors:       {t_lst:8.3f} s (best of {args.repeats})")

    a_arr, a_lst = np.asarray(out_arr), np.asarray(out_lst)
    ok = bool(np.array_equal(a_arr, a_lst))
    if not args.skip_reference:
        t0 = time.perf_counter()
        out_ref = gigpo_advantages_loop(rewards_l, anchors_l, groups_l, **kw)
        t_ref = time.perf_counter() - t0
        a_ref = np.asarray(out_ref)
        diff = float(np.max(np.abs(a_ref - a_arr)))
        ok = ok and bool(np.allclose(a_arr, a_ref, rtol=1e-9, atol=1e-9))
        print(f"loop reference (per-sample Python loops):       {t_ref:8.3f} s")
        print(f"speed-up: {t_ref / t_arr:.1f}x (arrays), {t_ref / t_lst:.1f}x (lists)")
        print(f"max |vectorized - reference| = {diff:.3g}")
    print(f"target < 1 s vectorized: {'met' if max(t_arr, t_lst) < 1.0 else 'MISSED'}")
    print("results agree" if ok else "RESULTS DISAGREE")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
