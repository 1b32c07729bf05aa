"""Benchmark: synchronous against asynchronous training on the same work and hardware, on an
environment whose steps have long-tailed latency (longtail_env.py).

Run on demand (pytest does not collect this file)::

    .venv/bin/python tests/benchmarks/bench_async.py --tiny --out runs/bench-async-tiny     # quick check
    # about 2x throughput at max_staleness 2: 64 episodes per update, so no update waits on a slow
    # group while almost every sync round does (docs/benchmarks.md, "Sync against async")
    .venv/bin/python tests/benchmarks/bench_async.py --tiny --tasks 16 --repeats 2 --out runs/bench-async-t16
    .venv/bin/python tests/benchmarks/bench_async.py --iterations 4 --out runs/bench-async  # SmolLM2-135M fp32
    .venv/bin/python tests/benchmarks/bench_async.py --max-staleness 1 --partial-rollout drain --iterations 8
    # learning curves of both modes over three seeds, on a reward the tiny model can climb:
    .venv/bin/python tests/benchmarks/bench_async.py --tiny-semantic --env words --max-guesses 1 --lr 3e-2 \
        --seeds 0 1 2 --out runs/bench-async-words          # add --tasks 16 for the target setting
    # the issue-12 setting, with a held-out eval of each run's final policy (docs/benchmarks.md numbers):
    .venv/bin/python tests/benchmarks/bench_async.py --tiny-semantic --env words --max-guesses 1 --lr 1e-2 \
        --tasks 16 --iterations 40 --seeds 0 1 2 3 4 --eval-tasks 32 --out runs/bench-async-t16-i40-policy
    # the same report again from an earlier --out folder's runs, with this file's statistics:
    .venv/bin/python tests/benchmarks/bench_async.py --report runs/bench-async-t16-i40-policy

One invocation, one Ray instance started here, two runs one after the other with
``agentrl.driver.controller.train``: ``controller.mode=sync``, then ``controller.mode=async``
with ``--max-staleness`` and ``--partial-rollout`` (``--repeats N``: N such pairs, interleaved;
every run and each pair's ratio are printed, and each mode's best run is the one reported). The two configs differ in ``controller.*``
and ``run.dir`` only: same model, seed, tasks (the same task order), group size, iterations,
sampling, trainer, and ``rollout.env_workers`` large enough that no environment step waits
for a thread in either mode ((k + 1) x tasks x group size).

Environment: ``bench/LongTailGuess-v0`` (``tests/benchmarks/longtail_env.py``):
``agentrl/GuessNumber-v0`` (secret 1..10, 5 guesses, reward 1 on the right guess) whose every
step first waits ``--fast-step-s`` (0.2 s), or ``--slow-step-s`` (5 s) with probability
``--slow-prob`` (0.1), deterministically per task instance and step.

Printed, and written to ``--out``/results.json with every per-iteration metric:

* per run: iterations, wall seconds of the training loop (first iteration's start to the
  last update's or sync's end, from ``timeline/*``; start-up and the final checkpoint left
  out), episodes/s, trained tokens/s (``tokens/trained``: loss tokens), rollout tokens/s;
* async / sync ratios of episodes/s and trained tokens/s, against the target (>= 2x with
  ``max_staleness`` <= 2); with several seeds, per seed (a seed fixes the work) and their
  geometric mean, which the target reads (``seed_ratios``), beside the ideal pipelined bound
  from the sync run's own phase times (per round the slowest of rollout and credit + update +
  sync, against their sum;
  ``async_report.ideal_pipelined_bound``), and the ceiling that the async run's own trainer
  side sets (sync loop seconds / the async run's credit + update + sync seconds: on two shared
  CPU cores the update slows down while the engine generates beside it);
* the async run's staleness histogram (trained rows per policy-version lag) and
  ``async/stale_dropped``;
* the learning curve of both runs: reward and success rate per iteration against cumulative
  rollout tokens, and each run's success rate (+- one binomial standard error) over its first
  B rollout tokens, B the smaller run's total (``async_report.success_within_budget``), for
  "not worse beyond noise";
* the policy curve (``async_curves.policy_curve``): each policy version's mean reward on the
  trained episodes it sampled, against the rollout tokens trained before that version, from
  each run's replay store. The training curve above puts an update's samples at that update,
  so async mode's curve runs behind by its samples' lag (up to k versions) even when its policy
  learns as fast; this one compares policy with policy. With several seeds the rewards at the
  common budget are compared over seeds (``async_curves.compare_at_budget``: repeats of a seed
  averaged, and the paired difference per seed), and the target needs the policy curve within
  the seeds' spread as well as the throughput (not applied with ``--partial-rollout restart``,
  whose versions keep only the episodes that finished before the next update);
* with ``--eval-tasks N``: each run's final policy evaluated on N held-out test tasks after
  ``train()`` returned (``eval_final_policy``), and the two modes' mean eval reward over seeds
  with its spread (``async_curves.compare_values``). The training curve compares lagged
  samples (async rows come from policies up to k versions older); this compares the policies.

Written to ``--out``: ``timeline_sync.svg`` and ``timeline_async.svg`` (one lane per phase,
one bar per iteration, on the same time axis), ``results.json``, and each run's directory
(``sync/``, ``async/``: metrics.jsonl, replay.db, config). The machine's load changes while
this runs (2 cores shared by other jobs here): the load average is printed before and after
each run. Exits 1 when the target is missed (with ``--max-staleness`` <= 2): the throughput, and with
more than one run of each mode the policy curve.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))  # run from a checkout
sys.path.insert(0, str(HERE))  # longtail_env (env.import_modules) and async_report; Ray's workers get the same path

import async_curves as curves  # noqa: E402
import async_report as rep  # noqa: E402

TARGET_RATIO = 2.0
TARGET_MAX_STALENESS = 2
ENV_MODULE = "longtail_env"
WORDS_MODULE = "longtail_words_env"


def _load_avg() -> str:
    return "/".join(f"{x:.1f}" for x in os.getloadavg())


def overrides(args: argparse.Namespace, mode: str, model_path: str, run_dir: Path) -> list[str]:
    """The config overrides of one run: everything but ``run.dir``, ``run.name`` and
    ``controller.mode`` is the same for both modes (``controller.max_staleness`` and
    ``controller.partial_rollout`` are set in both; sync mode ignores them)."""
    slots = (args.max_staleness + 1) * args.tasks * args.group_size
    env = getattr(args, "env", "guess")
    if env == "words":  # bench/LongTailWords-v0: a reward the tiny model climbs, the same latency profile
        from longtail_words_env import ENV_ID

        game = [f"env.id={ENV_ID}", f"env.import_modules=[{ENV_MODULE}, {WORDS_MODULE}]",
                f"env.kwargs.max_turns={args.max_guesses}"]
    else:
        from longtail_env import ENV_ID

        game = [f"env.id={ENV_ID}", f"env.import_modules=[{ENV_MODULE}]", f"env.kwargs.max_guesses={args.max_guesses}"]
    return [
        f"run.dir={run_dir}", f"run.name=bench-async-{mode}", f"run.seed={args.seed}",
        f"run.iterations={args.iterations}", f"run.checkpoint_every={args.iterations}",
        f"model.path={model_path}",
        *game, f"env.tasks_per_iteration={args.tasks}", f"env.group_size={args.group_size}",
        f"env.kwargs.fast_step_s={args.fast_step_s}", f"env.kwargs.slow_step_s={args.slow_step_s}",
        f"env.kwargs.slow_prob={args.slow_prob}", f"env.kwargs.latency_seed={args.latency_seed}",
        f"rollout.max_turns={args.max_guesses}", f"rollout.max_new_tokens={args.max_new_tokens}",
        f"rollout.env_workers={max(8, slots)}", f"rollout.max_num_seqs={max(64, slots)}",
        f"rollout.num_engines={getattr(args, 'engines', 1)}",
        f"algorithm.advantage={args.advantage}", f"trainer.lr={args.lr}",
        f"controller.mode={mode}", f"controller.max_staleness={args.max_staleness}",
        f"controller.partial_rollout={args.partial_rollout}",
        "eval.before_training=false", "eval.after_training=false",  # the default's evals: same work in both modes
        *args.set,
    ]


def run_mode(args: argparse.Namespace, mode: str, model_path: str, repeat: int = 1, seed: int | None = None
             ) -> dict[str, Any]:
    """Train one run of ``mode`` with ``run.seed = seed`` (None: ``--seed``) into
    ``--out``/``mode`` (``mode-<repeat>`` after the first repeat, ``-s<seed>`` with several
    seeds) and summarise it from its metrics.jsonl."""
    from agentrl.driver.controller import train
    from agentrl.config import load_config

    seeds = getattr(args, "seeds", None) or [args.seed]
    seed = args.seed if seed is None else seed
    run_dir = args.out / (mode + (f"-s{seed}" if len(seeds) > 1 else "") + ("" if repeat == 1 else f"-{repeat}"))
    cfg = load_config(None, overrides(argparse.Namespace(**{**vars(args), "seed": seed}), mode, model_path, run_dir))
    load0 = _load_avg()
    t0 = time.perf_counter()
    summary = train(cfg)
    total_s = time.perf_counter() - t0
    final_eval = eval_final_policy(args, run_dir) if getattr(args, "eval_tasks", 0) else None
    return summarise(mode, rep.load_metrics(run_dir / "metrics.jsonl"), run_id=summary.run_id, run_dir=str(run_dir),
                     policy_version=summary.policy_version, train_call_s=total_s, load=f"{load0} -> {_load_avg()}",
                     repeat=repeat, seed=seed, final_eval=final_eval,
                     policy_samples=_samples_or_none(cfg.replay.url or run_dir, run_dir, summary.run_id),
                     max_staleness=args.max_staleness if mode == "async" else 0)


def _samples_or_none(store_at: str | Path, run_dir: Path, run_id: str
                     ) -> tuple[list[tuple[int, float]], dict[str, float]] | None:
    """``trained_samples`` of the run's own store (its ``replay.url``, else the run directory's
    ``replay.db``); None, with the reason printed, when they cannot be read: the run's
    throughput is kept."""
    try:
        return trained_samples(store_at, run_id)
    except Exception as exc:  # the store is the run's, already written; the report goes on without a policy curve
        print(f"bench_async: no policy curve for {run_dir}: {type(exc).__name__}: {exc}", file=sys.stderr)
        return None


def trained_samples(store_at: str | Path, run_id: str) -> tuple[list[tuple[int, float]], dict[str, float]]:
    """``(policy version, reward)`` of every episode the run's updates consumed, from its replay
    store (a run directory holding ``replay.db``, or a URL), and counts: ``episodes``, ``mixed``
    (episodes whose tokens span versions). Counted: kind ``train``, not errored or aborted, and
    the newest attempt of its request (a group dropped as stale is re-issued with ``attempt +
    1``; its old attempt was never trained). Groups that dynamic sampling filtered out count:
    they are the policy's samples too. The version is the newest that sampled any of the
    episode's tokens (``policy_version_max``; ``async_curves.policy_curve``)."""
    from agentrl import open_replay_store

    store = open_replay_store(store_at)
    try:
        eps = store.list_episodes(run_id, kind="train", limit=10**9)
    finally:
        store.close()
    newest: dict[str, tuple[int, Any]] = {}  # request (episode id without its attempt) -> (attempt, episode)
    for e in eps:
        if e.is_error or e.policy_version_max is None or e.total_reward is None:
            continue
        req, _, attempt = e.episode_id.rpartition("/a")
        n = int(attempt) if attempt.isdigit() else 0
        if req not in newest or n > newest[req][0]:
            newest[req] = (n, e)
    kept = [e for _, e in newest.values()]
    return ([(e.policy_version_max, e.total_reward) for e in kept],
            {"episodes": float(len(kept)),
             "mixed": float(sum(e.policy_version_min != e.policy_version_max for e in kept))})


def eval_final_policy(args: argparse.Namespace, run_dir: Path) -> dict[str, Any]:
    """Held-out evaluation of a run's final policy (its last checkpoint: ``run.checkpoint_every``
    is ``--iterations``), after ``train()`` returned, so it costs neither mode any training
    time: ``--eval-tasks`` test tasks x ``--eval-samples`` samples, the rollout's sampling
    (temperature 1.0) and limits, seed 0 for both modes (``agentrl.commands.evaluate``, as
    ``agentrl eval RUN``). Compares the two modes' policies after the same number of updates on
    the same number of episodes, which the training curve cannot: async mode's training rewards
    come from policies up to ``max_staleness`` versions older than the one being trained."""
    from agentrl.commands.evaluate import evaluate

    t0 = time.perf_counter()
    result = evaluate(str(run_dir), [
        "eval.split=test", f"eval.num_tasks={args.eval_tasks}", f"eval.samples={args.eval_samples}", "eval.seed=0",
        f"eval.max_turns={args.max_guesses}", f"eval.max_new_tokens={args.max_new_tokens}", "eval.temperature=1.0",
    ])
    m = result.report.metrics()
    return {"policy_version": result.target.policy_version, "reward_mean": m["eval/reward_mean"],
            "reward_mean_low": m["eval/reward_mean_low"], "reward_mean_high": m["eval/reward_mean_high"],
            "pass@1": m["eval/pass@1"], "samples_scored": m["eval/samples_scored"],
            "samples_errored": m["eval/samples_errored"], "eval_s": time.perf_counter() - t0}


def best_runs(all_runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per mode, the run with the most trained tokens/s: the least disturbed by other jobs on
    a shared machine (others' load only ever slows a run down), as bench_trainer.py keeps each
    variant's best of ``--rounds``."""
    best: dict[str, dict[str, Any]] = {}
    for r in all_runs:
        cur = best.get(r["mode"])
        if cur is None or r["throughput"]["trained_tokens_per_s"] > cur["throughput"]["trained_tokens_per_s"]:
            best[r["mode"]] = r
    return best


def seed_ratios(all_runs: list[dict[str, Any]]) -> dict[int, dict[str, float]]:
    """Per seed with runs of both modes: async / sync episodes/s and trained tokens/s of that
    seed's best run of each mode (over repeats, ``best_runs``). A seed fixes the work (task
    order, hence which steps are slow, and the sampling), so only runs of one seed are compared;
    across seeds the ratios are averaged (``async_curves.geometric_mean``), never the fastest run
    of one seed against the fastest of another."""
    out: dict[int, dict[str, float]] = {}
    for seed in sorted({r.get("seed", 0) for r in all_runs}):
        best = best_runs([r for r in all_runs if r.get("seed", 0) == seed])
        if "sync" in best and "async" in best:
            s, a = best["sync"]["throughput"], best["async"]["throughput"]
            out[seed] = {k: (a[k] / s[k] if s[k] > 0 else math.nan) for k in ("episodes_per_s", "trained_tokens_per_s")}
    return out


def _run_line(r: dict[str, Any]) -> str:
    t = r["throughput"]
    return (f"{r['mode']:5s}: {t['iterations']:.0f} iterations, {t['wall_s']:7.1f} s training loop "
            f"({r['train_call_s']:.1f} s in train() with start-up, seed {r.get('seed', 0)}), {t['episodes']:.0f} episodes "
            f"{t['episodes_per_s']:.3f}/s, {t['trained_tokens']:.0f} trained tokens "
            f"{t['trained_tokens_per_s']:.1f}/s, {t['rollout_tokens']:.0f} rollout tokens "
            f"{t['rollout_tokens_per_s']:.1f}/s   (load {r['load']})"
            + ("   [timeline reconstructed from time/*]" if r["timeline_reconstructed"] else ""))


def summarise(mode: str, history: list[dict[str, Any]], **meta: Any) -> dict[str, Any]:
    """One run's numbers from its per-iteration metrics (``async_report``), with ``meta``
    (run id, run dir, ``train_call_s``, ``load``) kept beside them; the sync run also gets its
    ideal pipelined bound."""
    spans, reconstructed = rep.phase_spans(history)
    out: dict[str, Any] = {
        "mode": mode, **meta, "timeline_reconstructed": reconstructed,
        "throughput": rep.throughput(history, spans), "curve": rep.learning_curve(history),
        "staleness_hist": rep.staleness_histogram(history),
        "stale_dropped": sum(float(m.get("async/stale_dropped") or 0.0) for m in history),
        "spans": spans, "history": history,
    }
    if mode == "sync":
        out["ideal"] = rep.ideal_pipelined_bound(history)
    got = out.pop("policy_samples", None)
    if got is not None:  # the policy's own curve (async_curves.policy_curve); versions whose groups all trained
        samples, counts = got
        updates = [(int(m.get("policy_version", i + 1)), float(m.get("rollout/generated_tokens") or 0.0))
                   for i, m in enumerate(history)]
        last = meta.get("policy_version")
        last = updates[-1][0] if last is None and updates else int(last or 0)
        out["policy_samples"] = counts
        out["policy_curve"] = curves.policy_curve(samples, updates, last - 1 - int(meta.get("max_staleness") or 0))
    return out


def trainer_busy_s(history: list[dict[str, Any]]) -> float:
    """Seconds the trainer side (``time/credit_s + time/update_s + time/sync_s``) took over a
    run: an asynchronous run cannot finish its updates faster than this, however well the
    rollouts hide behind them."""
    return sum(float(m.get(f"time/{p}_s") or 0.0) for m in history for p in ("credit", "update", "sync"))


def _fmt_curve(run: dict[str, Any]) -> list[str]:
    lines = [f"  {run['mode']}: iteration  rollout tokens  reward_mean  success_rate"]
    for p in run["curve"]:
        lines.append(f"  {'':{len(run['mode'])}}  {p['iteration']:9.0f}  {p['rollout_tokens']:14.0f}  "
                     f"{p['reward_mean']:11.3f}  {p['success_rate']:12.3f}")
    return lines


def _mean_tail(curve: list[dict[str, float]], key: str, n: int) -> float:
    vals = [p[key] for p in curve[-n:] if not math.isnan(p[key])]
    return sum(vals) / len(vals) if vals else math.nan


def report(args: argparse.Namespace, all_runs: list[dict[str, Any]], model: str
           ) -> tuple[list[str], dict[str, Any], bool]:
    """The printed lines, the JSON summary and whether the target was met (True when it does
    not apply: one mode only, or ``max_staleness`` above the target's). With several repeats
    every run and each repeat's ratio are listed, and the rest is about each mode's best run
    (``best_runs``)."""
    lines: list[str] = []
    runs = best_runs(all_runs)
    summary: dict[str, Any] = {"model": model, "args": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}}
    if len(all_runs) > len(runs):
        lines.append("every run, in the order run:")
        lines.extend(f"  repeat {r.get('repeat', 1)}: " + _run_line(r) for r in all_runs)
        pairs: dict[tuple[int, int], dict[str, float]] = {}
        for r in all_runs:
            pairs.setdefault((r.get("repeat", 1), r.get("seed", 0)), {})[r["mode"]] = r["throughput"]["trained_tokens_per_s"]
        each = {k: p["async"] / p["sync"] for k, p in pairs.items() if "sync" in p and "async" in p and p["sync"] > 0}
        if each:
            lines.append("  async / sync trained tokens/s per interleaved pair (repeat, seed): "
                         + ", ".join(f"{v:.2f}x {k}" for k, v in each.items()))
            summary["ratio_per_repeat"] = list(each.values())
        lines.append("best run of each mode (the least disturbed by the machine's other jobs):")
    lines.extend(_run_line(r) for r in runs.values())
    ok = True
    if "sync" in runs:
        ideal = runs["sync"]["ideal"]
        lines.append(f"ideal pipelined bound (sync run's rounds): lock-step {ideal['lockstep_s']:.1f} s, slowest stage "
                     f"per round {ideal['pipelined_s']:.1f} s -> {ideal['bound']:.2f}x")
        for i, x in enumerate(ideal["rounds"], 1):
            lines.append(f"  round {i}: rollout {x['rollout_s']:6.2f} s   credit+update+sync {x['train_s']:6.2f} s")
        summary["ideal_bound"] = ideal["bound"]
    applies = args.max_staleness <= TARGET_MAX_STALENESS
    if "sync" in runs and "async" in runs:
        s, a = runs["sync"]["throughput"], runs["async"]["throughput"]
        per_seed = seed_ratios(all_runs)
        summary["ratio_per_seed"] = per_seed
        ratios = {k: (curves.geometric_mean(v) if v and all(x > 0 for x in v) else math.nan)
                  for k in ("episodes_per_s", "trained_tokens_per_s") for v in [[r[k] for r in per_seed.values()]]}
        summary["ratios"] = ratios
        # the statistic before 4 December 2026 (fastest run of each mode, across seeds): kept for comparison
        summary["ratios_best_of_each"] = {k: (a[k] / s[k] if s[k] > 0 else math.nan)
                                          for k in ("episodes_per_s", "trained_tokens_per_s")}
        met = all(x >= TARGET_RATIO for x in ratios.values())  # NaN: not met
        ok = met or not applies
        verdict = ("met" if met else "MISSED") if applies else f"not applied (max_staleness > {TARGET_MAX_STALENESS})"
        if len(per_seed) > 1:
            logs = [math.log(r["trained_tokens_per_s"]) for r in per_seed.values() if r["trained_tokens_per_s"] > 0]
            se = statistics.stdev(logs) / math.sqrt(len(logs)) if len(logs) > 1 else math.nan
            summary["ratio_geomean_se_log"] = se
            lines.append("async / sync trained tokens/s per seed (the same work: task order and latencies are per seed; "
                         "best run of each mode over repeats): "
                         + ", ".join(f"seed {sd}: {r['trained_tokens_per_s']:.2f}x" for sd, r in per_seed.items())
                         + f"; lowest {min(r['trained_tokens_per_s'] for r in per_seed.values()):.2f}x; geometric mean "
                         f"+- one standard error {ratios['trained_tokens_per_s'] * math.exp(-se):.2f}.."
                         f"{ratios['trained_tokens_per_s'] * math.exp(se):.2f}x; fastest run of each mode across seeds "
                         f"{summary['ratios_best_of_each']['trained_tokens_per_s']:.2f}x")
        lines.append(f"async / sync at max_staleness={args.max_staleness}, partial_rollout={args.partial_rollout}"
                     + (f", geometric mean over {len(per_seed)} seeds" if len(per_seed) > 1 else "")
                     + f": episodes/s {ratios['episodes_per_s']:.2f}x, trained tokens/s "
                     f"{ratios['trained_tokens_per_s']:.2f}x (ideal pipelined bound {runs['sync']['ideal']['bound']:.2f}x); "
                     f"target >= {TARGET_RATIO}x: {verdict}")
        lines.append("  (the bound prices overlapping rollout with the update only; async mode also keeps up to "
                     f"{args.max_staleness + 1} x {args.tasks} groups in flight, so waiting on slow steps overlaps too)")
        busy = trainer_busy_s(runs["async"]["history"])
        ceiling = runs["sync"]["throughput"]["wall_s"] / busy if busy > 0 else math.nan
        summary["async_trainer_busy_s"], summary["trainer_ceiling"] = busy, ceiling
        lines.append(f"  async run's trainer side (credit + update + sync) busy {busy:.1f} s of its {a['wall_s']:.1f} s "
                     f"({100 * busy / a['wall_s']:.0f}%): with its own update times async could reach at most "
                     f"{ceiling:.2f}x (sync loop {s['wall_s']:.1f} s / {busy:.1f} s)")
    if "async" in runs:
        r = runs["async"]
        lines.append(f"staleness histogram, async run (trained rows per policy-version lag); "
                     f"stale rows dropped: {r['stale_dropped']:.0f}")
        lines.extend(rep.format_histogram(r["staleness_hist"]))
    lines.append("learning curve (reward and success against cumulative rollout tokens):")
    n_tail = max(1, args.iterations // 2)
    for mode, r in runs.items():
        lines.extend(_fmt_curve(r))
    for mode, r in runs.items():
        lines.append(f"  {mode}: last {n_tail} iterations: reward_mean {_mean_tail(r['curve'], 'reward_mean', n_tail):.3f}, "
                     f"success_rate {_mean_tail(r['curve'], 'success_rate', n_tail):.3f}")
    budget = min(r["throughput"]["rollout_tokens"] for r in runs.values())
    summary["success_within_budget"] = {}
    for mode, r in runs.items():
        b = rep.success_within_budget(r["history"], budget)
        summary["success_within_budget"][mode] = b
        lines.append(f"  {mode}: success rate within the first {budget:.0f} rollout tokens (whole iterations: "
                     f"{b['iterations']:.0f}, {b['rollout_tokens']:.0f} tokens, {b['episodes']:.0f} episodes): "
                     f"{b['success_rate']:.3f} +- {b['se']:.3f}")
    if len({r.get("seed", 0) for r in all_runs}) > 1 and {"sync", "async"} <= {r["mode"] for r in all_runs}:
        cmp = curves.compare_seeds({m: [r["curve"] for r in all_runs if r["mode"] == m] for m in ("sync", "async")})
        summary["seed_comparison"] = cmp
        lines.append(f"reward at the common budget of {cmp['budget_tokens']:.0f} rollout tokens (mean reward_mean of "
                     f"the iterations ending in its last {100 * cmp['window']:.0f}%), every run (seeds, repeats):")
        for mode, c in cmp["modes"].items():
            seeds = [r.get("seed", 0) for r in all_runs if r["mode"] == mode]
            lines.append(f"  {mode:5s}: " + ", ".join(f"seed {sd}: {v:.3f} (from {v0:.3f})" for sd, v, v0
                                                    in zip(seeds, c["per_seed"], c["start_per_seed"]))
                         + f"; mean {c['mean']:.3f} +- {c['std']:.3f} (sd), range {c['min']:.3f}..{c['max']:.3f}")
        lines.append(curves.verdict_line("training samples' reward at the budget", cmp))
        lines.append("  (async's samples at an update were drawn by policies up to max_staleness versions older: "
                     "this curve runs behind by that lag even when the policy learns as fast; the policy curve below "
                     "counts each sample for the policy that drew it)")
    pruns = [r for r in all_runs if r.get("policy_curve")]
    pcmp = curves.compare_at_budget({m: [(r.get("seed", 0), r["policy_curve"]) for r in pruns if r["mode"] == m]
                                     for m in ("sync", "async")})
    if pcmp is not None:
        summary["policy_comparison"] = pcmp
        lines.append(f"policy curve (async_curves.policy_curve): each policy version's reward on the trained episodes "
                     f"credited to it, against the rollout tokens trained before it; at the common budget of "
                     f"{pcmp['budget_tokens']:.0f} trained tokens (mean of the versions in its last "
                     f"{100 * pcmp['window']:.0f}%), per seed (repeats averaged):")
        for mode, c in pcmp["modes"].items():
            mixed = sum(r["policy_samples"]["mixed"] for r in pruns if r["mode"] == mode)
            total = sum(r["policy_samples"]["episodes"] for r in pruns if r["mode"] == mode)
            lines.append(f"  {mode:5s}: " + ", ".join(f"seed {sd}: {v:.3f}" for sd, v in zip(c["seeds"], c["per_seed"]))
                         + f"   ({total:.0f} episodes, {mixed:.0f} spanning versions, credited to the newest)")
        n_seeds = min(pcmp["modes"][m]["n"] for m in ("sync", "async"))
        if n_seeds > 1:  # the verdict needs a spread over seeds
            lines.append(curves.verdict_line("policy reward at the budget", pcmp))
            lines.append(f"  paired over seeds {pcmp['paired_seeds']}: async - sync = {pcmp['paired_difference']:+.3f} "
                         f"(standard error {pcmp['paired_se']:.3f})")
            gate = applies and args.partial_rollout != "restart"
            summary["curve_within_noise"] = pcmp["within_noise"]
            ok = ok and (pcmp["within_noise"] or not gate)
            lines.append("learning target (policy curve not worse beyond the seeds' spread): "
                         + (("met" if pcmp["within_noise"] else "MISSED") if gate else
                            "not applied (" + ("partial_rollout=restart: a version keeps only the episodes that "
                                               "finished before the next update" if applies else
                                               f"max_staleness > {TARGET_MAX_STALENESS}") + ")"))
    elif pruns:
        lines.append("policy curve: no comparison (a mode has no curve past version 0; more --iterations than "
                     "max_staleness + 1 are needed)")
    evals = [r for r in all_runs if r.get("final_eval")]
    if evals:
        lines.append(f"held-out eval of each run's final policy ({args.eval_tasks} test tasks x {args.eval_samples} "
                     "samples, temperature 1.0, after train() returned):")
        for r in evals:
            e = r["final_eval"]
            lines.append(f"  {r['mode']:5s} seed {r.get('seed', 0)}: policy version {e['policy_version']}, reward_mean "
                         f"{e['reward_mean']:.3f} [{e['reward_mean_low']:.3f}, {e['reward_mean_high']:.3f}], pass@1 "
                         f"{e['pass@1']:.3f} ({e['samples_scored']:.0f} scored, {e['samples_errored']:.0f} errored)")
        if {"sync", "async"} <= {r["mode"] for r in evals}:
            ecmp = curves.compare_values({m: [r["final_eval"]["reward_mean"] for r in evals if r["mode"] == m]
                                          for m in ("sync", "async")})
            summary["final_eval_comparison"] = ecmp
            lines.append(curves.verdict_line("final-policy reward_mean", ecmp))
    summary["runs"] = {m: {k: v for k, v in r.items() if k != "history"} for m, r in runs.items()}
    summary["history"] = {m: r["history"] for m, r in runs.items()}
    summary["all_runs"] = [{k: v for k, v in r.items() if k not in ("history", "spans")} for r in all_runs]
    summary["target_met"] = ok
    return lines, summary, ok


def write_timelines(out: Path, runs: dict[str, dict[str, Any]]) -> list[Path]:
    """``timeline_<mode>.svg`` per run, each from its first iteration's start, all on the time
    axis of the longest run."""
    t0 = {m: min((s[2] for s in r["spans"]), default=0.0) for m, r in runs.items()}  # start-up left out
    t_max = max(max((s[3] for s in r["spans"]), default=0.0) - t0[m] for m, r in runs.items())
    paths = []
    for mode, r in runs.items():
        t = r["throughput"]
        note = (f"{t['episodes_per_s']:.3f} episodes/s, {t['trained_tokens_per_s']:.1f} trained tokens/s"
                + ("; async rollout lane = the update's wait for complete groups (engines generate throughout)"
                   if mode == "async" else "")
                + ("; reconstructed from time/* (no timeline/* metrics)" if r["timeline_reconstructed"] else ""))
        p = out / f"timeline_{mode}.svg"
        p.write_text(rep.timeline_svg(r["spans"], f"{mode} run ({r['run_id']})", t0_s=t0[mode], t_max_s=t_max,
                                      note=note))
        paths.append(p)
    return paths


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, help="output folder (new or empty): runs, SVGs, results.json")
    p.add_argument("--report", type=Path, metavar="DIR",
                   help="run nothing: report an earlier invocation's --out folder again with this file's statistics "
                        "(writes report.json beside its results.json, and redraws its SVGs)")
    p.add_argument("--tiny", action="store_true", help="the tiny random model (quick check; its curve means nothing)")
    p.add_argument("--tiny-semantic", action="store_true",
                   help="the tiny model with SmolLM2's token embeddings projected to its 64 dimensions "
                        "(semantic_tiny.py): a model whose --env words reward moves within the bench's updates")
    p.add_argument("--model", help="model: an agentrl.model_zoo name or a folder (default smollm2-135m-instruct, "
                                   "or tiny-random-smollm2 with --tiny)")
    p.add_argument("--modes", nargs="+", default=["sync", "async"], choices=["sync", "async"],
                   help="runs to make, in this order (default both; ratios need both)")
    p.add_argument("--iterations", type=int, default=20,
                   help="run.iterations of each run (updates; the first one's start-up costs weigh less with more)")
    p.add_argument("--tasks", type=int, default=4,
                   help="env.tasks_per_iteration: groups per update (16: about 2x throughput at max_staleness 2 here, "
                        "updates long enough that k of them cover a slow step; docs/benchmarks.md)")
    p.add_argument("--group-size", type=int, default=4, help="env.group_size")
    p.add_argument("--engines", type=int, default=1, help="rollout.num_engines (both modes)")
    p.add_argument("--repeats", type=int, default=1,
                   help="run the modes this many times, interleaved; each mode's best run is reported (a shared "
                        "machine's other jobs only slow a run down)")
    p.add_argument("--max-staleness", type=int, default=2, help="controller.max_staleness of the async run")
    p.add_argument("--partial-rollout", default="continue", choices=["continue", "drain", "restart"],
                   help="controller.partial_rollout of the async run")
    p.add_argument("--fast-step-s", type=float, default=0.2, help="seconds of an ordinary environment step")
    p.add_argument("--slow-step-s", type=float, default=5.0, help="seconds of a slow environment step")
    p.add_argument("--slow-prob", type=float, default=0.1, help="probability that a step is slow")
    p.add_argument("--latency-seed", type=int, default=0, help="seed of the per-step latency draw")
    p.add_argument("--max-guesses", type=int, default=5, help="GuessNumber's guesses (also rollout.max_turns)")
    p.add_argument("--max-new-tokens", type=int, default=32, help="rollout.max_new_tokens per turn (bench_credit.py's)")
    p.add_argument("--advantage", default="grpo", help="algorithm.advantage")
    p.add_argument("--lr", type=float, default=1e-5, help="trainer.lr (bench_credit.py's: 1e-6 barely moves in a few updates)")
    p.add_argument("--seed", type=int, default=0, help="run.seed (task order, sampling, init)")
    p.add_argument("--seeds", type=int, nargs="+", default=None,
                   help="several run.seed values: one sync/async pair per seed (and repeat), for the learning curves' "
                        "seed-to-seed spread (default: --seed only)")
    p.add_argument("--env", choices=["guess", "words"], default="guess",
                   help="guess: bench/LongTailGuess-v0 (GuessNumber; the tiny model scores 0 on it); words: "
                        "bench/LongTailWords-v0 (a graded text reward the tiny model climbs); same latency profile")
    p.add_argument("--eval-tasks", type=int, default=0,
                   help="after each run, evaluate its final policy on this many held-out test tasks (0: no eval); "
                        "compares the two modes' policies, not their lagged training rewards")
    p.add_argument("--eval-samples", type=int, default=4, help="samples per eval task (with --eval-tasks)")
    p.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE", help="more config overrides, both runs")
    args = p.parse_args(argv)
    from agentrl.errors import ConfigError
    from longtail_env import check_latency_profile

    for name in ("iterations", "repeats", "tasks", "group_size", "engines", "max_guesses", "max_new_tokens"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}={getattr(args, name)} must be >= 1")
    if args.eval_tasks < 0 or args.eval_samples < 1:
        raise ConfigError(f"--eval-tasks={args.eval_tasks} must be >= 0 and --eval-samples={args.eval_samples} >= 1")
    if args.max_staleness < 0:
        raise ConfigError(f"--max-staleness={args.max_staleness} must be >= 0")
    check_latency_profile(args.fast_step_s, args.slow_step_s, args.slow_prob)
    if args.report is not None:
        return args
    if args.out is None:
        raise ConfigError("--out is required (or --report DIR to report an earlier run)")
    if args.out.exists() and any(args.out.iterdir()):
        raise ConfigError(f"--out={args.out} is not empty; give a new folder")
    return args


def main(argv: list[str] | None = None) -> int:
    from agentrl.errors import AgentRLError

    try:
        args = parse_args(argv)
    except AgentRLError as exc:
        print(f"bench_async: error: {exc}", file=sys.stderr)
        return 2
    if args.report is not None:
        try:
            return rereport(args.report)
        except AgentRLError as exc:
            print(f"bench_async: error: {exc}", file=sys.stderr)
            return 2
    from agentrl.cluster.actors.ray_connect import connect
    from agentrl.config import load_config
    from agentrl.model_zoo import prepare_model

    import ray

    model_name = args.model or ("tiny-random-smollm2" if args.tiny or args.tiny_semantic else "smollm2-135m-instruct")
    model = str(prepare_model(model_name)) if not Path(model_name).is_dir() else model_name
    args.out.mkdir(parents=True, exist_ok=True)
    if args.tiny_semantic:  # the tiny model with SmolLM2's embeddings (PCA): a reward it can learn (semantic_tiny)
        import semantic_tiny

        model_name = "tiny-semantic"
        model = str(semantic_tiny.build(args.out / "model-tiny-semantic", Path(model),
                                        prepare_model("smollm2-135m-instruct")))
    print(f"model: {model}; CPU ({os.cpu_count()} cores); {args.tasks} tasks x {args.group_size} per update, "
          f"{args.iterations} updates; steps {args.fast_step_s} s, {args.slow_step_s} s with p={args.slow_prob}; "
          f"async: max_staleness={args.max_staleness}, partial_rollout={args.partial_rollout}; env {args.env}; "
          f"seeds {args.seeds or [args.seed]}; {args.engines} engine(s), {args.max_new_tokens} new tokens per turn, "
          f"{args.max_guesses} turns; load average {_load_avg()}", flush=True)
    from agentrl.cluster.actors.cpu_threads import role_threads

    for mode in args.modes:
        c = load_config(None, overrides(args, mode, model, args.out / "unused"))
        print(f"  {mode}: OpenMP threads per engine {role_threads(c, 'rollout')}, per trainer rank "
              f"{role_threads(c, 'trainer')} (agentrl.cluster.actors.cpu_threads)", flush=True)
    all_runs: list[dict[str, Any]] = []
    started = connect(load_config(None, [f"run.dir={args.out / 'ray'}"]))
    try:
        for k in range(1, args.repeats + 1):  # interleaved: sync, async, sync, async, ...
            for seed in args.seeds or [args.seed]:
                for mode in args.modes:
                    print(f"{mode} run (seed {seed}{f', repeat {k}' if args.repeats > 1 else ''}; load average "
                          f"{_load_avg()}) ...", flush=True)
                    all_runs.append(run_mode(args, mode, model, k, seed))
    finally:
        if started:
            ray.shutdown()
    lines, summary, ok = report(args, all_runs, model)
    print("\n".join(lines))
    write_outputs(args, all_runs, summary, model_name)
    return 0 if ok else 1


def write_outputs(args: argparse.Namespace, all_runs: list[dict[str, Any]], summary: dict[str, Any],
                  model_name: str, json_name: str = "results.json") -> None:
    """The timelines, ``curves.svg``, ``policy_curves.svg`` and the summary (``json_name``) into ``--out``."""
    for p in write_timelines(args.out, best_runs(all_runs)):
        print(f"wrote {p}")
    svg = args.out / "curves.svg"
    svg.write_text(curves.curves_svg(
        [(f"{r['mode']} seed {r.get('seed', 0)}" + (f" r{r['repeat']}" if args.repeats > 1 else ""), r["mode"], r["curve"])
         for r in all_runs], f"reward_mean against rollout tokens ({args.env}, {model_name})",
        note=f"max_staleness={args.max_staleness}, {args.tasks} tasks x {args.group_size} per update"))
    print(f"wrote {svg}")
    pruns = [r for r in all_runs if r.get("policy_curve")]
    if pruns:
        svg = args.out / "policy_curves.svg"
        svg.write_text(curves.curves_svg(
            [(f"{r['mode']} seed {r.get('seed', 0)}" + (f" r{r['repeat']}" if args.repeats > 1 else ""), r["mode"],
              r["policy_curve"]) for r in pruns],
            f"each policy version's reward on its own samples, against the rollout tokens trained before it ({args.env})",
            note=f"max_staleness={args.max_staleness}, {args.tasks} tasks x {args.group_size} per update"))
        print(f"wrote {svg}")
    (args.out / json_name).write_text(json.dumps(summary, indent=2, default=str))
    print(f"wrote {args.out / json_name}")


def rereport(out: Path) -> int:
    """``--report DIR``: the report of an earlier invocation's runs, with this file's statistics:
    each run summarised again from its ``metrics.jsonl`` and replay store (run directories as
    ``DIR``/results.json lists them, or found under ``DIR`` by name); what only the invocation
    knew (load, start-up time, final eval) is taken from that results.json, which is kept as
    it was; the new summary goes to ``report.json`` beside it (and the SVGs are redrawn). Exits
    as the invocation would have."""
    from agentrl.errors import ConfigError

    path = out / "results.json"
    if not path.is_file():
        raise ConfigError(f"--report {out}: no results.json there; expected an earlier bench_async --out folder")
    old = json.loads(path.read_text())
    args = argparse.Namespace(**{**vars(parse_args(["--out", str(out), "--report", str(out)])), **old["args"]})
    args.out, args.report = out, out
    all_runs = []
    for r in old["all_runs"]:
        run_dir = Path(r["run_dir"])
        if not run_dir.is_dir():
            run_dir = out / run_dir.name
        kept = {k: r[k] for k in ("run_id", "run_dir", "policy_version", "train_call_s", "load", "repeat", "seed",
                                  "final_eval") if k in r}
        k = args.max_staleness if r["mode"] == "async" else 0
        all_runs.append(summarise(r["mode"], rep.load_metrics(run_dir / "metrics.jsonl"), **kept, max_staleness=k,
                                  policy_samples=_samples_or_none(run_dir, run_dir, r["run_id"])))
    lines, summary, ok = report(args, all_runs, old["model"])
    print(f"report of {out} (runs as recorded; statistics of this bench_async.py)")
    print("\n".join(lines))
    write_outputs(args, all_runs, summary, Path(old["model"]).name, json_name="report.json")
    return 0 if ok else 1

if __name__ == "__main__":
    raise SystemExit(main())
