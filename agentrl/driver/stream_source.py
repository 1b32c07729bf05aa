"""The ``BatchSource`` of ``controller.mode: async`` (``agentrl.driver.loop``): the engines
keep generating while the trainer updates, under a strict per-sample staleness bound
(docs/design.md, invariant 9).

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
  1``, ahead of new tasks. Dynamic sampling's refill (``loop.take_update``, one copy for both
  modes) takes further complete groups; the groups selection filtered free their slots at once.
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
  and rolls out the held-out split while the loop goes on; ``pump`` moves it along, and its
  results land in the metrics line of the first iteration recorded after the eval finished
  (``agentrl.driver.dedicated_eval``).
* The difficulty filter (``env.difficulty_filter``, ``agentrl.driver.difficulty``): when a
  profile is due before iteration ``i`` (``before_iteration``), the driver stops drawing and
  admitting training requests, submits the profile's requests to the stream beside the
  training episodes in flight (which go on and are filed into the buffer as usual) and
  collects until every profile request has a finished episode (``_Streamer.rollout``). The
  profile's requests are never admitted to the ``GroupBuffer``: they take no slot, are never
  trained, and a checkpoint never holds them (none is written during a profile; a resume
  before iteration ``i`` makes it again, with the same ids). No weight load runs before the
  update, so the profile sees the one version ``run.policy_version``. The skip set it sets
  applies to requests drawn after it; groups admitted or queued before it keep their tasks.
  Then streaming resumes. A checkpoint's skip set is restored on resume as in sync mode.

Metrics per update, beside the synchronous ones: ``async/staleness_mean``,
``async/staleness_max``, ``async/staleness_hist/<d>``, ``async/stale_dropped``,
``async/in_flight``, ``async/buffered_groups``, ``async/admission_wait_s``,
``async/preempted_requests``, ``async/restarted_episodes``; ``time/rollout_s`` is the wall
time the update waited for its complete groups, the refill's included (the profile's is
``time/profile_s``), as sync mode measures its rollout calls.
"""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import Future
from typing import Any, Callable

from agentrl.driver.iteration import RunContext, UpdateResult
from agentrl.driver.loop import Evaluator, Taken
from agentrl.driver.staleness import AdmittedGroup, GroupBuffer, split_stale, staleness_metrics
from agentrl.errors import ContractError
from agentrl.tasks import requests_from_state, requests_state, retry_requests
from agentrl.types import Episode, EpisodeRequest, TerminationReason

log = logging.getLogger(__name__)

POLL_S = 0.2
"""How long one collect waits for an engine to answer (seconds): the driver's reaction time."""
UPDATE_POLL_S = 0.05
"""The same while the trainer step runs: the driver sees the step's end only between collects,
so at ``POLL_S`` an update would end up to ``POLL_S`` late, a large share of a 0.5-2 s update; a
shorter wait costs a few more ``stream_collect`` calls per second."""


def in_background(fn: Callable[..., Any], *args: Any, name: str = "agentrl-update") -> Future:
    """Run ``fn(*args)`` in a new daemon thread; its ``Future``.

    Why not a ``ThreadPoolExecutor``: leaving its ``with`` block (an interrupt) waits for the
    running call, and the interpreter joins its threads at exit, so a SIGTERM during a trainer
    step would wait for the step to end (minutes on CPU). A daemon
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


class SideRollout:
    """Requests run on the stream beside the training groups and never admitted to the
    ``GroupBuffer`` (the difficulty profile): each position's attempts until one finishes.

    Args:
        requests: the requests, unique episode ids.
    """

    def __init__(self, requests: list[EpisodeRequest]) -> None:
        self.current = {r.episode_id: p for p, r in enumerate(requests)}  # current attempt's id -> position
        if len(self.current) != len(requests):
            raise ContractError(f"side rollout of {len(requests)} requests with {len(self.current)} distinct episode ids")
        self.attempts: list[list[Episode]] = [[] for _ in requests]  # per position: aborted attempts, then the finished one
        self.left = len(requests)

    def owns(self, episode_id: str) -> bool:
        """``episode_id`` is a current attempt of these requests."""
        return episode_id in self.current

    def add_episode(self, episode: Episode) -> None:
        """File a finished or aborted episode of a current attempt (an aborted one stays
        current until ``add_retry`` replaces it)."""
        p = self.current[episode.episode_id]
        self.attempts[p].append(episode)
        if episode.termination_reason != TerminationReason.ABORTED:
            del self.current[episode.episode_id]
            self.left -= 1

    def add_retry(self, aborted_episode_id: str, retry: EpisodeRequest) -> None:
        """``retry`` (``attempt + 1``, already submitted) replaces the aborted attempt."""
        self.current[retry.episode_id] = self.current.pop(aborted_episode_id)

    @property
    def done(self) -> bool:
        return self.left == 0

    def episodes(self) -> list[Episode]:
        """Per request in order, its aborted attempts then its finished episode (as
        ``EnginePool.rollout`` returns them)."""
        return [e for eps in self.attempts for e in eps]


class _Streamer:
    """Admission and collection between the buffer and the engines (driver thread only).

    ``side``: the ``SideRollout`` running now (``rollout``), or None; while one runs no training
    request is drawn or admitted, and its episodes and retries go to it, not to the buffer."""

    def __init__(self, run: RunContext, buf: GroupBuffer, evals: Evaluator | None = None) -> None:
        self.run, self.buf = run, buf
        self.evals = evals  # dedicated_eval.DedicatedEval (eval during training) or None
        self.idle_since: float | None = None
        self.admission_wait_s = 0.0
        self.aborted = 0
        self.side: SideRollout | None = None

    def pump(self, wait_s: float) -> None:
        """Top the queue up with new task instances, admit what the bound allows, submit it
        (neither while a side rollout runs), collect what finished (up to ``wait_s`` seconds'
        wait) and file it with the side rollout that owns it or the buffer."""
        run, buf, side = self.run, self.buf, self.side
        if side is None:
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
            if side is not None and side.owns(ep.episode_id):
                side.add_episode(ep)
                continue
            buf.add_episode(ep)
            self.aborted += ep.termination_reason == TerminationReason.ABORTED
        for aborted_id, retry in retries:
            if side is not None and side.owns(aborted_id):
                side.add_retry(aborted_id, retry)
            else:
                buf.add_retry(aborted_id, retry)
        if self.evals is not None:  # never blocks: collect a finished eval, start the waiting one
            self.evals.poll()

    def rollout(self, requests: list[EpisodeRequest], policy_version: int,
                budget: Any = None) -> tuple[list[Episode], float, dict[str, float]]:
        """``EnginePool.rollout``'s call on the running stream (the difficulty profile,
        ``DifficultyFilter.profile``): submit ``requests`` beside the training episodes in
        flight, drawing and admitting no training request meanwhile, and collect until each
        has a finished episode (lost engines' requests are retried with ``attempt + 1``, their
        aborted attempts returned too). Returns ``(episodes, seconds, {})``, episodes as
        ``SideRollout.episodes``.

        Raises:
            ContractError: ``policy_version`` is not the engines' (``run.policy_version``), a
                ``budget`` (the stream samples with the run's own), or a side rollout already runs.
        """
        if int(policy_version) != self.run.policy_version or budget is not None or self.side is not None:
            raise ContractError(f"stream rollout at policy_version={policy_version} (the engines are at "
                                f"{self.run.policy_version}), budget={budget!r}, another running: "
                                f"{self.side is not None}; expected the engines' version, no budget, none running")
        t0 = time.perf_counter()
        side = self.side = SideRollout(list(requests))
        try:
            self.run.pool.stream_submit(list(requests))
            while not side.done:
                self.pump(POLL_S)
        finally:
            self.side = None
        return side.episodes(), time.perf_counter() - t0, {}

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


def _rows(groups: list[AdmittedGroup]) -> int:
    """The trainer rows of ``groups``' finished episodes (``async/stale_dropped``)."""
    return sum(len(e.rows()) for g in groups for e in g.finished.values() if e.turns)


class StreamSource:
    """``BatchSource`` over ``run.pool`` (a ``StreamingEnginePool``) and a ``GroupBuffer``
    (module docstring). ``state``: the checkpoint's controller state on resume (its
    ``async.pending_requests`` are queued first); ``evals``: the run's evaluator, moved along
    between collects. Starts the engines' stream at ``run.policy_version``."""

    def __init__(self, run: RunContext, state: dict[str, Any] | None, evals: Evaluator | None = None) -> None:
        cfg = run.cfg
        self.run, self.B, self.k = run, cfg.env.tasks_per_iteration, cfg.controller.max_staleness
        self.buf = GroupBuffer(self.B, self.k)
        resumed = requests_from_state(((state or {}).get("async") or {}).get("pending_requests", []))
        for reqs in group_requests(resumed):
            self.buf.queue(reqs)
        if resumed:
            log.info("resume: re-issuing %d requests (%d groups) that were admitted or queued but not trained at the "
                     "checkpoint", len(resumed), len(self.buf.pending))
        self.streamer = _Streamer(run, self.buf, evals)
        self.groups: list[AdmittedGroup] = []  # the update's trained groups so far
        self.dropped: list[AdmittedGroup] = []  # the update's stale groups (stored, never scored)
        self.freed = 0  # groups of this update whose slots the refill freed (not trained)
        self.in_flight = self.buffered = 0
        self.lost_before = run.pool.engines_lost
        run.pool.stream_start(run.policy_version)

    def before_iteration(self, run: RunContext, it: int) -> dict[str, float]:
        """The difficulty profile when due, on the stream at ``run.policy_version`` with
        admission paused (module docstring); its metrics."""
        if run.difficulty is None:
            return {}
        return run.difficulty.before_iteration(run, it, pool=self.streamer)

    def take(self, groups: int) -> Taken:
        """``groups`` fresh complete groups (``_Streamer.take_fresh``)."""
        self.groups, self.dropped, self.freed = [], [], 0
        return self._take(groups)

    def more(self, missing: int) -> Taken:
        """``missing`` more: the ``len(groups) - (B - missing)`` groups selection filtered are
        not trained, so their slots go to the re-issues and new groups at once."""
        filtered = len(self.groups) - (self.B - missing)  # missing > 0: exactly B - missing groups survive
        self.buf.unhold(filtered - self.freed)
        self.freed = filtered
        return self._take(missing)

    def _take(self, groups: int) -> Taken:
        """``groups`` fresh groups; ``seconds``: the wall time waited for them (``time/rollout_s``
        sums the take's and the refills')."""
        t0 = time.perf_counter()
        dropped: list[AdmittedGroup] = []
        fresh = self.streamer.take_fresh(groups, dropped)
        self.groups += fresh
        self.dropped += dropped
        self.in_flight, self.buffered = self.buf.in_flight(), len(self.buf.complete_groups())
        return Taken(_episodes(fresh), _episodes(dropped), time.perf_counter() - t0)

    def while_updating(self, step: Callable[[], UpdateResult], after_submit: Callable[[], None]) -> UpdateResult:
        """The step in a background thread while the driver keeps admitting and collecting."""
        return step_while_pumping(step, (), self.streamer.pump, after_submit=after_submit)

    def sync_weights(self, version: int, payload: Any) -> dict[str, float]:
        """Every engine loads ``version`` while its episodes keep running (``controller.partial_rollout``)."""
        run = self.run
        return run.pool.stream_update_weights(run.group.actors, version, run.cfg.controller.partial_rollout,
                                              payload=payload)

    def after_sync(self, sync_metrics: dict[str, float]) -> dict[str, float]:
        """The consumed groups' slots are released: the engines now sample at the new version."""
        self.buf.release()
        return sync_metrics or {"async/preempted_requests": 0.0, "async/restarted_episodes": 0.0}

    def metrics(self, taken: Taken, credit: Any, version: int) -> tuple[dict[str, float], dict[str, float]]:
        """``cluster/engines*`` and the ``async/*`` metrics of the update from ``version``."""
        pool = self.run.pool
        rows = [] if credit.batch is None else [int(x) for x in credit.batch.policy_versions.tolist()]
        extra = staleness_metrics(rows, version)
        extra.update({"async/stale_dropped": float(_rows(self.dropped)),
                      "async/stale_dropped_groups": float(len(self.dropped)),
                      "async/in_flight": float(self.in_flight), "async/buffered_groups": float(self.buffered),
                      "async/admission_wait_s": self.streamer.flush_idle(), "async/groups": float(len(self.groups))})
        pool_metrics = {"cluster/engines": float(len(pool.engine_indices)),
                        "cluster/engines_lost": float(pool.engines_lost - self.lost_before)}
        self.lost_before = pool.engines_lost
        return pool_metrics, extra

    def checkpoint_state(self) -> tuple[str, dict[str, Any]]:
        """Every admitted-but-untrained and queued request (``async.pending_requests``)."""
        held = self.buf.held_requests()
        return (f"{len(held)} requests admitted or queued and not trained; a resume re-issues them first "
                "(async.pending_requests)", {"async": {"pending_requests": requests_state(held), "max_staleness": self.k}})

    def stop(self, interrupted: bool) -> None:
        """Stop the stream; after an interrupt, only say what is dropped (an orderly stop waits on
        env steps; the pool is killed next)."""
        if interrupted:
            log.warning("interrupted: %d requests admitted or queued and not trained are dropped with this process; "
                        "the latest checkpoint recorded its own (async.pending_requests) and a resume re-issues them",
                        len(self.buf.held_requests()))
            return
        try:
            self.run.pool.stream_stop()
        except Exception:  # the run is ending anyway (an engine lost): the pool is killed next
            log.debug("stream_stop failed", exc_info=True)


def _episodes(groups: list[AdmittedGroup]) -> list[Episode]:
    return [e for g in groups for e in g.episodes()]


__all__ = ["POLL_S", "SideRollout", "StreamSource", "UPDATE_POLL_S", "group_requests", "in_background", "step_while_pumping"]
