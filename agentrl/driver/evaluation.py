"""Evaluation of held-out tasks, shared by ``agentrl eval`` (``agentrl.commands.evaluate``)
and evaluation during training (``TrainingEval`` here, ``agentrl.driver.dedicated_eval`` in
async mode): which tasks are held out, the requests of one eval (``TaskSource``-seeded, so
the same seed gives the same env instances and sampling seeds), the eval section's budget and
the one report (pass@k with bootstrap intervals, ``agentrl.eval.passk``).
"""

from __future__ import annotations

import time
from typing import Any, Sequence

from agentrl.cluster.actors.env_factory import env_task_ids
from agentrl.config import Config
from agentrl.driver.judge import judge_env_kwargs
from agentrl.errors import ConfigError
from agentrl.eval.passk import EvalReport, summarize, task_outcomes
from agentrl.rollout.budget import RolloutBudget
from agentrl.tasks import BEFORE_TRAINING, TaskSource
from agentrl.types import Episode, EpisodeRequest


def held_out_task_ids(cfg: Config, train_cfg: Config | None, *, allow_overlap: bool = False) -> list[str]:
    """The eval's task ids (``cfg.eval.split``, its first ``cfg.eval.num_tasks``), checked to
    be held out from the training tasks (module docstring).

    Raises:
        ConfigError: an unknown env or split; an overlap without ``allow_overlap``; a
            ``num_tasks`` larger than the split.
    """
    ids = env_task_ids(cfg.env.id, cfg.eval.split, cfg.env.import_modules, cfg.env.kwargs)
    if cfg.eval.num_tasks is not None:
        if cfg.eval.num_tasks > len(ids):
            raise ConfigError(f"eval.num_tasks={cfg.eval.num_tasks} but split {cfg.eval.split!r} of {cfg.env.id!r} "
                              f"has {len(ids)} tasks")
        ids = ids[: cfg.eval.num_tasks]
    if train_cfg is not None and train_cfg.env.id != cfg.env.id:
        return ids  # another env than the one trained on: nothing to overlap
    if train_cfg is not None:
        train_split = train_cfg.env.split
        train_ids = list(train_cfg.env.task_ids) if train_cfg.env.task_ids is not None else \
            env_task_ids(cfg.env.id, train_split, cfg.env.import_modules, train_cfg.env.kwargs)
        whose = f"the run's training tasks (env.split={train_split!r})"
    else:
        train_split = "train"
        train_ids = env_task_ids(cfg.env.id, "train", cfg.env.import_modules, cfg.env.kwargs)
        whose = f"the training split 'train' of {cfg.env.id}"
    train_set = set(train_ids)
    shared = [t for t in ids if t in train_set]
    if shared and not allow_overlap:
        raise ConfigError(
            f"--split {cfg.eval.split!r} shares {len(shared)} of its {len(ids)} tasks with {whose} (e.g. "
            f"{shared[:3]}): that is not a held-out evaluation; use a held-out split (e.g. --split test) or pass "
            "--allow-overlap to evaluate on them anyway"
        )
    return ids


def eval_requests(cfg: Config, task_ids: Sequence[str], run_id: str,
                  iteration: int = BEFORE_TRAINING) -> list[EpisodeRequest]:
    """Each task once with ``cfg.eval.samples`` rollouts (a ``TaskSource`` seeded with
    ``cfg.eval.seed``): the same env instances and sampling seeds for every eval with that
    seed; ``iteration`` (the iteration whose policy is measured, from 1; ``BEFORE_TRAINING``
    for the starting policy) only enters the episode ids."""
    tasks = TaskSource(cfg.env.id, list(task_ids), cfg.eval.seed, cfg.eval.samples, run_id=run_id, iteration=iteration)
    return tasks.next_requests(len(task_ids))


def eval_report(episodes: Sequence[Episode], cfg: Config) -> EvalReport:
    """pass@1..``eval.samples``, mean reward and tokens of ``episodes`` with the ``eval``
    section's bootstrap (seed, resamples, confidence): the one summary ``agentrl eval``, eval
    during training and the async eval engine all report (``agentrl.eval.passk``)."""
    ev = cfg.eval
    return summarize(task_outcomes(episodes), range(1, ev.samples + 1), seed=ev.seed,
                     num_resamples=ev.num_resamples, confidence=ev.confidence)


def eval_budget(cfg: Config, *, judge: bool = True) -> RolloutBudget:
    """The eval section's sampling (its temperature, top_p 1, top_k off) and limits, as
    ``RolloutActor.rollout``'s ``budget``, with the env kwargs of the eval's judge
    (``env_kwargs``: ``agentrl.driver.judge``) and, when ``eval.judge`` is set, the eval's
    LLM judge (``RolloutBudget.judge = "eval"``); ``judge=False``: ``cfg.env.kwargs`` as they
    are and no LLM judge (the training reward's rule, ``eval_config``)."""
    ev = cfg.eval
    kwargs = judge_env_kwargs(cfg.env.id, cfg.env.kwargs, cfg.env.import_modules) if judge else dict(cfg.env.kwargs)
    return RolloutBudget.at_temperature(ev.temperature, max_turns=ev.max_turns, max_new_tokens=ev.max_new_tokens,
                                        max_context_tokens=ev.max_context_tokens, env_kwargs=kwargs,
                                        judge="eval" if judge and ev.judge is not None else "none")


class TrainingEval:
    """Evaluation during training on the run's engines (sync mode; the ``Evaluator`` of
    ``agentrl.driver.loop``), with the eval section's budget (``eval_budget``); no training
    runs meanwhile, so each eval measures exactly one policy version:

    - ``eval.every = N > 0``: after every N-th iteration's update and weight sync, at the new
      policy version (``after_sync``);
    - ``eval.after_training``: after the last iteration's update and sync too (the final
      policy; once, when ``every`` already evaluates that iteration);
    - ``eval.before_training``: before iteration 1, at the version the run starts from
      (``before``; iteration ``BEFORE_TRAINING`` = 0 in its episode ids; metrics
      ``eval_before/*``, in iteration 1's line).

    ``land`` hands the loop what was evaluated since the last line: the episodes, which the
    loop stores with the iteration's rows as ``kind='eval'`` (a resume rewinds and re-runs
    them with the iteration), with ids under ``{run_id}/eval/it<i>`` (``i`` the iteration
    measured; before training: ``{run_id}/eval-before/it0``), and the ``eval/*`` keys plus ``eval/policy_version``,
    ``time/eval_s`` and ``timeline/eval_*`` (before training: the same under ``eval_before``).

    Built at start-up, so an eval split that is not held out (or unknown) is a
    ``ConfigError`` before any rollout. The async loop's evaluator
    (``agentrl.driver.dedicated_eval.DedicatedEval``) uses its ``task_ids`` and ``due``.
    """

    def __init__(self, cfg: Config) -> None:
        self.cfg = cfg
        self.task_ids = held_out_task_ids(cfg, cfg, allow_overlap=cfg.eval.allow_overlap) if cfg.eval.during_training else []
        self._episodes: list[Episode] = []  # evaluated, not landed yet
        self._metrics: dict[str, float] = {}

    def due(self, it: int) -> bool:
        """Whether the policy after iteration ``it`` (from 1) is evaluated."""
        ev = self.cfg.eval
        return (ev.every > 0 and it % ev.every == 0) or (ev.after_training and it == self.cfg.run.iterations)

    def due_before(self, done: int) -> bool:
        """Whether the run evaluates its starting policy (``eval.before_training``, a run with
        ``done`` = 0 iterations done)."""
        return self.cfg.eval.before_training and done == 0

    def before(self, run: Any, done: int) -> None:
        """Evaluate the starting policy now when ``due_before(done)`` (``run``: the ``RunContext``)."""
        if self.due_before(done):
            run.phase(done + 1, "eval before training")
            self._evaluate(run, BEFORE_TRAINING, "eval_before")

    def snapshot(self, run: Any, it: int, updated: bool) -> Any:
        return None  # the engines load the weights themselves

    def after_sync(self, run: Any, it: int, payload: Any) -> None:
        """Evaluate the new policy version when ``due(it)``; nothing trains meanwhile."""
        if self.due(it):
            run.phase(it, "eval")
            self._evaluate(run, it, "eval")

    def poll(self) -> None:
        return None

    def land(self, run: Any, it: int, final: bool) -> tuple[list[Episode], dict[str, float]]:
        """What was evaluated since the last line."""
        out = (self._episodes, self._metrics)
        self._episodes, self._metrics = [], {}
        return out

    def pending_state(self) -> dict[str, Any] | None:
        return None  # every eval lands in the iteration that ran it: nothing is pending at a checkpoint

    def kill(self) -> None:
        return None

    def _evaluate(self, run: Any, it: int, name: str) -> None:
        t0 = time.perf_counter()
        ids_under = f"{run.run_id}/eval" if name == "eval" else f"{run.run_id}/eval-before"
        requests = eval_requests(self.cfg, self.task_ids, ids_under, iteration=it)
        episodes, _, _ = run.pool.rollout(requests, run.policy_version, eval_budget(self.cfg))
        report = eval_report(episodes, self.cfg)
        self._episodes += episodes
        self._metrics.update(report.metrics(prefix=f"{name}/"))
        self._metrics.update({f"{name}/policy_version": float(run.policy_version),
                              f"time/{name}_s": time.perf_counter() - t0,
                              f"timeline/{name}_start_s": t0 - run.t0, f"timeline/{name}_end_s": run.now_s()})


def store_eval_episodes(store: Any, run_id: str, episodes: list[Episode], iteration: int = BEFORE_TRAINING) -> None:
    """Store eval episodes as ``kind='eval'``, kept apart from the training rows of ``iteration``
    (``BEFORE_TRAINING`` = 0 by default: ``agentrl eval``'s, outside any training iteration)."""
    store.add_episodes(run_id, iteration, episodes, kind="eval")
