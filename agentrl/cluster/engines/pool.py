"""N rollout engines (``RolloutActor``s) behind one ``rollout`` call, and what happens when
one of them is lost.

Dispatch. A batch of requests is split over the live engines once, up front, by
water-filling: each engine gets a contiguous slice so that its in-flight episode count
(what it already runs plus its new slice) is as even as possible (``assign_requests``; the
pure helpers of dispatch and of a lost engine's requests are ``agentrl.cluster.engines.dispatch``).
Each engine then runs its whole slice in one ``RolloutActor.rollout`` call, so its agent
loop keeps every one of its episodes in vLLM's continuous batch at once. Contiguous slices
keep a group's rollouts (adjacent in request order, one shared prompt) on one engine where
the counts allow, so vLLM's prefix cache serves the group's prompt once; a group may still
span two engines, since grouping is by ``group_id`` only and never by engine.

Why not hand out small chunks to whichever engine frees up first: a ``RolloutActor`` runs
one call at a time (one agent loop drives its engine), so every chunk boundary drains that
engine's batch to nothing and restarts it, and pays a call's fixed costs again: chunked
dispatch costs 2-4x throughput on one engine (``tests/benchmarks/bench_dispatch.py``
measures it). Work-stealing across engines pays only when engines differ in speed; equal
engines given equal shares finish together. Requests are re-dispatched only when an engine
is lost.

Losing an engine. A call that raises ``RayActorError`` (``ActorDiedError`` when its node is
removed or its actor killed, ``ActorUnavailableError`` when it stops answering), or whose
result was lost with its node (``ObjectLostError``, ``NodeDiedError``), loses every episode
that engine had in flight: each becomes an ``Episode`` with termination reason ``aborted``
and an error naming the engine and its node (stored, never scored), and its request is
rolled out again with ``attempt + 1`` (a new episode id; the same sampling seed) on the
remaining engines, least-loaded first. An engine that is merely unavailable is killed so it
cannot come back half-way. With ``cluster.node_wait_s > 0`` a replacement engine is started
first (same role options, same engine index) and the lost requests wait up to that long for
it (logged); it gets the trainers' current weights before it rolls out. No engine left and
none back in time: ``ClusterError`` naming what was lost.

Weights: ``update_weights`` pushes the trainers' weights to every live engine with
``agentrl.cluster.engines.weight_sync.sync_weights`` (``cluster.weight_sync``); a replacement engine
gets them alone when it comes up, before its first episode (on the collective path that
forms a group of its own, and the next full sync forms the group of all engines again).

Return order: ``rollout`` returns, for each request in order, the aborted attempts of that
request (if any) and then its finished episode, so every request is answered exactly once by
a non-aborted episode.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import ray
from ray.exceptions import NodeDiedError, ObjectLostError, OutOfMemoryError, RayActorError

from agentrl.cluster.actors.actor_errors import actor_failure_message
from agentrl.cluster.actors.judge_service import judges_groups
from agentrl.cluster.actors.placement import role_options
from agentrl.cluster.actors.rollout_actor import RolloutActor
from agentrl.cluster.engines.dispatch import (
    abort_requests,
    assign_requests,
    describe_engine,
    split_contiguous,
    whole_groups,
)
from agentrl.cluster.engines.gateway_router import EngineGatewayRouter, serves_gateway
from agentrl.cluster.engines.start import wait_ready
from agentrl.config import Config
from agentrl.errors import ClusterError
from agentrl.rollout.budget import RolloutBudget
from agentrl.types import Episode, EpisodeRequest

log = logging.getLogger(__name__)

ENGINE_LOST_ERRORS: tuple[type[BaseException], ...] = (RayActorError, ObjectLostError, NodeDiedError, OutOfMemoryError)
"""What an engine call raises when the engine is gone: ``RayActorError`` covers
``ActorDiedError`` (node removed, actor killed, ``ray.kill``) and ``ActorUnavailableError``;
``ObjectLostError`` / ``NodeDiedError``: its result went down with its node;
``OutOfMemoryError``: Ray's memory monitor killed the engine's worker (an infrastructure
fault like the others: its episodes are aborted and rolled out again)."""

def _sync_fn(cfg: Config, **load: Any) -> Callable[[Sequence[Any], Sequence[Any]], dict[str, float]]:
    """``weight_sync.sync_weights`` with the run's method (``cluster.weight_sync``); a new
    collective group's members meet within ``cluster.rendezvous_timeout_s``. ``load``: the
    streaming engines' ``policy_version`` and ``mode`` (async mode only; none in sync mode)."""
    from agentrl.cluster.engines.weight_sync import sync_weights  # heavy: torch

    def sync(trainer_actors: Sequence[Any], engine_actors: Sequence[Any]) -> dict[str, float]:
        return sync_weights(trainer_actors, engine_actors, method=cfg.cluster.weight_sync,
                            timeout_s=cfg.cluster.rendezvous_timeout_s, **load)

    return sync


@dataclass
class _Engine:
    index: int
    actor: Any
    node: dict = field(default_factory=dict)
    start_s: float = 0.0
    in_flight: int = 0


@dataclass
class _Starting:
    """A replacement engine being started (``ready`` not yet answered)."""

    index: int
    actor: Any
    ready_ref: Any
    deadline: float


@dataclass
class _Call:
    engine: _Engine
    positions: list[int]


class EnginePool:
    """``rollout.num_engines`` rollout actors placed with ``role_options(cfg, "rollout")``.

    Args:
        cfg: the run's config (``rollout.num_engines``, ``cluster.node_wait_s``, placement).
        cfg_dict: ``cfg.model_dump(mode="json")`` for the actors.
        model_path: local model folder.
        run_id: the run (sandbox labels).
        sandbox_hosts: ``start_sandbox_hosts``' hosts (empty: sandboxes in each engine).

    The actors are created here; ``ready()`` waits for them. ``kill()`` ends them all.
    """

    def __init__(self, cfg: Config, cfg_dict: dict, model_path: str, run_id: str, sandbox_hosts: Sequence[Any] = ()) -> None:
        self.cfg = cfg
        self._cfg_dict = cfg_dict
        self._model_path = model_path
        self._run_id = run_id
        self._hosts = list(sandbox_hosts)
        self._options = role_options(cfg, "rollout")
        self._engines: list[_Engine] = [_Engine(i, self._start_actor(i)) for i in range(cfg.rollout.num_engines)]
        self._starting: list[_Starting] = []
        self._lost: list[str] = []  # descriptions of every engine lost in this run
        self._trainer_actors: Sequence[Any] | None = None  # where the current weights are (set by update_weights)
        self.gateway_router: EngineGatewayRouter | None = None  # for an agent behind the gateway, after ready()
        self.whole_groups = judges_groups(cfg)  # a group-mode judge: no group spans two engines

    # -- actors ----------------------------------------------------------------------
    def _start_actor(self, index: int) -> Any:
        return RolloutActor.options(**role_options(self.cfg, "rollout", index)).remote(
            self._cfg_dict, self._model_path, self._run_id, engine_index=index, sandbox_hosts=self._hosts or None)

    @property
    def model_path(self) -> str:
        """The local model folder the engines load."""
        return self._model_path

    @property
    def sandbox_hosts(self) -> list[Any]:
        """``start_sandbox_hosts``' hosts the engines' sandboxes run on (empty: in each engine)."""
        return list(self._hosts)

    @property
    def actors(self) -> list[Any]:
        """The live engines' actor handles, in engine-index order."""
        return [e.actor for e in self._engines]

    @property
    def engine_indices(self) -> list[int]:
        """The live engines' indices (``0 .. num_engines - 1``; a replacement takes the
        index of the engine it replaces)."""
        return [e.index for e in self._engines]

    def loads(self) -> dict[int, int]:
        """Episodes each live engine has in flight now, by engine index (0 between calls)."""
        return {e.index: e.in_flight for e in self._engines}

    def nodes(self) -> dict[int, dict]:
        """``RolloutActor.node()`` of each live engine, by engine index (after ``ready``)."""
        return {e.index: dict(e.node) for e in self._engines}

    def ready(self) -> list[float]:
        """Wait for every engine to start; returns each one's engine start-up seconds
        ``[num_engines]``.

        Bounded (``agentrl.cluster.engines.start.wait_ready``): each engine must be placed on
        a node within ``cluster.rendezvous_timeout_s`` (an engine the cluster could hold but
        whose resources other actors or jobs hold would otherwise wait for ever) and start
        within ``engine_start.ENGINE_START_S`` after that.

        Raises:
            ClusterError: an engine was not placed in time (naming the engine, what it asks
                for and the cluster's total and free resources), did not start in time, its
                actor died while starting (which engine and why, e.g. the memory monitor's
                kill), or its constructor raised (the error it raised, e.g. a ``ConfigError``
                or ``TemplateError``, on the one line).
        """
        asked = {"CPU": self._options["num_cpus"], "GPU": self._options["num_gpus"], **self._options.get("resources", {})}
        started = wait_ready([(e.index, e.actor) for e in self._engines], asked,
                             place_timeout_s=self.cfg.cluster.rendezvous_timeout_s)
        for e, s in zip(self._engines, started):
            e.start_s, e.node = s.start_s, s.node
        if self.gateway_router is None and serves_gateway(self.cfg):
            self.gateway_router = EngineGatewayRouter(self.actors)
        return [e.start_s for e in self._engines]

    # -- rollout -----------------------------------------------------------------------
    def rollout(self, requests: Sequence[EpisodeRequest], policy_version: int,
                budget: RolloutBudget | None = None) -> tuple[list[Episode], float, dict[str, float]]:
        """Roll out ``requests`` on the live engines (see the module docstring).

        ``budget``: limits, sampling and env kwargs for this call only (``RolloutActor.rollout``;
        e.g. the held-out evaluation's fixed budget); None: the run's rollout settings.

        Returns:
            ``(episodes, rollout_s, metrics)``: per request in order, its aborted attempts
            then its finished episode (``len(episodes) == len(requests) + aborted``);
            wall seconds of the call; ``cluster/engines`` (live at the end),
            ``cluster/engines_lost``, ``cluster/engines_replaced``,
            ``cluster/replacement_wait_s``, ``rollout/aborted_episodes``, and per engine
            index ``rollout/engine_{i}_episodes`` (finished episodes it returned) and
            ``rollout/engine_{i}_s`` (its agent loop's seconds).

        Raises:
            ClusterError: every engine was lost and none came back within
                ``cluster.node_wait_s``.
            ContractError: from the engines (e.g. two requests with one episode id).
        """
        t0 = time.perf_counter()
        self._adopt_ready(timeout_s=0.0)
        current = list(requests)  # the attempt each position is at
        attempts: list[list[Episode]] = [[] for _ in requests]  # per position: aborted attempts, then the finished one
        calls: dict[Any, _Call] = {}
        held: list[int] = []  # positions waiting for a replacement engine
        m: dict[str, float] = {"cluster/engines_lost": 0.0, "cluster/engines_replaced": 0.0,
                               "cluster/replacement_wait_s": 0.0, "rollout/aborted_episodes": 0.0}
        per_engine_eps: dict[int, float] = {e.index: 0.0 for e in self._engines}
        per_engine_s: dict[int, float] = {e.index: 0.0 for e in self._engines}
        wait_started: float | None = None

        def dispatch(positions: list[int]) -> None:
            if not positions:
                return
            if not self._engines:
                raise ClusterError(self._none_left_message())
            counts = assign_requests(len(positions), [e.in_flight for e in self._engines])
            if self.whole_groups:
                counts = whole_groups(counts, [current[p].group_id for p in positions])
            for e, part in zip(list(self._engines), split_contiguous(positions, counts)):
                if part:
                    ref = e.actor.rollout.remote([current[p] for p in part], policy_version, budget)
                    calls[ref] = _Call(e, part)
                    e.in_flight += len(part)

        dispatch(list(range(len(current))))
        while calls or held:
            if held and not self._starting:
                if wait_started is not None:
                    m["cluster/replacement_wait_s"] += time.perf_counter() - wait_started
                    wait_started = None
                if not self._engines:
                    raise ClusterError(self._none_left_message())
                log.warning("no replacement engine within cluster.node_wait_s=%g s; rolling out %d episodes again "
                            "on the %d remaining engines", self.cfg.cluster.node_wait_s, len(held), len(self._engines))
                dispatch(held)
                held = []
                continue
            wait_refs = list(calls) + [s.ready_ref for s in self._starting]
            timeout = None
            if self._starting:
                timeout = max(0.0, min(s.deadline for s in self._starting) - time.monotonic())
            done, _ = ray.wait(wait_refs, num_returns=1, timeout=timeout)
            adopted = self._adopt_ready(timeout_s=0.0)  # ready replacements (and expired ones dropped)
            if adopted:
                m["cluster/engines_replaced"] += len(adopted)
                for e in adopted:
                    per_engine_eps.setdefault(e.index, 0.0)
                    per_engine_s.setdefault(e.index, 0.0)
                if held:
                    if wait_started is not None:
                        m["cluster/replacement_wait_s"] += time.perf_counter() - wait_started
                        wait_started = None
                    dispatch(held)
                    held = []
            for ref in done:
                call = calls.pop(ref, None)
                if call is None:
                    continue  # a replacement's ready ref, handled above
                eng = call.engine
                try:
                    episodes, seconds = ray.get(ref)
                except ENGINE_LOST_ERRORS as exc:
                    lost_positions = self._lose(eng, exc, calls, call)
                    aborted, retries = abort_requests([current[p] for p in lost_positions], eng.index, eng.node, exc,
                                                      prompt_mode=self.cfg.rollout.prompt_mode)
                    for p, ep, r in zip(lost_positions, aborted, retries):
                        attempts[p].append(ep)
                        current[p] = r
                    m["cluster/engines_lost"] += 1
                    m["rollout/aborted_episodes"] += len(aborted)
                    if self.cfg.cluster.node_wait_s > 0:
                        self._start_replacement(eng.index)
                        log.warning("%s lost %d episodes (%s); started a replacement engine and waiting up to "
                                    "cluster.node_wait_s=%g s for it", describe_engine(eng.index, eng.node),
                                    len(lost_positions), type(exc).__name__, self.cfg.cluster.node_wait_s)
                        held.extend(lost_positions)
                        if wait_started is None:
                            wait_started = time.perf_counter()
                    else:
                        log.warning("%s lost %d episodes (%s); rolling them out again on the %d remaining engines",
                                    describe_engine(eng.index, eng.node), len(lost_positions), type(exc).__name__,
                                    len(self._engines))
                        dispatch(lost_positions)
                    continue
                eng.in_flight -= len(call.positions)
                per_engine_eps[eng.index] = per_engine_eps.get(eng.index, 0.0) + len(episodes)
                per_engine_s[eng.index] = per_engine_s.get(eng.index, 0.0) + float(seconds)
                for p, ep in zip(call.positions, episodes):
                    attempts[p].append(ep)
        m["cluster/engines"] = float(len(self._engines))
        m.update({f"rollout/engine_{i}_episodes": v for i, v in sorted(per_engine_eps.items())})
        m.update({f"rollout/engine_{i}_s": v for i, v in sorted(per_engine_s.items())})
        return [ep for eps in attempts for ep in eps], time.perf_counter() - t0, m

    def _lose(self, eng: _Engine, exc: BaseException, calls: dict[Any, _Call], failed: _Call) -> list[int]:
        """Take ``eng`` out of the pool (killed, in case it is only unreachable); returns the
        positions of every call it had in flight (``failed`` and the others, which are
        removed from ``calls``), in request order."""
        positions = list(failed.positions)
        for ref in [r for r, c in calls.items() if c.engine is eng]:
            positions.extend(calls.pop(ref).positions)
        eng.in_flight = 0
        if eng in self._engines:
            self._engines.remove(eng)
        self._lost.append(f"{describe_engine(eng.index, eng.node)} ({type(exc).__name__})")
        try:
            ray.kill(eng.actor)
        except Exception:  # already gone with its node
            pass
        return sorted(positions)

    def _start_replacement(self, index: int) -> None:
        actor = self._start_actor(index)
        self._starting.append(_Starting(index, actor, actor.ready.remote(),
                                        time.monotonic() + self.cfg.cluster.node_wait_s))

    def _adopt_ready(self, timeout_s: float, *, push_weights: bool = True) -> list[_Engine]:
        """Replacement engines whose ``ready`` has answered join the pool, with the current
        weights unless ``push_weights`` is False (the caller pushes next); those past their
        deadline, or that failed to start, are killed."""
        adopted: list[_Engine] = []
        for s in list(self._starting):
            done, _ = ray.wait([s.ready_ref], timeout=timeout_s)
            if done:
                self._starting.remove(s)
                try:
                    start_s = float(ray.get(s.ready_ref))
                    node = dict(ray.get(s.actor.node.remote()))
                    if push_weights and self._trainer_actors is not None:
                        _sync_fn(self.cfg)(self._trainer_actors, [s.actor])
                    if self.gateway_router is not None:
                        self.gateway_router.add([s.actor])
                except ENGINE_LOST_ERRORS as exc:
                    log.warning("replacement for rollout engine %d failed to start: %s", s.index,
                                actor_failure_message(exc, f"rollout engine {s.index}"))
                    self._kill(s.actor)
                    continue
                eng = _Engine(s.index, s.actor, node, start_s)
                self._engines.append(eng)
                self._engines.sort(key=lambda e: e.index)
                adopted.append(eng)
                log.warning("%s is up (replacement, started in %.1f s)", describe_engine(eng.index, node), start_s)
            elif time.monotonic() >= s.deadline:
                self._starting.remove(s)
                log.warning("replacement for rollout engine %d did not start within cluster.node_wait_s=%g s",
                            s.index, self.cfg.cluster.node_wait_s)
                self._kill(s.actor)
        return adopted

    def _none_left_message(self) -> str:
        wait = self.cfg.cluster.node_wait_s
        waited = (f"no replacement started within cluster.node_wait_s={wait:g} s" if wait > 0
                  else "cluster.node_wait_s=0, so no replacement was tried")
        return (f"every rollout engine is lost: {'; '.join(self._lost) or 'none started'}; {waited}. "
                "The run stops here; the last checkpoint is intact (resuming the run continues from it).")

    # -- weights, stats, shutdown ------------------------------------------------------
    def update_weights(self, trainer_actors: Sequence[Any], *, policy_version: int | None = None,
                       mode: str | None = None, payload: list | None = None) -> dict[str, float]:
        """Push the trainers' current weights to every live engine.

        ``trainer_actors``: every trainer rank (the gather is collective). They are kept,
        so that a replacement engine gets the same weights before its first rollout.
        ``policy_version`` / ``mode`` (async mode, engines streaming): the engines' version
        becomes ``policy_version`` and episodes in flight continue, drain or restart per
        ``mode`` (``controller.partial_rollout``); both None (sync mode): the plain load.
        ``payload``: the trainers' current weights already gathered
        (``weight_sync.weights_payload``; object-store path only), sent instead of a new gather.

        Returns:
            ``time/sync_s`` (the whole push), ``sync/engine_{i}_s`` per engine index ``i``,
            and the sync function's other ``sync/*`` metrics (``sync/gather_s``, the
            trainer side), and ``sync/engines_lost`` (engines lost during the push).

        Raises:
            ClusterError: every engine was lost.
        """
        t0 = time.perf_counter()
        self._trainer_actors = list(trainer_actors)
        self._adopt_ready(timeout_s=0.0, push_weights=False)  # the push below includes them
        lost = 0
        while True:
            if not self._engines:
                raise ClusterError(self._none_left_message())
            engines = list(self._engines)
            try:
                load = {} if policy_version is None and mode is None else {"policy_version": policy_version,
                                                                           "mode": mode or "continue"}
                if payload is not None:
                    load["payload"] = payload
                raw = _sync_fn(self.cfg, **load)(self._trainer_actors, [e.actor for e in engines])
                break
            except ENGINE_LOST_ERRORS as exc:
                dead = self._dead_engines(engines)
                if not dead:
                    raise
                for e in dead:
                    self._lose(e, exc, {}, _Call(e, []))
                    log.warning("%s was lost during the weight sync (%s); continuing with %d engines",
                                describe_engine(e.index, e.node), type(exc).__name__, len(self._engines))
                    if self.cfg.cluster.node_wait_s > 0:
                        self._start_replacement(e.index)
                lost += len(dead)
        m: dict[str, float] = {}
        for k, v in raw.items():
            if k.startswith("sync/engine_") and k.endswith("_s"):
                pos = int(k[len("sync/engine_"):-len("_s")])
                m[f"sync/engine_{engines[pos].index}_s"] = float(v)
            else:
                m[k] = float(v)
        m["sync/engines_lost"] = float(lost)
        m["time/sync_s"] = time.perf_counter() - t0
        return m

    def _dead_engines(self, engines: Sequence[_Engine], timeout_s: float = 30.0) -> list[_Engine]:
        """The engines that do not answer ``node()`` (dead or unreachable) within ``timeout_s``."""
        refs = {e.actor.node.remote(): e for e in engines}
        done, pending = ray.wait(list(refs), num_returns=len(refs), timeout=timeout_s)
        dead = [refs[r] for r in pending]
        for r in done:
            try:
                ray.get(r)
            except ENGINE_LOST_ERRORS:
                dead.append(refs[r])
        return sorted(dead, key=lambda e: e.index)

    def pool_stats(self) -> dict | None:
        """The engines' warm sandbox pool statistics merged (``RolloutActor.pool_stats``):
        counts summed, latencies the slowest engine's (a percentile of the union would need
        every sample); None when no engine keeps a pool. A lost engine is skipped."""
        stats = []
        for e in list(self._engines):
            try:
                s = ray.get(e.actor.pool_stats.remote())
            except ENGINE_LOST_ERRORS:
                continue
            if s is not None:
                stats.append(s)
        if not stats:
            return None
        out: dict[str, float] = {}
        for k in stats[0]:
            vals = [s[k] for s in stats]
            out[k] = max(vals) if k.endswith("_s") else sum(vals)
        return out

    def kill(self) -> None:
        """End every engine of the pool (live and starting). Idempotent."""
        for a in [e.actor for e in self._engines] + [s.actor for s in self._starting]:
            self._kill(a)
        self._engines, self._starting = [], []
        if self.gateway_router is not None:
            self.gateway_router.shutdown()
            self.gateway_router = None

    @staticmethod
    def _kill(actor: Any) -> None:
        try:
            ray.kill(actor)
        except Exception:  # already gone
            pass


__all__ = ["ENGINE_LOST_ERRORS", "EnginePool"]
