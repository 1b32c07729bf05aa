"""The asynchronous controller (``controller.mode: async``): the engines keep generating while
the trainer updates, under a strict per-sample staleness bound (issue 12; design.md,
invariant 9).

One iteration is one update. With ``B = env.tasks_per_iteration`` and ``k =
controller.max_staleness``:

* Engines stream (``StreamingEnginePool``): requests are submitted group by group as slots
  free up and finished episodes are collected as they finish; a group is complete when all
  its members have finished.
* Admission control (``GroupBuffer``; AReaL's rule, Fu et al. 2025, section 4): at most
  ``(k + 1) * B`` groups admitted and not yet consumed, so no group starts that could only
  finish beyond the bound.
* Each update takes ``B`` complete groups, oldest admission first; the groups that would be
  older than ``k`` at the next update are always among them (the update waits for them).
  Check at consumption: a group with a row whose oldest token is more than ``k`` versions
  behind the trainer is dropped (stored under this iteration, never scored;
  ``async/stale_dropped`` counts its rows) and its task instance re-issued with ``attempt +
  1``, ahead of new tasks. Dynamic sampling's refill takes further complete groups, at most
  ``algorithm.max_refill_rounds`` times, like the synchronous refill.
* Credit runs on complete groups only (``iteration.compute_credit``); the trainer step runs
  in a worker thread while the driver keeps admitting and collecting (the loss is the
  decoupled objective: the trainer computes proximal log-probs from the weights the update
  starts from, since ``batch.proximal_log_probs`` is None).
* After the step every engine gets the new weights with ``policy_version = v + 1`` and
  ``mode = controller.partial_rollout`` while the other episodes keep running.
* Lossless checkpoints (invariant 7): the checkpoint's controller state holds the task
  cursor and, under ``async.pending_requests``, every admitted-but-unconsumed request
  (buffered or in flight) and every queued one; a resume re-issues those first (same episode
  ids: the store's rewind dropped anything after the checkpoint), then continues the cursor.
  Episodes are stored under the iteration that trained (or dropped) them.

* Evaluation during training (``eval.every``, ``eval.after_training``): on a dedicated eval
  engine that loads the weights of version ``v + 1`` (the sync's own object-store snapshot)
  and rolls out the held-out split while the loop goes on; results land in the metrics line
  of the first iteration recorded after the eval finished (``agentrl.cluster.async_eval``).

Metrics per update, beside the synchronous ones: ``async/staleness_mean``,
``async/staleness_max``, ``async/staleness_hist/<d>``, ``async/stale_dropped``,
``async/in_flight``, ``async/buffered_groups``, ``async/admission_wait_s``,
``async/preempted_requests``, ``async/restarted_episodes``; ``time/rollout_s`` is the time
the update waited for complete groups.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from functools import partial
from typing import Any, Callable

from agentrl.cluster.checkpoint import kill_point
from agentrl.cluster.iteration import RunContext, checkpoint_if_due, compute_credit, end_iteration, record_iteration, span, train_on
from agentrl.cluster.staleness import AdmittedGroup, GroupBuffer, split_stale, staleness_metrics
from agentrl.credit import missing_groups
from agentrl.tasks import requests_from_state, requests_state, retry_requests
from agentrl.types import EpisodeRequest, TerminationReason

log = logging.getLogger(__name__)

POLL_S = 0.2
"""How long one collect waits for an engine to answer (seconds): the driver's reaction time."""
UPDATE_POLL_S = 0.05
"""The same while the trainer step runs: the driver sees the step's end only between collects,
so each update overran by up to ``POLL_S`` (about 0.1 s of a 0.5-2 s update on average); a
shorter wait costs a few more ``stream_collect`` calls per second."""


def in_background(fn: Callable[..., Any], *args: Any, name: str = "agentrl-update") -> Future:
    """Run ``fn(*args)`` in a new daemon thread; its ``Future``.

    Why not a ``ThreadPoolExecutor``: leaving its ``with`` block (an interrupt) waits for the
    running call, and the interpreter joins its threads at exit, so a SIGTERM during a trainer
    step waited for the step to end (about 2 minutes with SmolLM2-135M on CPU). A daemon
    thread holds up neither; the step's actors are killed by ``train()``'s clean-up, which
    ends the call it waits on."""
    fut: Future = Future()
    fut.set_running_or_notify_cancel()

    def _run() -> None:
        try:
            fut.set_result(fn(*args))
        except BaseException as exc:  # the driver sees it at result()
            fut.set_exception(exc)

    threading.Thread(target=_run, name=name, daemon=True).start()
    return fut


def step_while_pumping(fn: Callable[..., Any], args: tuple, pump: Callable[[float], None],
                       after_submit: Callable[[], None] | None = None) -> Any:
    """``fn(*args)`` (the trainer step) in a background thread while the driver keeps calling
    ``pump(UPDATE_POLL_S)`` (admit and collect); its result. An exception in ``pump`` or
    ``after_submit`` (a ``KeyboardInterrupt`` from SIGINT / SIGTERM, an engine error) propagates
    at once, without waiting for ``fn``."""
    step = in_background(fn, *args)
    if after_submit is not None:
        after_submit()
    while not step.done():  # the engines keep going: admit and collect meanwhile
        pump(UPDATE_POLL_S)
    return step.result()


def group_requests(requests: list[EpisodeRequest]) -> list[list[EpisodeRequest]]:
    """``requests`` cut into groups by ``group_id``, in order of first appearance."""
    groups: dict[str, list[EpisodeRequest]] = {}
    for r in requests:
        groups.setdefault(r.group_id, []).append(r)
    return list(groups.values())


class _Streamer:
    """Admission and collection between the buffer and the engines (driver thread only)."""

    def __init__(self, run: RunContext, buf: GroupBuffer, evals: Any = None) -> None:
        self.run, self.buf = run, buf
        self.evals = evals  # async_eval.DedicatedEval (eval during training) or None
        self.idle_since: float | None = None
        self.admission_wait_s = 0.0
        self.aborted = 0

    def pump(self, wait_s: float) -> None:
        """Top the queue up with new task instances, admit what the bound allows, submit it,
        collect what finished (up to ``wait_s`` seconds' wait) and file it."""
        run, buf = self.run, self.buf
        while len(buf.pending) < buf.free_slots():
            buf.queue(run.tasks.next_requests(1))
        reqs = buf.admit(run.policy_version)
        if reqs:
            run.pool.stream_submit(reqs)
        now = time.perf_counter()
        if run.pool.in_flight() == 0:
            self.idle_since = self.idle_since or now
        elif self.idle_since is not None:
            self.admission_wait_s += now - self.idle_since
            self.idle_since = None
        episodes, retries = run.pool.collect(wait_s)
        for ep in episodes:
            buf.add_episode(ep)
            self.aborted += ep.termination_reason == TerminationReason.ABORTED
        for aborted_id, retry in retries:
            buf.add_retry(aborted_id, retry)
        if self.evals is not None:  # never blocks: collect a finished eval, start the waiting one
            self.evals.poll()

    def flush_idle(self) -> float:
        """Seconds the engines had nothing admitted since the last call."""
        now = time.perf_counter()
        if self.idle_since is not None:
            self.admission_wait_s += now - self.idle_since
            self.idle_since = now
        out, self.admission_wait_s = self.admission_wait_s, 0.0
        return out

    def take(self, wanted: int) -> list[AdmittedGroup]:
        """Wait until the update can take ``wanted`` groups (``GroupBuffer.ready``), then take them."""
        v = self.run.policy_version
        while not self.buf.ready(v, wanted):
            self.pump(POLL_S)
        return self.buf.take(v, wanted)

    def take_fresh(self, wanted: int, dropped: list[AdmittedGroup]) -> list[AdmittedGroup]:
        """``wanted`` groups that pass the staleness check; the stale ones go to ``dropped``
        and their task instances are queued again first (``attempt + 1``)."""
        out: list[AdmittedGroup] = []
        k = self.run.cfg.controller.max_staleness
        while len(out) < wanted:
            fresh, stale = split_stale(self.take(wanted - len(out)), self.run.policy_version, k)
            for g in stale:
                log.warning("group %s: a row is more than controller.max_staleness=%d versions behind the trainer's "
                            "version %d; dropped and re-issued", g.group_id, k, self.run.policy_version)
                self.buf.queue(retry_requests(g.requests), front=True)
            self.buf.unhold(len(stale))  # never trained: the re-issue may take their slots
            dropped.extend(stale)
            out.extend(fresh)
        return out


    def groups_for_update(self, shaped: dict) -> tuple[list[AdmittedGroup], list[AdmittedGroup], int]:
        """The groups of one update: ``B`` fresh complete groups, then (DAPO dynamic sampling,
        as in sync mode) as many more as ``missing_groups`` asks for, at most
        ``algorithm.max_refill_rounds`` times. Returns ``(groups, dropped, refills)``:
        ``dropped`` the stale groups set aside (stored, never scored)."""
        cfg = self.run.cfg
        B = cfg.env.tasks_per_iteration
        dropped: list[AdmittedGroup] = []
        groups = self.take_fresh(B, dropped)
        refills = freed = 0
        while refills < cfg.algorithm.max_refill_rounds:
            missing = missing_groups([e for g in groups for e in g.episodes()], cfg.algorithm, groups_wanted=B,
                                     max_new_tokens=cfg.rollout.max_new_tokens, shaped_cache=shaped)
            if missing <= 0:
                break
            filtered = len(groups) - (B - missing)  # missing > 0: exactly B - missing groups survive selection
            self.buf.unhold(filtered - freed)  # not trained: their replacements may take their slots
            freed = filtered
            groups += self.take_fresh(missing, dropped)
            refills += 1
        return groups, dropped, refills


def _rows(groups: list[AdmittedGroup]) -> int:
    return sum(len(e.row_layout()) for g in groups for e in g.finished.values() if e.turns)


def run_async(run: RunContext, start_iter: int, state: dict[str, Any] | None, training_eval: Any = None) -> None:
    """Asynchronous updates ``start_iter .. run.iterations - 1`` (module docstring); ``state``:
    the checkpoint's controller state on resume (its ``async.pending_requests`` go first);
    ``training_eval`` (``agentrl.cluster.evaluate.TrainingEval``): evaluation during training
    on a dedicated eval engine, off the critical path (``agentrl.cluster.async_eval``)."""
    from agentrl.cluster.weight_sync import weights_payload

    cfg, pool, group = run.cfg, run.pool, run.group
    evals = None
    if training_eval is not None and training_eval.task_ids and start_iter < cfg.run.iterations:
        from agentrl.cluster.async_eval import DedicatedEval

        evals = DedicatedEval(run, training_eval, state, start_iter)  # its engine starts while training starts
    B, k = cfg.env.tasks_per_iteration, cfg.controller.max_staleness
    buf = GroupBuffer(B, k)
    resumed = requests_from_state(((state or {}).get("async") or {}).get("pending_requests", []))
    for reqs in group_requests(resumed):
        buf.queue(reqs)
    if resumed:
        log.info("resume: re-issuing %d requests (%d groups) that were admitted or queued but not trained at the "
                 "checkpoint", len(resumed), len(buf.pending))
    streamer = _Streamer(run, buf, evals)
    run.tasks.iteration = start_iter
    pool.stream_start(run.policy_version)
    lost_before = pool.engines_lost
    interrupted = False
    try:
        for it in range(start_iter, cfg.run.iterations):
            run.tasks.iteration = it  # requests queued from now on carry it in their episode ids
            t_iter = time.perf_counter()
            run.phase(it, "rollout")
            t_wait = run.now_s()
            shaped: dict[str, list[float]] = {}
            groups, dropped, refills = streamer.groups_for_update(shaped)
            rollout_s = run.now_s() - t_wait
            timeline = span("rollout", t_wait, run.now_s())
            in_flight, buffered = buf.in_flight(), len(buf.complete_groups())
            kill_point("mid_rollout", it + 1)

            run.phase(it, "credit")
            t0 = time.perf_counter()
            trained_eps = [e for g in groups for e in g.episodes()]
            credit = compute_credit(run, trained_eps, shaped, refills)
            credit_s = time.perf_counter() - t0
            timeline.update(span("credit", t0 - run.t0, run.now_s()))

            run.phase(it, "update")
            t0 = time.perf_counter()
            train_metrics = step_while_pumping(train_on, (group, credit), streamer.pump,
                                               after_submit=partial(kill_point, "mid_update", it + 1))
            update_s = time.perf_counter() - t0
            timeline.update(span("update", t0 - run.t0, run.now_s()))

            v = run.policy_version
            run.phase(it, "sync")
            t0 = time.perf_counter()
            sync_metrics: dict[str, float] = {"async/preempted_requests": 0.0, "async/restarted_episodes": 0.0}
            eval_due = evals is not None and evals.due(it)
            # the eval engine loads the very snapshot the engines get (object store; one gather)
            payload = weights_payload(group.actors) if eval_due and (
                credit.batch is None or cfg.cluster.weight_sync == "object_store") else None
            if credit.batch is not None:
                sync_metrics = pool.stream_update_weights(group.actors, v + 1, cfg.controller.partial_rollout,
                                                          payload=payload)
                kill_point("mid_sync", it + 1)
                run.policy_version = v + 1
            buf.release()  # the consumed groups' slots: the engines now sample at the new version
            if eval_due and payload is None:  # the eval engine's snapshot when the sync sent none (collective)
                payload = weights_payload(group.actors)
            sync_s = time.perf_counter() - t0
            timeline.update(span("sync", t0 - run.t0, run.now_s()))
            if eval_due:  # handed to the eval engine once the sync has ended; the loop goes on (async_eval)
                evals.add(it, run.policy_version, payload)

            rows = [] if credit.batch is None else [int(x) for x in credit.batch.policy_versions.tolist()]
            extra = dict(timeline)
            extra.update(staleness_metrics(rows, v))
            extra.update({"async/stale_dropped": float(_rows(dropped)), "async/stale_dropped_groups": float(len(dropped)),
                          "async/in_flight": float(in_flight), "async/buffered_groups": float(buffered),
                          "async/admission_wait_s": streamer.flush_idle(), "async/groups": float(len(groups))})
            pool_metrics = {"cluster/engines": float(len(pool.engine_indices)),
                            "cluster/engines_lost": float(pool.engines_lost - lost_before)}
            lost_before = pool.engines_lost
            stored = trained_eps + [e for g in dropped for e in g.episodes()]
            if evals is not None:  # the eval that finished since the last line (the last line: all of them)
                eval_eps, eval_m = evals.land(final=it + 1 == cfg.run.iterations)
                if eval_eps:  # stored under this iteration: a resume that rewinds it drops them with its line
                    run.store.add_episodes(run.run_id, it, eval_eps, kind="eval")
                extra.update(eval_m)
            clean = record_iteration(run, it, stored, credit, pool_metrics=pool_metrics, sync_metrics=sync_metrics,
                                     train_metrics=train_metrics, t_iter=t_iter, extra=extra,
                                     times={"time/rollout_s": rollout_s, "time/credit_s": credit_s,
                                            "time/update_s": update_s, "time/sync_s": sync_s})
            held = buf.held_requests()
            extra_state: dict[str, Any] = {"async": {"pending_requests": requests_state(held), "max_staleness": k}}
            if evals is not None:
                extra_state["eval"] = evals.pending_state()  # a resume reruns or drops them, never doubles
            checkpoint_if_due(run, it, f"{len(held)} requests admitted or queued and not trained; a resume "
                                       "re-issues them first (async.pending_requests)", extra_state)
            end_iteration(run, it, clean)
    except KeyboardInterrupt:  # SIGINT, or SIGTERM through train()'s handler: leave now
        interrupted = True
        log.warning("interrupted: %d requests admitted or queued and not trained are dropped with this process; "
                    "the latest checkpoint recorded its own (async.pending_requests) and a resume re-issues them",
                    len(buf.held_requests()))
        raise
    finally:
        if evals is not None:
            evals.kill()
        if not interrupted:  # an interrupt skips the orderly stop (it waits on env steps); the pool is killed next
            try:
                pool.stream_stop()
            except Exception:  # the run is ending anyway (an engine lost): the pool is killed next
                log.debug("stream_stop failed", exc_info=True)


__all__ = ["POLL_S", "UPDATE_POLL_S", "group_requests", "in_background", "run_async", "step_while_pumping"]
