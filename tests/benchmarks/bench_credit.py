"""Benchmark: GRPO vs GiGPO vs the turn-level critic on Sokoban, same seeds, same tasks, same
rollout-token budget. Prints success rate and mean reward against cumulative rollout tokens
for each estimator, from each run's metrics.jsonl.

Run on demand (not collected by pytest)::

    .venv/bin/python tests/benchmarks/bench_credit_sokoban.py --iterations 8 --out runs/bench-credit

Every estimator trains from the same initial weights on the same task order (TaskSource
seed) with the same sampling seeds, so the first iteration's rollouts are identical and the
curves differ only through the updates. Per-step prompting (history 2) keeps the context flat.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

ESTIMATORS = ("grpo", "gigpo", "turn_critic")


def run(estimator: str, args: argparse.Namespace) -> list[dict]:
    from agentrl.cluster.controller import train
    from agentrl.config import load_config

    run_dir = Path(args.out) / estimator
    cfg = load_config(None, [
        f"run.dir={run_dir}", f"run.iterations={args.iterations}", "run.seed=0", f"model.path={args.model}",
        "env.id=agentrl/Sokoban-v0", f"env.tasks_per_iteration={args.tasks}", f"env.group_size={args.group}",
        f"rollout.max_turns={args.turns}", f"rollout.max_new_tokens={args.new_tokens}",
        "rollout.max_context_tokens=1536", "rollout.prompt_mode=per_step", "rollout.history_length=2",
        f"algorithm.advantage={estimator}", "algorithm.gamma=0.95", "algorithm.lam=0.95",
        f"trainer.lr={args.lr}", "critic.lr=1e-5", "sandbox.backend=bwrap",
    ])
    t0 = time.perf_counter()
    train(cfg)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    print(f"{estimator}: {len(rows)} iterations in {time.perf_counter() - t0:.0f} s", flush=True)
    return rows


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--iterations", type=int, default=8)
    p.add_argument("--tasks", type=int, default=4)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--turns", type=int, default=6)
    p.add_argument("--new-tokens", type=int, default=48)
    p.add_argument("--lr", type=float, default=2e-6)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--out", default="runs/bench-credit")
    p.add_argument("--estimators", default=",".join(ESTIMATORS))
    args = p.parse_args()
    results = {e: run(e, args) for e in args.estimators.split(",")}
    print("\nsuccess rate / mean reward against cumulative rollout tokens (Sokoban, per-step prompts)")
    print(f"{'estimator':<12} {'iter':>4} {'cum tokens':>11} {'success':>8} {'reward':>8} {'invalid':>8}")
    for est, rows in results.items():
        cum = 0.0
        for r in rows:
            cum += r.get("tokens/generated") or 0.0
            print(f"{est:<12} {int(r['iteration']):>4} {cum:>11.0f} {r.get('rollout/success_rate') or 0:>8.3f} "
                  f"{r.get('rollout/reward_mean') or 0:>8.3f} {r.get('rollout/invalid_action_rate') or 0:>8.3f}")


if __name__ == "__main__":
    main()
