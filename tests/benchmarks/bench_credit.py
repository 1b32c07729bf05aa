"""Benchmark: GRPO vs GiGPO vs the turn-level critic on one multi-turn environment, with the
same seeds, the same task order and the same starting weights. Prints success rate and
mean reward against cumulative rollout tokens for each estimator, and compares them at an
equal rollout-token budget.

Run on demand (pytest does not collect this file)::

    .venv/bin/python tests/benchmarks/bench_credit.py --iterations 8 --out runs/bench-credit

Default: ``agentrl/GuessNumber-v0`` (secret 1..10, 5 guesses), SmolLM2-135M-Instruct, 8
tasks x 4 rollouts per iteration, full-history prompts. It is the environment in which the
135M model on a CPU gets a learning signal: it solves roughly 10-20 % of games untrained,
while on Sokoban none of its first 64 replies was a valid move (see docs/benchmarks.md, "Credit
assignment"). ``--env agentrl/Sokoban-v0 --env-kwargs '{"dim_room": [6, 6],
"num_boxes": 1}' --mode per_step`` runs the same comparison on Sokoban.

What is held equal. Every estimator trains from the same initial weights on the same task
order (``TaskSource`` seed) with the same per-request sampling seeds, so iteration 1's
rollouts are token-for-token identical across estimators and the curves differ only
through the updates. Rollout tokens differ per iteration (reply lengths change as the
policy changes), so the equal-budget comparison takes ``B`` = the smallest total any
estimator generated, and for each estimator the success rate over every episode of the
iterations within its first ``B`` tokens (the iteration that crosses ``B`` counts with the
fraction of its tokens inside it). Success rates count scored episodes only: an episode
that ended in an infrastructure or reward error is neither a success nor a failure.

Results also go to ``<out>/results.json``. The run directories (metrics, replay DB)
stay under ``<out>/<estimator>/``.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # run from a checkout

ESTIMATORS = ("grpo", "gigpo", "turn_critic")


def run(estimator: str, args: argparse.Namespace) -> list[dict]:
    """Train one estimator; return its per-iteration metrics rows."""
    import shutil

    from agentrl.driver.controller import train
    from agentrl.config import load_config

    run_dir = Path(args.out) / estimator
    shutil.rmtree(run_dir, ignore_errors=True)  # a fresh run, not a resume of an old one
    overrides = [
        f"run.dir={run_dir}", f"run.iterations={args.iterations}", f"run.seed={args.seed}",
        f"model.path={args.model}", f"env.id={args.env}", f"env.kwargs={args.env_kwargs}",
        f"env.tasks_per_iteration={args.tasks}", f"env.group_size={args.group}",
        f"rollout.max_turns={args.turns}", f"rollout.max_new_tokens={args.new_tokens}",
        "rollout.max_context_tokens=1536", f"rollout.prompt_mode={args.mode}", "rollout.history_length=2",
        f"algorithm.advantage={estimator}", f"algorithm.gamma={args.gamma}", f"algorithm.lam={args.lam}",
        f"trainer.lr={args.lr}", f"critic.lr={args.critic_lr}", "sandbox.backend=bwrap",
        "run.checkpoint_every=1000",
    ]
    cfg = load_config(None, overrides)
    t0 = time.perf_counter()
    train(cfg)
    rows = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines()]
    print(f"{estimator}: {len(rows)} iterations in {time.perf_counter() - t0:.0f} s", flush=True)
    return rows


def _scored(r: dict) -> tuple[float, float]:
    """(successes, scored episodes) of one iteration: errored episodes are in neither."""
    if r.get("rollout/scored_episodes") is not None:
        return float(r.get("rollout/successes") or 0.0), float(r["rollout/scored_episodes"])
    rate, n = r.get("rollout/success_rate"), float(r.get("rollout/episodes") or 0.0)  # older metrics files
    return (float(rate) * n, n) if rate is not None and rate == rate else (0.0, 0.0)


def at_budget(rows: list[dict], budget: float) -> tuple[float, int, float, float]:
    """Success rate within the first ``budget`` rollout tokens of a run.

    Iterations are taken in order; the one that crosses ``budget`` counts with the
    fraction of its tokens that falls inside it (its successes and episodes scaled
    alike), so every estimator is measured on exactly ``min(budget, its total)`` tokens.

    Returns:
        ``(success rate, iterations touched, tokens counted, episodes counted)``.
    """
    cum, succ, eps, n = 0.0, 0.0, 0.0, 0
    for r in rows:
        if cum >= budget:
            break
        tokens = float(r.get("tokens/generated") or 0.0)
        w = 1.0 if tokens <= 0 or cum + tokens <= budget else (budget - cum) / tokens
        s, e = _scored(r)
        succ += w * s
        eps += w * e
        cum += w * tokens
        n += 1
    return (succ / eps if eps else 0.0), n, cum, eps


def binomial_se(p: float, n: float) -> float:
    """Standard error of a success rate ``p`` measured on ``n`` episodes (treated as
    independent; rollouts of one group share a task, so the true error is somewhat larger)."""
    return math.sqrt(max(p * (1.0 - p), 0.0) / n) if n > 0 else float("nan")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--env", default="agentrl/GuessNumber-v0")
    p.add_argument("--env-kwargs", default='{"low": 1, "high": 10, "max_guesses": 5}', help="JSON")
    p.add_argument("--mode", default="full_history", choices=("full_history", "per_step"))
    p.add_argument("--iterations", type=int, default=8)
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--group", type=int, default=4)
    p.add_argument("--turns", type=int, default=5)
    p.add_argument("--new-tokens", type=int, default=32)
    p.add_argument("--lr", type=float, default=1e-5)
    p.add_argument("--critic-lr", type=float, default=1e-5)
    p.add_argument("--gamma", type=float, default=0.95)
    p.add_argument("--lam", type=float, default=0.95)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--out", default="runs/bench-credit")
    p.add_argument("--estimators", default=",".join(ESTIMATORS))
    p.add_argument("--report", metavar="RESULTS_JSON", help="print the tables of a finished run again, train nothing")
    args = p.parse_args()
    json.loads(args.env_kwargs)  # fail before training if it is not JSON
    if args.report:
        saved = json.loads(Path(args.report).read_text())
        report(argparse.Namespace(**saved["args"]), saved["iterations"])
        return
    results = {e: run(e, args) for e in args.estimators.split(",")}
    report(args, results)


def report(args: argparse.Namespace, results: dict[str, list[dict]]) -> None:
    """Print the per-iteration table and the equal-budget comparison; write results.json."""
    print(f"\nsuccess rate / mean reward against cumulative rollout tokens ({args.env}, {args.mode}, "
          f"{args.tasks} tasks x {args.group} rollouts per iteration, seed {args.seed})")
    print(f"{'estimator':<12} {'iter':>4} {'cum tokens':>11} {'success':>8} {'reward':>8} {'invalid':>8} {'turns':>6}")
    for est, rows in results.items():
        cum = 0.0
        for r in rows:
            cum += r.get("tokens/generated") or 0.0
            print(f"{est:<12} {int(r['iteration']):>4} {cum:>11.0f} {r.get('rollout/success_rate') or 0:>8.3f} "
                  f"{r.get('rollout/reward_mean') or 0:>8.3f} {r.get('rollout/invalid_action_rate') or 0:>8.3f} "
                  f"{r.get('rollout/turns_mean') or 0:>6.2f}")
    budget = min(sum(r.get("tokens/generated") or 0.0 for r in rows) for rows in results.values())
    print(f"\nat an equal budget of {budget:.0f} rollout tokens (success over the scored episodes "
          "within it, +- one binomial standard error; iteration 1 is identical for every estimator):")
    summary = {}
    for est, rows in results.items():
        rate, n, used, eps = at_budget(rows, budget)
        first = float(rows[0].get("rollout/success_rate") or 0.0) if rows else 0.0
        half = rows[len(rows) // 2:]
        half_scored = [_scored(r) for r in half]
        half_eps = sum(e for _, e in half_scored)
        late = sum(s for s, _ in half_scored) / max(1.0, half_eps)
        summary[est] = {"success_at_budget": rate, "success_at_budget_se": binomial_se(rate, eps),
                        "iterations_in_budget": n, "tokens_in_budget": used, "episodes_in_budget": eps,
                        "success_iter1": first, "success_second_half": late,
                        "success_second_half_se": binomial_se(late, half_eps)}
        print(f"  {est:<12} success {rate:.3f} +- {binomial_se(rate, eps):.3f} over {n} iterations "
              f"({used:.0f} tokens, {eps:.0f} episodes); iteration 1: {first:.3f}; second half of the run: "
              f"{late:.3f} +- {binomial_se(late, half_eps):.3f}")
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"args": vars(args), "budget_tokens": budget, "summary": summary,
                                                  "iterations": results}, indent=1))
    print(f"\nwrote {out / 'results.json'}")


if __name__ == "__main__":
    main()
