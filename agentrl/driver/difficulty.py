"""The training run's difficulty filter (``env.difficulty_filter``): profiles of the training
tasks' pass rates at the current policy version, and the skip set they give the
``TaskSource`` (docs/eval-and-diagnose.md has the whole rule; ``agentrl tasks profile`` is
the same measurement as a command, ``agentrl.commands.profile``).

Iterations are numbered from 1 (docs/design.md, "Iteration numbering"). Before iteration 1
(and before every iteration ``i`` with ``(i - 1) % env.profile_every == 0`` when that is > 0)
the run's engines roll out every training task ``env.profile_samples`` times at the current
policy version; the tasks with pass rate 0 or 1 and equal rewards become the skip set until
the next profile. The profile's seed is ``run.seed + 1_000_003 * iteration`` (``profile_seed``):
other env instances and sampling seeds than the training's own requests. Its episodes are
stored with the iteration as ``kind='profile'`` (ids ``{run_id}/profile/it<i>/...``), its file
is ``RUN/profiles/iter_<i>.json`` (``i``: the iteration it was made before), and its tokens count as
generated and discarded work. When every task has pass rate 0 or 1 the run trains on all of
them (a warning and ``profile/fallback_all`` = 1).

Both controller modes profile through their source's ``before_iteration``: sync mode
(``agentrl.driver.sync_source``) with ``EnginePool.rollout`` between two iterations, async
mode (``agentrl.driver.stream_source``) on the running stream while no training request is
drawn or admitted. In either mode no weight load happens while the profile runs, so every
profile token is sampled at the one version the profile records (``profile`` checks it).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from typing import Any, Sequence

from agentrl.config import Config
from agentrl.driver.iteration import span
from agentrl.eval.difficulty import profile_from_outcomes, write_profile
from agentrl.errors import ContractError
from agentrl.eval.passk import task_outcomes
from agentrl.rollout.budget import RolloutBudget
from agentrl.tasks import TaskSource
from agentrl.types import SamplingRecord

log = logging.getLogger(__name__)


def rollout_budget(cfg: Config) -> RolloutBudget:
    """The rollout section's sampling and limits (what a training group sees); a profile
    records its ``record()``."""
    r = cfg.rollout
    return RolloutBudget(r.max_turns, r.max_new_tokens, r.max_context_tokens,
                         SamplingRecord(temperature=r.temperature, top_p=r.top_p, top_k=r.top_k))


def profile_seed(run_seed: int, iteration: int) -> int:
    """The seed of the run's profile before ``iteration`` (from 1; module docstring)."""
    return int(run_seed) + 1_000_003 * int(iteration)


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
        """Whether iteration ``it`` (from 1) starts with a profile: the filter is on and no
        profile was made yet (a new run, or a checkpoint without one), or ``it - 1`` is a
        multiple of ``env.profile_every`` and ``it`` was not profiled yet."""
        if not self.enabled:
            return False
        if tasks.skip is None:
            return True
        every = self.cfg.env.profile_every
        return every > 0 and (it - 1) % every == 0 and tasks.skip.iteration != it

    def restored(self, tasks: Any, done: int) -> None:
        """After ``tasks`` (a ``TaskSource``) was restored from the checkpoint after ``done``
        iterations, before iteration ``done + 1``, in either controller mode: with the filter on,
        the checkpoint's skip set stays (requests drawn from now on skip what the uninterrupted
        run skipped); with the filter off (a run resumed with ``env.difficulty_filter=off``), a
        skip set the checkpoint holds is dropped with a warning, so the order is the unfiltered
        one, as the setting says."""
        if not self.enabled and tasks.skip is not None:
            log.warning("env.difficulty_filter is off: the checkpoint's skip set (%d tasks, profiled before iteration "
                        "%d) is dropped; iteration %d on draws from every task", len(tasks.skip.task_ids),
                        tasks.skip.iteration, done + 1)
            tasks.clear_skip()

    def before_iteration(self, run: Any, it: int, pool: Any = None) -> dict[str, float]:
        """Profile before iteration ``it`` when ``due`` (``run``: the ``RunContext``), else ``{}``;
        the metrics include ``timeline/profile_start_s`` / ``_end_s``. ``pool``: what rolls the
        profile out (``profile``'s), None for ``run.pool``."""
        if not self.due(run.tasks, it):
            return {}
        run.phase(it, "profile")
        start = run.now_s()
        m = self.profile(run.pool if pool is None else pool, run.store, run.rd.path, run.run_id, it,
                         run.policy_version, run.tasks)
        m.update(span("profile", start, run.now_s()))
        return m

    def profile(self, pool: Any, store: Any, run_dir: Path, run_id: str, it: int, policy_version: int,
                tasks: TaskSource) -> dict[str, float]:
        """Profile every training task at ``policy_version`` on ``pool`` before iteration ``it``,
        store its episodes and file, set ``tasks``' skip set; returns the metrics (module docstring).

        ``pool``: anything with ``EnginePool.rollout``'s call, ``rollout(requests, policy_version)
        -> (episodes, seconds, metrics)`` (sync: the ``EnginePool``; async: the stream's
        ``_Streamer``), run with the run's own rollout budget.

        Raises:
            ContractError: a profile episode has a token sampled at another version than
                ``policy_version`` (a weight load ran during the profile).
        """
        t0 = time.perf_counter()
        cfg = self.cfg
        seed = profile_seed(cfg.run.seed, it)
        src = TaskSource(cfg.env.id, self.task_ids, seed, cfg.env.profile_samples, run_id=f"{run_id}/profile",
                         iteration=it)
        episodes, _, _ = pool.rollout(src.next_requests(len(self.task_ids)), policy_version)  # the run's own budget
        other = sorted({v for e in episodes for t in e.turns for v in t.policy_versions} - {int(policy_version)})
        if other:
            raise ContractError(f"difficulty profile before iteration {it}: tokens sampled at policy versions {other}, "
                                f"not only at {policy_version}; a profile must see one policy version")
        prof = profile_from_outcomes(task_outcomes(episodes), self.task_ids, env_id=cfg.env.id, split=cfg.env.split,
                                     policy_version=policy_version, samples=cfg.env.profile_samples, seed=seed,
                                     budget=rollout_budget(cfg).record(), source=run_id, iteration=it)
        skip = prof.skip_task_ids()
        fallback = len(skip) == len(self.task_ids)
        if fallback:
            counts = prof.counts()
            log.warning("difficulty profile before iteration %d: all %d tasks have pass rate 0 or 1 at policy version "
                        "%d (%d never solved, %d always solved); training on all of them", it, len(skip),
                        policy_version, counts["unsolved"], counts["solved"])
            skip = []
        tasks.set_skip(skip, policy_version=policy_version, iteration=it)
        store.add_episodes(run_id, it, episodes, kind="profile")
        write_profile(Path(run_dir) / "profiles" / f"iter_{it}.json", prof)
        m = prof.metrics()
        m.update({"profile/skipped_tasks": float(len(skip)), "profile/fallback_all": float(fallback),
                  "time/profile_s": time.perf_counter() - t0})
        return m

