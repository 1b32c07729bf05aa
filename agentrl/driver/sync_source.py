"""The ``BatchSource`` of ``controller.mode: sync`` (``agentrl.driver.loop``): the
``TaskSource`` drained before each update.

One iteration's rollouts all use the same ``policy_version``: ``take`` hands the iteration's
requests to ``pool.rollout`` and waits for every episode, the update starts when they are
done, and the next iteration starts after the new weights are in every engine. Nothing runs
while the trainer steps, so a checkpoint has no rollouts in flight.

The difficulty filter (``env.difficulty_filter``, ``agentrl.driver.difficulty``) runs in
``before_iteration``: it profiles every training task with ``pool.rollout`` at the iteration's
policy version before the iteration's rollout and sets the ``TaskSource``'s skip set (the
streaming source does the same on its stream, ``agentrl.driver.stream_source``).

An engine lost mid-rollout turns its in-flight episodes into ``aborted`` ones, which come
back with the others (stored, never scored) while ``pool.rollout`` re-runs their requests
with ``attempt + 1`` on the remaining engines.
"""

from __future__ import annotations

from typing import Any, Callable

from agentrl.cluster.engines.dispatch import merge_rollout_metrics
from agentrl.driver.iteration import RunContext, UpdateResult
from agentrl.driver.loop import Taken


class SyncSource:
    """``BatchSource`` over ``run.pool`` (an ``EnginePool``) and ``run.tasks`` (module docstring)."""

    def __init__(self, run: RunContext) -> None:
        self.run = run
        self.pool_metrics: dict[str, float] = {}  # the iteration's rollouts', refills merged in

    def before_iteration(self, run: RunContext, it: int) -> dict[str, float]:
        """The difficulty profile when due (it sets the ``TaskSource``'s skip set); its metrics."""
        return run.difficulty.before_iteration(run, it) if run.difficulty is not None else {}

    def take(self, groups: int) -> Taken:
        self.pool_metrics = {}
        return self._rollout(groups)

    def more(self, missing: int) -> Taken:
        return self._rollout(missing)

    def _rollout(self, groups: int) -> Taken:
        run = self.run
        episodes, seconds, metrics = run.pool.rollout(run.tasks.next_requests(groups), run.policy_version)
        self.pool_metrics = merge_rollout_metrics(self.pool_metrics, metrics)
        return Taken(episodes, [], seconds)

    def while_updating(self, step: Callable[[], UpdateResult], after_submit: Callable[[], None]) -> UpdateResult:
        """The step, in the driver's thread; nothing else runs meanwhile."""
        after_submit()
        return step()

    def sync_weights(self, version: int, payload: Any) -> dict[str, float]:
        """Every engine loads the trainers' weights (``payload`` unused: no dedicated eval in sync mode)."""
        return self.run.pool.update_weights(self.run.group.actors)  # sync/engine_{i}_s per engine

    def after_sync(self, sync_metrics: dict[str, float]) -> dict[str, float]:
        return sync_metrics

    def metrics(self, taken: Taken, credit: Any, version: int) -> tuple[dict[str, float], dict[str, float]]:
        return self.pool_metrics, {}

    def checkpoint_state(self) -> tuple[str, dict[str, Any]]:
        return "none (synchronous mode: each iteration completes before a checkpoint)", {}

    def stop(self, interrupted: bool) -> None:
        return None


__all__ = ["SyncSource"]
