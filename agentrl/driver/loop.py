"""The training loop's one body, for both controller modes: per iteration, take episodes
from a ``BatchSource`` (with DAPO dynamic sampling's refill), credit, the trainer step,
the weight sync, evaluation, the replay and metrics writes, the checkpoint.

What differs between the modes lives behind two small interfaces:

* ``BatchSource``: where an update's episodes come from, what runs while the trainer
  steps, how the engines get the new weights, and what a checkpoint must hold of it.
  ``agentrl.driver.sync_source.SyncSource`` (``controller.mode: sync``) drains the
  ``TaskSource`` with ``pool.rollout`` before each update; ``agentrl.driver.stream_source.
  StreamSource`` (``controller.mode: async``) takes complete groups from a ``GroupBuffer``
  the engines keep filling, under the staleness bound.
* ``Evaluator``: evaluation during training. ``agentrl.driver.evaluation.TrainingEval``
  runs on the rollout engines after the weight sync (sync mode);
  ``agentrl.driver.dedicated_eval.DedicatedEval`` on an engine of its own while training
  goes on (async mode). Either hands back ``(episodes, metrics)`` from ``land``; the loop
  stores the episodes (``kind='eval'``) under the iteration they land in, before that
  iteration's own rows, so a resume that rewinds the iteration drops both together.

Iterations are numbered from 1 (docs/design.md, "Iteration numbering"): the loop variable
``it`` is the iteration's number, 1 .. ``run.iterations``, and every value that leaves the
loop (episode ids, replay rows, ``metrics.jsonl``, checkpoint ``iter_N``, profiles, kill
points, messages) is that number; after iteration ``it``, ``it`` iterations are done.

Per iteration, in order (the write order crash safety depends on is
``agentrl.driver.iteration``'s): stamp the iteration on the ``TaskSource``; the source's
``before_iteration`` (sync: the difficulty profile); take ``env.tasks_per_iteration``
groups, then at most ``algorithm.max_refill_rounds`` refills of the groups dynamic sampling
filters (``take_update``); ``kill_point("mid_rollout")``; credit; the trainer step (the source
decides what runs meanwhile; ``kill_point("mid_update")``); the weight sync (when the update
trained anything; ``kill_point("mid_sync")``) and the evaluator's ``after_sync``; the landed
eval; ``record_iteration``; ``checkpoint_if_due`` with the source's and evaluator's state;
``end_iteration``. With a judge, the judging of the taken episodes is a phase of its own
(``timeline/judge_*``, ``time/judge_s``, ``time/judge_tail_s``: ``iteration.judge_phase``).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from functools import partial
from typing import Any, Callable, Protocol

from agentrl.credit import missing_groups
from agentrl.driver.checkpoint import kill_point
from agentrl.driver.difficulty import fold_profile
from agentrl.driver.iteration import (
    RunContext,
    UpdateResult,
    checkpoint_if_due,
    compute_credit,
    end_iteration,
    judge_phase,
    judge_tail_s,
    record_iteration,
    span,
    train_on,
)
from agentrl.types import Episode

log = logging.getLogger(__name__)


@dataclass
class Taken:
    """Episodes a source handed over for one update.

    Attributes:
        episodes: the episodes to credit (aborted ones included: stored, never scored).
        dropped: episodes set aside unscored (async: stale groups), stored with the iteration.
        seconds: rollout seconds (``time/rollout_s``): the pool's rollout time (sync) or the
            time the update waited for complete groups (async).
        judge_tail_s: of those, the seconds spent waiting on judgements alone
            (``iteration.judge_tail_s``, set by ``take_update`` per rollout round; summed).
    """

    episodes: list[Episode] = field(default_factory=list)
    dropped: list[Episode] = field(default_factory=list)
    seconds: float = 0.0
    judge_tail_s: float = 0.0

    def __add__(self, other: Taken) -> Taken:
        return Taken(self.episodes + other.episodes, self.dropped + other.dropped, self.seconds + other.seconds,
                     self.judge_tail_s + other.judge_tail_s)


class BatchSource(Protocol):
    """Where an update's episodes come from (module docstring)."""

    def before_iteration(self, run: RunContext, it: int) -> dict[str, float]:
        """Work before iteration ``it``'s rollout (sync: the difficulty profile); its metrics."""

    def take(self, groups: int) -> Taken:
        """``groups`` complete groups of episodes for the update."""

    def more(self, missing: int) -> Taken:
        """``missing`` further groups (dynamic sampling's refill): the groups taken so far that
        selection filters are not trained."""

    def while_updating(self, step: Callable[[], UpdateResult], after_submit: Callable[[], None]) -> UpdateResult:
        """Run the trainer step ``step`` (``after_submit`` once it started); its result."""

    def sync_weights(self, version: int, payload: Any) -> dict[str, float]:
        """Give every engine the trainer's weights as ``version`` (``payload``: a weight
        snapshot to reuse, or None); the sync metrics."""

    def after_sync(self, sync_metrics: dict[str, float]) -> dict[str, float]:
        """The update's weight sync is over (``sync_metrics``: ``sync_weights``'s, ``{}``
        when the update trained nothing and none ran); the sync metrics to record."""

    def metrics(self, taken: Taken, credit: Any, version: int) -> tuple[dict[str, float], dict[str, float]]:
        """``(pool_metrics, extra)`` of the update that started from ``version``: the pool's
        (``cluster/engines*``, ``rollout/engine_*``) and the source's own (``async/*``)."""

    def checkpoint_state(self) -> tuple[str, dict[str, Any]]:
        """``(in_flight note, extra controller state)`` for a checkpoint after this update."""

    def stop(self, interrupted: bool) -> None:
        """The loop is over (``interrupted``: by SIGINT / SIGTERM)."""


class Evaluator(Protocol):
    """Evaluation during training (module docstring)."""

    def before(self, run: RunContext, done: int) -> None:
        """Before iteration ``done + 1`` (``done``: iterations done, 0 for a new run): evaluate
        (or queue) the starting policy when due."""

    def snapshot(self, run: RunContext, it: int, updated: bool) -> Any:
        """Before iteration ``it``'s weight sync: a weight snapshot for the sync to send and the
        evaluator to keep (``updated``: the update trained anything), or None."""

    def after_sync(self, run: RunContext, it: int, payload: Any) -> None:
        """After iteration ``it``'s weight sync: evaluate (or queue) the new version when due."""

    def poll(self) -> None:
        """Without blocking: move evals along (called between engine collects)."""

    def land(self, run: RunContext, it: int, final: bool) -> tuple[list[Episode], dict[str, float]]:
        """The eval episodes and metrics that go into iteration ``it``'s line; ``final``: the
        run's last iteration (wait for what is still running)."""

    def pending_state(self) -> dict[str, Any] | None:
        """The checkpoint's ``eval`` entry (evals not landed yet), or None."""

    def kill(self) -> None:
        """End what the evaluator runs (idempotent)."""


class NoEval:
    """The ``Evaluator`` of a run without evaluation during training."""

    def before(self, run: RunContext, done: int) -> None:
        return None

    def snapshot(self, run: RunContext, it: int, updated: bool) -> Any:
        return None

    def after_sync(self, run: RunContext, it: int, payload: Any) -> None:
        return None

    def poll(self) -> None:
        return None

    def land(self, run: RunContext, it: int, final: bool) -> tuple[list[Episode], dict[str, float]]:
        return [], {}

    def pending_state(self) -> dict[str, Any] | None:
        return None

    def kill(self) -> None:
        return None


def take_update(run: RunContext, source: BatchSource, shaped: dict[str, list[float]]) -> tuple[Taken, int]:
    """An update's episodes: ``B = env.tasks_per_iteration`` groups from ``source``, then, while
    dynamic sampling's selection (``missing_groups``) keeps fewer than ``B`` groups, further
    groups, at most ``algorithm.max_refill_rounds`` times (DAPO, Yu et al. 2025, section 3.2).
    ``shaped``: each episode's shaped rewards, computed once per iteration and reused by
    credit. Returns ``(taken, refills)``."""
    cfg = run.cfg
    B = cfg.env.tasks_per_iteration
    since = time.time()
    taken = source.take(B)
    taken.judge_tail_s = judge_tail_s(taken.episodes, since)  # each round's own wait on judges alone
    refills = 0
    while refills < cfg.algorithm.max_refill_rounds:
        missing = missing_groups(taken.episodes, cfg.algorithm, groups_wanted=B,
                                 max_new_tokens=cfg.rollout.max_new_tokens, shaped_cache=shaped)
        if missing <= 0:
            break
        since = time.time()
        more = source.more(missing)
        more.judge_tail_s = judge_tail_s(more.episodes, since)
        taken = taken + more
        refills += 1
    return taken, refills


def run_loop(run: RunContext, source: BatchSource, evaluator: Evaluator, done: int) -> None:
    """Iterations ``done + 1 .. run.iterations`` (``done``: iterations done before, the
    checkpoint's count; module docstring). ``source.stop`` and ``evaluator.kill`` run however
    the loop ends."""
    cfg = run.cfg
    interrupted = False
    try:
        if done < cfg.run.iterations:
            evaluator.before(run, done)
        for it in range(done + 1, cfg.run.iterations + 1):
            run_iteration(run, source, evaluator, it)
    except KeyboardInterrupt:  # SIGINT, or SIGTERM through train()'s handler: leave now
        interrupted = True
        raise
    finally:
        evaluator.kill()
        source.stop(interrupted)


def run_iteration(run: RunContext, source: BatchSource, evaluator: Evaluator, it: int) -> None:
    """Iteration ``it`` (1-based) of ``run_loop``: one update."""
    cfg, group = run.cfg, run.group
    run.tasks.iteration = it  # every request from now on (refills too) carries it in its episode id
    t_iter = time.perf_counter()
    profiled = source.before_iteration(run, it)
    run.phase(it, "rollout")
    t_roll = run.now_s()
    shaped: dict[str, list[float]] = {}  # each episode's rewards shaped once this iteration
    taken, refills = take_update(run, source, shaped)
    timeline = span("rollout", t_roll, run.now_s())
    timeline.update(judge_phase(taken.episodes, run.t0_epoch_s, taken.judge_tail_s))  # with a judge: its phase inside the rollout
    kill_point("mid_rollout", it)

    run.phase(it, "credit")
    t0 = time.perf_counter()
    credit = compute_credit(run, taken.episodes, shaped, refills)
    fold_profile(credit.metrics, profiled)  # profile/* metrics; its tokens paid work in tokens/generated, /discarded
    credit_s = time.perf_counter() - t0
    timeline.update(span("credit", t0 - run.t0, run.now_s()))

    run.phase(it, "update")
    t0 = time.perf_counter()
    update = source.while_updating(partial(train_on, group, credit), partial(kill_point, "mid_update", it))
    update_s = time.perf_counter() - t0
    timeline.update(span("update", t0 - run.t0, run.now_s()))

    v = run.policy_version
    run.phase(it, "sync")
    t0 = time.perf_counter()
    sync_metrics: dict[str, float] = {}
    payload = evaluator.snapshot(run, it, credit.batch is not None)
    if credit.batch is not None:
        sync_metrics = source.sync_weights(v + 1, payload)  # sync/engine_{i}_s per engine
        kill_point("mid_sync", it)
        run.policy_version = v + 1
    sync_metrics = source.after_sync(sync_metrics)
    sync_s = time.perf_counter() - t0
    timeline.update(span("sync", t0 - run.t0, run.now_s()))
    evaluator.after_sync(run, it, payload)

    pool_metrics, extra = source.metrics(taken, credit, v)
    extra = {**timeline, **extra}
    eval_eps, eval_m = evaluator.land(run, it, final=it == cfg.run.iterations)
    if eval_eps:  # stored under this iteration: a resume that rewinds it drops them with its line
        run.store.add_episodes(run.run_id, it, eval_eps, kind="eval")
    extra.update(eval_m)
    clean = record_iteration(run, it, taken.episodes + taken.dropped, credit, update, pool_metrics=pool_metrics,
                             sync_metrics=sync_metrics, t_iter=t_iter, extra=extra,
                             times={"time/rollout_s": taken.seconds, "time/credit_s": credit_s,
                                    "time/update_s": update_s, "time/sync_s": sync_s})
    note, extra_state = source.checkpoint_state()
    eval_state = evaluator.pending_state()
    if eval_state is not None:
        extra_state = {**extra_state, "eval": eval_state}  # a resume reruns or drops them, never doubles
    checkpoint_if_due(run, it, note, extra_state)
    end_iteration(run, it, clean)


__all__ = ["BatchSource", "Evaluator", "NoEval", "Taken", "run_loop", "run_iteration", "take_update"]
