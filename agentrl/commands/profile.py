"""Task difficulty profiling: ``agentrl tasks profile`` and the training run's difficulty
filter (``env.difficulty_filter``). Both are the evaluation machinery
(``agentrl.commands.evaluate``: ``TaskSource``-seeded requests, the normal rollout path,
``agentrl.eval.passk.task_outcomes``) on the *training* tasks, where overlap with training
is the point; the numbers are pass rates per task (``agentrl.eval.difficulty``).

Budget. A profile predicts what a training group will see, so it samples with the config's
*rollout* settings (``rollout.temperature``, ``max_turns``, ``max_new_tokens``,
``max_context_tokens``), not the ``eval`` section's held-out budget: ``agentrl tasks profile``
puts them in place of the eval budget, and the run's own profile calls the engines with the
run's settings.

``agentrl tasks profile`` (``profile_tasks``): ``agentrl eval``'s path (``evaluate``) with
``--allow-overlap`` on ``--split`` (default ``train``), ``--samples`` n and ``--seed`` s,
scored by the training reward (``judge=False``: an env's separate eval judge is not applied);
its episodes go to the replay store as that evaluation's run (``kind='eval'``, split in the
run id), and the pass rates to a JSON file (``--out``; default ``RUN/profiles/<eval run
id>.json`` for a run or checkpoint, ``<run.output_dir>/profiles/<eval run id>.json`` for a
bare model). Same seed, same numbers.

The training run's own profiles (``env.difficulty_filter``) are the driver's
(``agentrl.driver.difficulty``): the profile before iteration ``i`` (from 1) uses the seed
``run.seed + 1_000_003 * i`` (``profile_seed``), which ``agentrl tasks profile --seed``
reproduces for a run on the whole split.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from agentrl.config import Config, load_default_config
from agentrl.driver.checkpoint import RunDir
from agentrl.driver.difficulty import rollout_budget
from agentrl.eval.difficulty import TaskProfile, profile_from_outcomes, write_profile

log = logging.getLogger(__name__)

__all__ = ["ProfileResult", "profile_eval_overrides", "profile_overrides", "profile_tasks"]


@dataclass
class ProfileResult:
    """What ``agentrl tasks profile`` measured and where it put it.

    Attributes:
        profile: the pass rates; path: its JSON file.
        eval_run_id, replay_url: the store's run of its episodes (an evaluation run).
        rollout_s: wall seconds of the rollout.
    """

    profile: TaskProfile
    path: Path
    eval_run_id: str
    replay_url: str
    rollout_s: float


def profile_overrides(cfg: Config, *, split: str, samples: int, seed: int, num_tasks: int | None = None) -> list[str]:
    """The ``eval.*`` overrides that make ``agentrl eval``'s path a profile: ``split``,
    ``samples``, ``seed``, ``num_tasks`` and the rollout section's budget of ``cfg``."""
    b = rollout_budget(cfg).record()
    return [f"eval.split={split}", f"eval.samples={samples}", f"eval.seed={seed}",
            f"eval.num_tasks={'null' if num_tasks is None else num_tasks}", *(f"eval.{k}={v}" for k, v in b.items())]


def profile_eval_overrides(target: Any, overrides: Sequence[str] = (), *, env_id: str | None = None,
                           split: str = "train", samples: int = 4, seed: int | None = None,
                           num_tasks: int | None = None) -> tuple[list[str], Config]:
    """``(overrides for evaluate, the config they start from)`` of ``agentrl tasks profile`` on ``target`` (an
    ``EvalTarget``): the user's ``overrides``, the eval-during-training switches off (a profile
    trains nothing, so their checks against the rollout's limits, which a ``rollout.*``
    override may lower, do not apply), then ``profile_overrides`` of the config they give;
    ``seed`` None: that config's ``run.seed``.

    Raises:
        ConfigError: a bad override (the key and value named).
    """

    extra = [f"env.id={env_id}"] if env_id else []
    no_training_eval = ["eval.every=0", "eval.before_training=false", "eval.after_training=false"]
    base = (RunDir(target.run_dir).load_config([*extra, *overrides, *no_training_eval]) if target.run_dir is not None
            else load_default_config([*extra, *overrides, *no_training_eval]))
    seed = base.run.seed if seed is None else int(seed)
    return [*overrides, *no_training_eval,
            *profile_overrides(base, split=split, samples=samples, seed=seed, num_tasks=num_tasks)], base


def profile_tasks(given: str, overrides: Sequence[str] = (), *, env_id: str | None = None, split: str = "train",
                  samples: int = 4, seed: int | None = None, num_tasks: int | None = None, out: str | Path | None = None,
                  replay_url: str | None = None, progress: Callable[[str], None] | None = None,
                  on_settings: Callable[[dict[str, Any]], None] | None = None,
                  on_episodes: Callable[[int, int], None] | None = None) -> ProfileResult:
    """``agentrl tasks profile`` (module docstring): per-task pass rates of ``given`` on
    ``split`` with ``samples`` samples each; ``seed`` None: the config's ``run.seed``.
    ``progress``, ``on_settings`` (the budget and its source: the rollout section of the
    run's stored config or of the packaged default) and ``on_episodes`` (episodes finished,
    requested) are ``evaluate``'s.

    Raises:
        ConfigError: a bad target, override, env or split (as ``agentrl eval``).
        CheckpointError: an incomplete checkpoint.
        ClusterError: engines that could not start or were all lost.
    """
    from agentrl.cluster.actors.env_factory import env_task_ids  # heavy: ray
    from agentrl.commands.evaluate import budget_source, evaluate, resolve_target  # heavy: ray

    target = resolve_target(given)
    # the budget: the rollout section of the run's stored config, or of the packaged default
    # config for a bare model whatever its env (profile_eval_overrides)
    ov, base = profile_eval_overrides(target, overrides, env_id=env_id, split=split, samples=samples, seed=seed,
                                      num_tasks=num_tasks)
    # judge=False: the reward training sees (the env's declared eval judge, e.g. HumanEval's hidden check, is not applied)
    result = evaluate(given, ov, env_id=env_id, allow_overlap=True, replay_url=replay_url, progress=progress,
                      judge=False, on_settings=on_settings, on_episodes=on_episodes,
                      budget_from=budget_source(target, base if target.run_dir is not None else load_default_config(),
                                                overrides, section="rollout"))
    s = result.settings
    listed = env_task_ids(s["env"], s["split"], base.env.import_modules, base.env.kwargs)
    prof = profile_from_outcomes(result.report.per_task, listed, env_id=s["env"], split=s["split"],
                                 policy_version=result.target.policy_version, samples=s["samples"], seed=s["seed"],
                                 budget={k: s[k] for k in ("temperature", "max_turns", "max_new_tokens",
                                                           "max_context_tokens")},
                                 source=str(result.target.checkpoint or result.target.model))
    if out is None:
        folder = result.target.run_dir if result.target.run_dir is not None else Path(base.run.output_dir)
        out = Path(folder) / "profiles" / f"{result.run_id}.json"
    path = write_profile(out, prof)
    return ProfileResult(prof, path, result.run_id, result.replay_url, result.rollout_s)
