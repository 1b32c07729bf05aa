"""``agentrl eval`` and ``agentrl tasks profile``: held-out evaluation and per-task pass rates."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
import typer.core
from rich.console import Console

from agentrl.errors import AgentRLError

from agentrl.cli.app import app, tasks_app, console, DEBUG_HELP, fail


@app.command("eval")
def eval_cmd(
    target: str = typer.Argument(..., metavar="MODEL_OR_RUN_OR_CHECKPOINT", help="A run directory (its latest checkpoint), a checkpoint directory (RUN/checkpoints/iter_N), an exported folder, a local Hugging Face model folder, or a known model name (policy version 0)."),
    overrides: Optional[list[str]] = typer.Argument(None, help="key.sub=value overrides, e.g. eval.max_new_tokens=128 rollout.kv_cache_gb=1."),
    env: Optional[str] = typer.Option(None, "--env", help="Environment id (default: the run's env.id, or the packaged default config's)."),
    split: Optional[str] = typer.Option(None, "--split", help="Held-out split to evaluate (default: eval.split of the config the budget comes from, see above)."),
    samples: Optional[int] = typer.Option(None, "--samples", help="Samples per task n (default: eval.samples of that config): pass@1..n are reported."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of env instances, sampling and bootstrap (default: eval.seed of that config): same seed, same numbers."),
    num_tasks: Optional[int] = typer.Option(None, "--num-tasks", help="Only the split's first N tasks (default: eval.num_tasks of that config; all tasks when it is unset)."),
    allow_overlap: bool = typer.Option(False, "--allow-overlap", help="Evaluate even when the split shares tasks with the training split."),
    replay_url: Optional[str] = typer.Option(None, "--replay-url", help="Replay store for the eval episodes (default: the run's; runs/eval/replay.db for a bare model)."),
    debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
) -> None:
    """Evaluate a policy on held-out tasks with a fixed sampling budget: unbiased pass@1..n
    (Chen et al. 2021) with 95 % bootstrap intervals over tasks, mean reward and tokens.

    The budget (temperature with top_p 1 and top_k off, max_turns, max_new_tokens,
    max_context_tokens) and the eval's other settings (split, samples, seed, num_tasks) are the
    eval section of: the run's stored config (RUN/config.yaml) for a run or a checkpoint; the
    packaged default config (agentrl/defaults/shell_lookup.yaml: temperature 0.3, max_turns 4,
    max_new_tokens 128, 12 tasks) for an exported folder or a model on that config's env;
    otherwise the built-in defaults (temperature 1.0, max_turns 3, max_new_tokens 256, all
    tasks); max_context_tokens unset means the rollout's (2048 by default). Options and eval.*
    overrides change them. The budget in use and where it came from are printed before the
    rollout, and the settings line after it.

    Errored samples are left out of n, never counted as failures. The episodes go to the
    replay store marked as eval, tagged with the policy version; every warning (the
    known-harmless vLLM/Ray ones are not shown, --debug shows them) goes to console.log in
    RUN/eval/ (runs/eval/ for a bare model)."""
    from agentrl.commands.evaluate import evaluate
    from agentrl.eval.report import episode_progress
    from agentrl.logs import setup_console

    setup_console(debug)
    ov = list(overrides or []) + [f"eval.{k}={v}" for k, v in (("split", split), ("samples", samples), ("seed", seed),
                                                              ("num_tasks", num_tasks)) if v is not None]
    if not debug:  # a checkpoint's export loads and writes with transformers: no progress bars
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
    try:
        with episode_progress(console, "evaluating") as bar:
            result = evaluate(target, ov, env_id=env, allow_overlap=allow_overlap, replay_url=replay_url,
                              progress=bar.phase, on_settings=bar.settings, on_episodes=bar.episodes)
    except AgentRLError as exc:
        fail(exc, debug)
        return
    from agentrl.eval.report import format_settings, report_table

    typer.echo(format_settings(result.settings, result.target.policy_version))
    Console().print(report_table(result.report))
    typer.echo(f"episodes: run {result.run_id} in {result.replay_url} (kind eval, policy version "
               f"{result.target.policy_version})")


@tasks_app.command("profile")
def tasks_profile(
    target: str = typer.Argument(..., metavar="MODEL_OR_RUN_OR_CHECKPOINT", help="A run directory (its latest checkpoint), a checkpoint directory, an exported folder, a local Hugging Face model folder, or a known model name (policy version 0)."),
    overrides: Optional[list[str]] = typer.Argument(None, help="key.sub=value overrides, e.g. rollout.max_new_tokens=128 (the profile samples with the rollout section's settings)."),
    env: Optional[str] = typer.Option(None, "--env", help="Environment id (default: the run's env.id, or the packaged default config's)."),
    split: str = typer.Option("train", "--split", help="Split whose tasks are profiled (the training split: overlap with training is the point)."),
    samples: int = typer.Option(4, "--samples", min=1, help="Samples per task n; errored samples are left out of n."),
    seed: Optional[int] = typer.Option(None, "--seed", help="Seed of env instances and sampling (default: the config's run.seed): same seed, same numbers."),
    num_tasks: Optional[int] = typer.Option(None, "--num-tasks", min=1, help="Only the split's first N tasks (default all)."),
    out: Optional[Path] = typer.Option(None, "--out", help="JSON file for the pass rates (default: RUN/profiles/<eval run id>.json, or runs/profiles/... for a bare model)."),
    replay_url: Optional[str] = typer.Option(None, "--replay-url", help="Replay store for the episodes (default: the run's; runs/eval/replay.db for a bare model)."),
    debug: bool = typer.Option(False, "--debug", help=DEBUG_HELP),
) -> None:
    """Measure each task's pass rate under a policy: n samples per task through `agentrl eval`'s
    path, with the rollout section's sampling and limits (what a training group sees) of the
    run's stored config (RUN/config.yaml) for a run or checkpoint, else of the packaged default
    config (agentrl/defaults/shell_lookup.yaml); the budget in use and its source are printed
    first. Prints the pass rates and what `env.difficulty_filter` would skip (pass rate 0 or 1),
    writes them to a JSON file, and stores the episodes as an evaluation run of that split.
    Every warning goes to console.log beside `agentrl eval`'s (known-harmless vLLM/Ray ones are
    not shown; --debug shows them)."""
    from agentrl.commands.profile import profile_tasks
    from agentrl.eval.difficulty import profile_table
    from agentrl.eval.report import episode_progress
    from agentrl.logs import setup_console

    setup_console(debug)
    try:
        with episode_progress(console, "profiling") as bar:
            res = profile_tasks(target, list(overrides or []), env_id=env, split=split, samples=samples, seed=seed,
                                num_tasks=num_tasks, out=out, replay_url=replay_url, progress=bar.phase,
                                on_settings=bar.settings, on_episodes=bar.episodes)
    except AgentRLError as exc:
        fail(exc, debug)
        return
    Console().print(profile_table(res.profile))
    c = res.profile.counts()
    typer.echo(f"{c['mixed']} tasks kept, {c['unsolved']} never solved, {c['solved']} always solved, {c['unknown']} "
               f"without a scored sample; pass rates: {res.path}; episodes: run {res.eval_run_id} in {res.replay_url}")

