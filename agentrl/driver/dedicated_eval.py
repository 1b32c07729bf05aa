"""Evaluation during asynchronous training (``controller.mode: async`` with ``eval.every``),
off the training loop's critical path, one policy version per eval.

Why not on the rollout engines: in async mode they load new weights after every update and,
with ``controller.partial_rollout: continue``, an episode may span versions; an eval episode
joining the stream could not say which policy it measured. So a **dedicated eval engine**
(one more ``RolloutActor``, placed with ``cluster.placement.eval``; its OpenMP threads:
``agentrl.cluster.actors.cpu_threads``) runs the evals, never streaming: for an eval of version
``v`` it first loads ``v``'s weights (the weight-sync payload of the sync that made ``v``:
an object-store snapshot that later updates do not touch), then rolls out the eval requests
(``agentrl.driver.evaluation.eval_requests``, the eval section's budget) to the end. Calls in
the actor's default concurrency group run one at a time in call order, so nothing can load
between the two.

Scheduling (``EvalSchedule``, pure bookkeeping, unit-tested): an eval falls due after the
weight sync of iteration ``it`` when ``TrainingEval.due(it)`` (``eval.every``,
``eval.after_training``); ``eval.before_training`` queues the starting policy's eval (named
``eval_before``: keys ``eval_before/*`` as in sync mode, ids under ``{run_id}/eval-before``)
before the first iteration. The driver never waits for it while training goes on: it hands
the eval to the engine at once when the engine is idle, else parks it in one waiting slot
(a newer eval replaces a parked one of its name, counted in ``async/eval_skipped``: evals
never pile up and at most three weight snapshots are held). Between engine steps (every driver poll, at most
``stream_source.POLL_S`` apart) it checks the engine without blocking.

Where results land: in the metrics line of the first iteration recorded after the eval
finished (usually the next iteration after the one it measured; one eval of each name per
line, so a second one that finished in the same gap waits one more line), tagged with
``eval/policy_version`` (the version measured) and ``eval/iteration`` (the iteration, from 1,
whose update made it); its episodes are stored as ``kind='eval'`` under that same landing
iteration (ids from the measured iteration under ``{run_id}/eval``, as in sync mode), so a
resume that rewinds the landing iteration drops both together. At the last iteration the
driver waits for the evals still running or parked (training is over, nothing waits on it);
the last line carries the newest, older ones that could no longer land count as skipped.

Exactly once on resume: a checkpoint records every eval not yet landed (running, parked or
finished) under ``eval.pending``; a resume reruns the one that measured the checkpoint's own
version (the trainers hold exactly those weights again) and drops older ones (their weights
are gone; ``async/eval_dropped``), so ``metrics.jsonl`` and the store hold each eval at most
once and never twice. An eval engine lost mid-eval (its actor died) loses that eval
(``async/eval_failed``; an infrastructure fault, never scored as a model failure); the next
eval starts a new engine.

Metrics of the landing line: the eval report's ``eval/*`` (``agentrl.eval.passk``),
``eval/policy_version``, ``eval/iteration``, ``time/eval_s`` (the eval engine's load plus
rollout), ``timeline/eval_start_s`` / ``timeline/eval_end_s`` (driver clock: handed to the
engine, seen finished); in every line ``async/eval_skipped``, ``async/eval_dropped``,
``async/eval_failed`` (since the previous line) and ``time/eval_wait_s`` (seconds the driver
blocked on evals: 0 except in the last line).
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Sequence

import ray

from agentrl.cluster.actors.actor_errors import actor_failure_message, as_cluster_error
from agentrl.cluster.engines.eval_engine import start_eval_engine
from agentrl.cluster.engines.pool import ENGINE_LOST_ERRORS
from agentrl.driver.evaluation import eval_budget, eval_report, eval_requests
from agentrl.errors import ContractError
from agentrl.tasks import BEFORE_TRAINING
from agentrl.types import Episode

log = logging.getLogger(__name__)

WAIT_POLL_S = 0.2
"""How long one blocking check waits for the eval engine at the last iteration (seconds)."""


BEFORE = "eval_before"
"""The name of the eval of the starting policy (``eval.before_training``): its metrics are
``eval_before/*``, as in sync mode; every other eval's are ``eval/*``."""


@dataclass
class EvalJob:
    """One eval of ``policy_version``, the version the update of iteration ``iteration``
    (from 1) made (``name`` ``"eval"``), or the starting policy (``name`` ``"eval_before"``,
    iteration ``BEFORE_TRAINING`` = 0). ``payload``: that version's weights
    (``weight_sync.weights_payload``), dropped once the engine took them; ``launched_s`` /
    ``finished_s``: driver clock."""

    iteration: int
    policy_version: int
    payload: Any = None
    name: str = "eval"
    launched_s: float | None = None
    finished_s: float | None = None
    episodes: list[Episode] = field(default_factory=list)
    engine_s: float = 0.0

    def state(self) -> dict[str, Any]:
        return {"iteration": int(self.iteration), "policy_version": int(self.policy_version), "name": self.name}


class EvalSchedule:
    """The evals between falling due and landing in a metrics line (module docstring); no Ray.
    Evals of different names (``eval``, ``eval_before``) never replace each other and may land
    in the same line (their metric keys differ).

    Raises:
        ContractError: a finish or failure reported while nothing runs.
    """

    def __init__(self) -> None:
        self.running: EvalJob | None = None
        self.waiting: dict[str, EvalJob] = {}  # at most one per name
        self.finished: list[EvalJob] = []
        self.skipped = self.dropped = self.failed = 0

    def add(self, job: EvalJob) -> None:
        """A new eval is due: it waits for the engine; one of its name already waiting is skipped."""
        old = self.waiting.get(job.name)
        if old is not None:
            log.warning("eval of policy version %d skipped: the eval engine was still busy when version %d fell due",
                        old.policy_version, job.policy_version)
            self.skipped += 1
        self.waiting[job.name] = job

    def next_to_launch(self) -> EvalJob | None:
        """The waiting eval of the oldest version, now running, when the engine is free; else None."""
        if self.running is not None or not self.waiting:
            return None
        job = min(self.waiting.values(), key=lambda j: (j.policy_version, j.name != BEFORE))
        del self.waiting[job.name]
        self.running = job
        return job

    def finish(self, episodes: Sequence[Episode], engine_s: float, now_s: float) -> EvalJob:
        """The running eval finished with ``episodes``."""
        job = self._pop_running("finish")
        job.episodes, job.engine_s, job.finished_s = list(episodes), float(engine_s), float(now_s)
        self.finished.append(job)
        return job

    def fail(self) -> EvalJob:
        """The running eval was lost with its engine (counted, never scored)."""
        job = self._pop_running("fail")
        self.failed += 1
        return job

    def _pop_running(self, what: str) -> EvalJob:
        if self.running is None:
            raise ContractError(f"EvalSchedule.{what}(): no eval is running")
        job, self.running = self.running, None
        job.payload = None
        return job

    def idle(self) -> bool:
        """Nothing running or waiting (finished ones may still wait to land)."""
        return self.running is None and not self.waiting

    def take_landing(self, final: bool = False) -> list[EvalJob]:
        """The evals whose results go into the line being recorded, at most one per name: the
        oldest finished one; at the last iteration (``final``, after waiting until ``idle``)
        the newest, the older ones of its name counting as skipped."""
        out: list[EvalJob] = []
        for name in sorted({j.name for j in self.finished}):
            mine = [j for j in self.finished if j.name == name]
            pick = mine[-1] if final else mine[0]
            if final:
                self.skipped += len(mine) - 1
                self.finished = [j for j in self.finished if j.name != name]
            else:
                self.finished.remove(pick)
            out.append(pick)
        return out

    def pending(self) -> list[EvalJob]:
        """Every eval not landed yet (running, waiting, finished), oldest version first."""
        jobs = ([self.running] if self.running is not None else []) + list(self.waiting.values()) + list(self.finished)
        return sorted(jobs, key=lambda j: (j.policy_version, j.iteration, j.name))

    def pending_state(self) -> list[dict[str, Any]]:
        """``pending()`` for a checkpoint (``eval.pending``)."""
        return [j.state() for j in self.pending()]

    def counters(self) -> dict[str, float]:
        """``async/eval_skipped`` / ``_dropped`` / ``_failed`` since the last call (then reset)."""
        out = {"async/eval_skipped": float(self.skipped), "async/eval_dropped": float(self.dropped),
               "async/eval_failed": float(self.failed)}
        self.skipped = self.dropped = self.failed = 0
        return out


def resumed_evals(pending: Sequence[dict[str, Any]], policy_version: int) -> tuple[list[EvalJob], int]:
    """The checkpoint's ``eval.pending`` on resume at ``policy_version``: ``(rerun, dropped)``
    (module docstring): the evals of ``policy_version`` itself are rerun (at most one per
    name), older ones are dropped.

    Raises:
        ContractError: a pending eval newer than the checkpoint (versions went backwards).
    """
    rerun: list[EvalJob] = []
    dropped = 0
    for p in pending:
        v, it, name = int(p["policy_version"]), int(p["iteration"]), str(p.get("name", "eval"))
        if v > policy_version:
            raise ContractError(f"checkpoint at policy version {policy_version} records a pending eval of version {v}")
        if v == policy_version and all(j.name != name for j in rerun):
            rerun.append(EvalJob(it, v, name=name))
        else:
            dropped += 1
    return rerun, dropped


class DedicatedEval:
    """The dedicated eval engine and its ``EvalSchedule``: the ``Evaluator`` of the async
    loop (``agentrl.driver.loop``), driven from the driver's thread (module docstring).
    ``training_eval``: the run's ``TrainingEval`` (held-out task ids checked at start-up,
    ``due``); ``state``: the checkpoint's controller state on resume.

    The engine is the one ``StreamingEnginePool`` started beside the rollout engines
    (``pool.eval_engine``: its model loads while the run starts; nothing waits for it until
    the first eval), or a new one after it was lost; ``pool.eval_engine`` always names the
    current one, so ``pool.kill()`` ends it too. ``kill()`` ends it.
    """

    def __init__(self, run: Any, training_eval: Any, state: dict[str, Any] | None = None) -> None:
        from agentrl.cluster.engines.weight_sync import weights_payload  # heavy: torch

        self.run, self.training_eval, self.cfg = run, training_eval, run.cfg
        self.schedule = EvalSchedule()
        self.actor: Any = None
        self._calls: tuple[Any, Any] | None = None  # (load ref, rollout ref) of the running eval
        self._wait_s = 0.0
        self.actor = getattr(run.pool, "eval_engine", None)
        if self.actor is None:
            self._start_engine()
        rerun, dropped = resumed_evals(((state or {}).get("eval") or {}).get("pending", []), run.policy_version)
        self.schedule.dropped += dropped
        if dropped:
            log.warning("resume: %d evals of versions before the checkpoint's (%d) had not landed; their weights are "
                        "gone, so they are dropped (async/eval_dropped)", dropped, run.policy_version)
        for job in rerun:  # the checkpoint's own version: the trainers hold exactly its weights again
            log.info("resume: rerunning the eval of policy version %d, in flight at the checkpoint", job.policy_version)
            job.payload = weights_payload(run.group.actors)
            self.schedule.add(job)
        self.poll()

    def before(self, run: Any, done: int) -> None:
        """``eval.before_training``: the starting policy's eval, first in line (``EvalSchedule.next_to_launch``)."""
        from agentrl.cluster.engines.weight_sync import weights_payload  # heavy: torch

        if self.training_eval.due_before(done):
            self.schedule.add(EvalJob(BEFORE_TRAINING, run.policy_version, weights_payload(run.group.actors), name=BEFORE))
        self.poll()

    def _start_engine(self) -> None:
        pool = self.run.pool
        self.actor = start_eval_engine(self.cfg, pool.model_path, self.run.run_id, pool.sandbox_hosts)
        pool.eval_engine = self.actor

    def due(self, it: int) -> bool:
        return self.training_eval.due(it)

    def snapshot(self, run: Any, it: int, updated: bool) -> Any:
        """Before iteration ``it``'s weight sync: when an eval is due, the weights snapshot
        (``weight_sync.weights_payload``) the sync sends too (object store: one gather), or,
        with no update, the trainers' weights as they are; None otherwise (a collective sync
        sends none: ``after_sync`` takes its own)."""
        from agentrl.cluster.engines.weight_sync import weights_payload  # heavy: torch

        if self.due(it) and (not updated or self.cfg.cluster.weight_sync == "object_store"):
            return weights_payload(run.group.actors)
        return None

    def after_sync(self, run: Any, it: int, payload: Any) -> None:
        """The eval of the version iteration ``it``'s update made, when due, handed to the eval
        engine (or parked); the loop goes on."""
        from agentrl.cluster.engines.weight_sync import weights_payload  # heavy: torch

        if not self.due(it):
            return
        if payload is None:  # the eval engine's snapshot when the sync sent none (collective)
            payload = weights_payload(run.group.actors)
        self.add(it, run.policy_version, payload)

    def add(self, it: int, policy_version: int, payload: Any) -> None:
        """The eval of ``policy_version`` (made by iteration ``it``'s update) is due, with its
        weights ``payload`` (``weight_sync.weights_payload``)."""
        self.schedule.add(EvalJob(it, policy_version, payload))
        self.poll()

    def poll(self) -> None:
        """Without blocking: collect a finished eval, hand the waiting one to the engine."""
        if self._calls is not None:
            done, _ = ray.wait([self._calls[1]], timeout=0)
            if done:
                self._collect()
        if self._calls is None:
            job = self.schedule.next_to_launch()
            if job is not None:
                self._launch(job)

    def _launch(self, job: EvalJob) -> None:
        if self.actor is None:
            self._start_engine()
        under = f"{self.run.run_id}/eval" if job.name != BEFORE else f"{self.run.run_id}/eval-before"  # as sync mode's
        requests = eval_requests(self.cfg, self.training_eval.task_ids, under, iteration=job.iteration)
        job.launched_s = self.run.now_s()
        # one default-group thread, calls in order: the load of v's weights, then the eval at v
        load = self.actor.update_weights.remote(job.payload, job.policy_version)
        self._calls = (load, self.actor.rollout.remote(requests, job.policy_version, eval_budget(self.cfg)))

    def _collect(self) -> None:
        assert self._calls is not None
        load, roll = self._calls
        self._calls = None
        try:
            load_s = float(ray.get(load))
            episodes, rollout_s = ray.get(roll)
        except ENGINE_LOST_ERRORS as exc:
            if as_cluster_error(exc) is None:
                raise  # its constructor raised (e.g. a ConfigError): that error, not the cluster's
            job = self.schedule.fail()
            log.warning("the eval engine was lost during the eval of policy version %d (%s); that eval is lost "
                        "(async/eval_failed), the next one starts a new engine", job.policy_version,
                        actor_failure_message(exc, "the eval engine"))
            self.kill()
            return
        self.schedule.finish(episodes, load_s + float(rollout_s), self.run.now_s())

    def land(self, run: Any, it: int, final: bool) -> tuple[list[Episode], dict[str, float]]:
        """The episodes and metrics for iteration ``it``'s line (module docstring); with
        ``final`` (the last iteration) first wait until every eval ran."""
        if final:  # training is over: nothing else waits on the driver now
            t0 = time.perf_counter()
            while not self.schedule.idle():
                if self._calls is not None:
                    ray.wait([self._calls[1]], timeout=WAIT_POLL_S)
                self.poll()
            self._wait_s += time.perf_counter() - t0
        jobs = self.schedule.take_landing(final)  # before the counters: the last line counts what it leaves out
        m = self.schedule.counters()
        m["time/eval_wait_s"], self._wait_s = self._wait_s, 0.0
        if not jobs:
            return [], m
        episodes: list[Episode] = []
        for job in jobs:
            report = eval_report(job.episodes, self.cfg)
            n = job.name
            m.update(report.metrics(prefix=f"{n}/"))
            m.update({f"{n}/policy_version": float(job.policy_version), f"time/{n}_s": job.engine_s,
                      f"timeline/{n}_start_s": float(job.launched_s or 0.0),
                      f"timeline/{n}_end_s": float(job.finished_s or 0.0)})
            if n != BEFORE:
                m["eval/iteration"] = float(job.iteration)
            episodes.extend(job.episodes)
        return episodes, m

    def pending_state(self) -> dict[str, Any]:
        """The checkpoint's ``eval`` entry: ``{"pending": [{"iteration", "policy_version"}, ...]}``."""
        return {"pending": self.schedule.pending_state()}

    def kill(self) -> None:
        """End the eval engine (idempotent); the next launch starts a new one."""
        if self.actor is not None:
            try:
                ray.kill(self.actor)
            except Exception:  # already gone
                pass
        self.actor, self._calls = None, None
        self.run.pool.eval_engine = None


__all__ = ["BEFORE", "DedicatedEval", "EvalJob", "EvalSchedule", "WAIT_POLL_S", "resumed_evals"]
