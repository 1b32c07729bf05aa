"""Task difficulty profiling: ``agentrl tasks profile`` and the training run's difficulty
filter (``env.difficulty_filter``). Both are the evaluation machinery
(``agentrl.cluster.evaluate``: ``TaskSource``-seeded requests, the normal rollout path,
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

During training (``DifficultyFilter``, sync mode): before iteration 0 (and before every
iteration ``i`` with ``i % env.profile_every == 0`` when that is > 0) the run's engines roll
out every training task ``env.profile_samples`` times at the current policy version; the
tasks with pass rate 0 or 1 and equal rewards (``agentrl.eval.difficulty``: a partial-credit
reward that differs between samples keeps a task) become the ``TaskSource``'s skip set until
the next profile. The
profile's seed is ``run.seed + 1_000_003 * (iteration + 1)``: other env instances and
sampling seeds than the training's own requests (with ``run.seed`` the profile of iteration
0 would sample exactly the episodes iteration 0 then trains on), and ``agentrl tasks
profile --seed`` reproduces it for a run on the whole split (the CLI profiles the split, not
``env.task_ids``: another task list, so other env instances and seeds). Its episodes are
stored with the iteration as ``kind='profile'`` (ids under ``{run_id}/profile``; a resume
rewinds and re-runs them with the iteration), its file is ``RUN/profiles/iter_<i>.json``,
and the iteration's metrics get ``profile/*``, ``tokens/profile_generated``, ``time/profile_s``; the profile's tokens are
added to ``tokens/generated`` and ``tokens/discarded`` (generated, never trained: filtered
work is paid work). When every task has pass rate 0 or 1 the run trains on all of them
(a warning and ``profile/fallback_all`` = 1): stopping a run whose policy solves everything,
or nothing, mid-way would lose it, and the metric says the filter did nothing.

Resume: the skip set and the profile's policy version and iteration are in the
``TaskSource`` state of every checkpoint; a resumed run re-profiles only where the
uninterrupted run profiled (the profile before iteration ``i`` comes after checkpoint
``i``, so it is re-run with the same weights and seed).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Sequence

from agentrl.config import Config, load_default_config
from agentrl.eval.difficulty import TaskProfile, profile_from_outcomes, write_profile
from agentrl.eval.passk import task_outcomes
from agentrl.tasks import TaskSource

log = logging.getLogger(__name__)

__all__ = ["DifficultyFilter", "ProfileResult", "fold_profile", "profile_eval_overrides", "profile_overrides", "profile_seed",
           "profile_tasks", "rollout_budget"]


def rollout_budget(cfg: Config) -> dict[str, Any]:
    """The rollout section's sampling and limits (what a training group sees), as recorded in a profile."""
    r = cfg.rollout
    return {"temperature": r.temperature, "max_turns": r.max_turns, "max_new_tokens": r.max_new_tokens,
            "max_context_tokens": r.max_context_tokens}


def profile_seed(run_seed: int, iteration: int) -> int:
    """The seed of the run's profile before ``iteration`` (module docstring)."""
    return int(run_seed) + 1_000_003 * (int(iteration) + 1)


def fold_profile(credit_metrics: dict[str, float], profiled: dict[str, float]) -> None:
    """Put a profile's metrics (``DifficultyFilter.before_iteration``'s; ``{}``: nothing) into
    the iteration's credit metrics, its tokens counted as paid work: ``tokens/generated`` and
    ``tokens/discarded`` grow by ``tokens/profile_generated``."""
    if not profiled:
        return
    paid = float(profiled.get("tokens/profile_generated", 0.0))
    credit_metrics.update(profiled)
    credit_metrics["tokens/generated"] = credit_metrics.get("tokens/generated", 0.0) + paid
    credit_metrics["tokens/discarded"] = credit_metrics.get("tokens/discarded", 0.0) + paid


class DifficultyFilter:
    """The run's difficulty profiles and skip set (module docstring).

    Args:
        cfg: the run's config (``env.difficulty_filter``, ``profile_samples``, ``profile_every``).
        task_ids: the training tasks (the ``TaskSource``'s).
    """

    def __init__(self, cfg: Config, task_ids: Sequence[str]) -> None:
        self.cfg = cfg
        self.task_ids = list(task_ids)
        self.enabled = cfg.env.difficulty_filter != "off"

    def due(self, tasks: TaskSource, it: int) -> bool:
        """Whether iteration ``it`` starts with a profile: the filter is on and no profile was
        made yet (a new run, or a checkpoint without one), or ``it`` is a multiple of
        ``env.profile_every`` not profiled yet."""
        if not self.enabled:
            return False
        if tasks.skip is None:
            return True
        every = self.cfg.env.profile_every
        return every > 0 and it % every == 0 and tasks.skip["iteration"] != it

    def restored(self, tasks: Any, start_iter: int) -> None:
        """After ``tasks`` (a ``TaskSource``) was restored from a checkpoint, before iteration
        ``start_iter``: with the filter off (a run resumed with ``env.difficulty_filter=off``, or
        in ``controller.mode=async``, which refuses the filter), a skip set the checkpoint holds
        is dropped with a warning, so the order is the unfiltered one, as the setting says."""
        if not self.enabled and tasks.skip is not None:
            log.warning("env.difficulty_filter is off: the checkpoint's skip set (%d tasks, profiled before iteration "
                        "%d) is dropped; iteration %d on draws from every task", len(tasks.skip["skip_task_ids"]),
                        tasks.skip["iteration"] + 1, start_iter + 1)
            tasks.clear_skip()

    def before_iteration(self, run: Any, it: int) -> dict[str, float]:
        """Profile before iteration ``it`` when ``due`` (``run``: the ``RunContext``), else ``{}``;
        the metrics include ``timeline/profile_start_s`` / ``_end_s``."""
        if not self.due(run.tasks, it):
            return {}
        from agentrl.cluster.iteration import span

        run.phase(it, "profile")
        start = run.now_s()
        m = self.profile(run.pool, run.store, run.rd.path, run.run_id, it, run.policy_version, run.tasks)
        m.update(span("profile", start, run.now_s()))
        return m

    def profile(self, pool: Any, store: Any, run_dir: Path, run_id: str, it: int, policy_version: int,
                tasks: TaskSource) -> dict[str, float]:
        """Profile every training task at ``policy_version`` on ``pool`` before iteration ``it``,
        store its episodes and file, set ``tasks``' skip set; returns the metrics (module docstring)."""
        t0 = time.perf_counter()
        cfg = self.cfg
        seed = profile_seed(cfg.run.seed, it)
        src = TaskSource(cfg.env.id, self.task_ids, seed, cfg.env.profile_samples, run_id=f"{run_id}/profile",
                         iteration=it)
        episodes, _, _ = pool.rollout(src.next_requests(len(self.task_ids)), policy_version)  # the run's own budget
        prof = profile_from_outcomes(task_outcomes(episodes), self.task_ids, env_id=cfg.env.id, split=cfg.env.split,
                                     policy_version=policy_version, samples=cfg.env.profile_samples, seed=seed,
                                     budget=rollout_budget(cfg), source=run_id, iteration=it)
        skip = prof.skip_task_ids()
        fallback = len(skip) == len(self.task_ids)
        if fallback:
            counts = prof.counts()
            log.warning("difficulty profile before iteration %d: all %d tasks have pass rate 0 or 1 at policy version "
                        "%d (%d never solved, %d always solved); training on all of them", it + 1, len(skip),
                        policy_version, counts["unsolved"], counts["solved"])
            skip = []
        tasks.set_skip(skip, policy_version=policy_version, iteration=it)
        store.add_episodes(run_id, it, episodes, kind="profile")
        write_profile(Path(run_dir) / "profiles" / f"iter_{it}.json", prof)
        m = prof.metrics()
        m.update({"profile/skipped_tasks": float(len(skip)), "profile/fallback_all": float(fallback),
                  "time/profile_s": time.perf_counter() - t0})
        return m


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
    b = rollout_budget(cfg)
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
    from agentrl.cluster.checkpoint import RunDir

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
    from agentrl.cluster.actors import env_task_ids
    from agentrl.cluster.evaluate import budget_source, evaluate, resolve_target

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
    listed = env_task_ids(s["env"], s["split"], base.env.import_modules)
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
