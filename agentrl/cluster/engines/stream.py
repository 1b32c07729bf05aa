"""The engine pool in streaming mode (``controller.mode: async``): requests go to the engines
one group at a time while they run, finished episodes come back as they finish, and weight
loads happen with episodes in flight (``RolloutActor.stream_*``; the partial-rollout modes
are the engines' side, ``agentrl.rollout``).

Dispatch: each submitted batch goes to the least-loaded live engines by water-filling
(``assign_requests``: in-flight counts as even as possible, contiguous slices so a group's
members share an engine's prefix cache where the counts allow; a group may span engines,
grouping is by ``group_id`` only).

Collecting: every live engine always has one ``stream_collect`` call outstanding;
``collect(wait_s)`` returns what the calls that answered within ``wait_s`` brought. An
engine lost while streaming (its call raises one of ``ENGINE_LOST_ERRORS``, or it is lost
during a weight load) loses every request it held: each becomes an aborted episode (stored,
never scored) and a retry with ``attempt + 1`` that is submitted to the remaining engines
(``abort_requests``, as ``EnginePool.rollout`` does). With ``cluster.node_wait_s > 0`` a
replacement is started too and joins the stream when it is up (with the current weights and
version); the retries do not wait for it.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Sequence

import ray

from agentrl.cluster.actors.placement import dedicated_eval_engines
from agentrl.cluster.engines.dispatch import (
    abort_requests,
    assign_requests,
    describe_engine,
    split_contiguous,
    whole_groups,
)
from agentrl.cluster.engines.eval_engine import start_eval_engine
from agentrl.cluster.engines.pool import ENGINE_LOST_ERRORS, EnginePool, _Call, _Engine
from agentrl.errors import ClusterError
from agentrl.types import Episode, EpisodeRequest

log = logging.getLogger(__name__)


class StreamingEnginePool(EnginePool):
    """``EnginePool`` plus the streaming calls (module docstring). Same constructor; the
    synchronous ``rollout`` still works while no stream runs."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._owned: dict[int, dict[str, EpisodeRequest]] = {}  # engine index -> episode id -> request
        self._orphans: list[tuple[_Engine, BaseException, list[EpisodeRequest]]] = []
        self._collects: dict[Any, _Engine] = {}
        self._streaming = False
        self._stream_version = 0
        self.engines_lost = 0
        # the dedicated eval engine (eval during async training, agentrl.driver.dedicated_eval): started
        # with the engines so its model loads while the run starts; ready() does not wait for it
        self.eval_engine: Any = None
        if dedicated_eval_engines(self.cfg):
            self.eval_engine = start_eval_engine(self.cfg, self._model_path, self._run_id, self._hosts)

    def kill(self) -> None:
        """``EnginePool.kill``, and the eval engine. Idempotent."""
        super().kill()
        if self.eval_engine is not None:
            self._kill(self.eval_engine)
            self.eval_engine = None

    # -- lifecycle ---------------------------------------------------------------------
    def stream_start(self, policy_version: int) -> None:
        """Start every live engine's stream at ``policy_version`` (0, or the resumed version)."""
        self._stream_version = int(policy_version)
        for e in list(self._engines):
            self._start_engine_stream(e)
        self._streaming = True

    def _start_engine_stream(self, e: _Engine) -> None:
        ray.get(e.actor.set_policy_version.remote(self._stream_version))
        ray.get(e.actor.stream_start.remote())
        self._owned.setdefault(e.index, {})

    def stream_stop(self) -> list[EpisodeRequest]:
        """Stop every engine's stream; returns the requests whose episodes had not finished
        (in flight when stopped), engine by engine. Lost engines are skipped."""
        self._streaming = False
        out: list[EpisodeRequest] = []
        for e in list(self._engines):
            try:
                out.extend(ray.get(e.actor.stream_stop.remote()))
            except ENGINE_LOST_ERRORS:
                continue
        self._collects.clear()
        self._owned.clear()
        return out

    # -- requests ----------------------------------------------------------------------
    def stream_submit(self, requests: Sequence[EpisodeRequest]) -> None:
        """Hand ``requests`` to the least-loaded live engines (module docstring).

        Raises:
            ClusterError: no live engine.
        """
        requests = list(requests)
        if not requests:
            return
        if not self._engines:
            raise ClusterError(self._none_left_message())
        counts = assign_requests(len(requests), [len(self._owned.get(e.index, {})) for e in self._engines])
        if self.whole_groups:
            counts = whole_groups(counts, [r.group_id for r in requests])
        refs = []
        for e, part in zip(list(self._engines), split_contiguous(requests, counts)):
            if part:
                owned = self._owned.setdefault(e.index, {})
                owned.update({r.episode_id: r for r in part})
                e.in_flight = len(owned)
                refs.append((e, e.actor.stream_submit.remote(part)))
        for e, ref in refs:
            try:
                ray.get(ref)
            except ENGINE_LOST_ERRORS as exc:
                self._lose(e, exc, {}, _Call(e, []))  # its requests are aborted and retried by collect

    def in_flight(self) -> int:
        """Requests submitted to live engines and not yet collected."""
        return sum(len(v) for v in self._owned.values())

    def collect(self, wait_s: float) -> tuple[list[Episode], list[tuple[str, EpisodeRequest]]]:
        """Episodes finished since the last call, waiting up to ``wait_s`` seconds for the
        first engine to answer.

        Returns:
            ``(episodes, retries)``: finished episodes and the aborted ones of lost engines;
            ``retries``: ``(aborted episode id, retry request)`` for each aborted one, already
            submitted to the remaining engines.

        Raises:
            ClusterError: every engine is lost (none back within ``cluster.node_wait_s``).
            Whatever an engine's loop thread raised (``stream_collect`` re-raises it).
        """
        self._adopt_ready(timeout_s=0.0)  # replacements join with the current weights
        live = {id(e) for e in self._collects.values()}
        for e in self._engines:
            if id(e) not in live:
                self._collects[e.actor.stream_collect.remote(wait_s)] = e
        episodes: list[Episode] = []
        if self._collects:
            done, rest = ray.wait(list(self._collects), num_returns=1, timeout=wait_s)
            if done and rest:  # every other engine that has answered by now too
                done += ray.wait(rest, num_returns=len(rest), timeout=0)[0]
            for ref in done:
                e = self._collects.pop(ref)
                try:
                    got = ray.get(ref)
                except ENGINE_LOST_ERRORS as exc:
                    self._lose(e, exc, {}, _Call(e, []))
                    continue
                owned = self._owned.get(e.index, {})
                for ep in got:
                    owned.pop(ep.episode_id, None)
                e.in_flight = len(owned)
                episodes.extend(got)
        retries: list[tuple[str, EpisodeRequest]] = []
        while self._orphans:
            e, exc, reqs = self._orphans.pop(0)
            if self.cfg.cluster.node_wait_s > 0 and not any(s.index == e.index for s in self._starting):
                self._start_replacement(e.index)
            aborted, again = abort_requests(reqs, e.index, e.node, exc, prompt_mode=self.cfg.rollout.prompt_mode)
            log.warning("%s lost %d streaming episodes (%s); submitting them again with attempt + 1 to the %d "
                        "remaining engines", describe_engine(e.index, e.node), len(reqs), type(exc).__name__,
                        len(self._engines))
            episodes.extend(aborted)
            retries.extend((a.episode_id, r) for a, r in zip(aborted, again))
        if retries:
            if not self._engines and not self._starting:
                raise ClusterError(self._none_left_message())
            if not self._engines:  # wait for the replacement (cluster.node_wait_s) before submitting
                deadline = max(s.deadline for s in self._starting)
                while not self._engines and self._starting and time.monotonic() < deadline:
                    self._adopt_ready(timeout_s=1.0)
                if not self._engines:
                    raise ClusterError(self._none_left_message())
            self.stream_submit([r for _, r in retries])
        return episodes, retries

    def _adopt_ready(self, timeout_s: float, *, push_weights: bool = True) -> list[_Engine]:
        """``EnginePool._adopt_ready``, plus: while streaming, an adopted replacement starts its
        stream at the current version (after its weights, or before the load that brings them)."""
        adopted = super()._adopt_ready(timeout_s, push_weights=push_weights)
        if self._streaming:
            for e in adopted:
                self._start_engine_stream(e)
        return adopted

    def _lose(self, eng: _Engine, exc: BaseException, calls: dict, failed: _Call) -> list[int]:
        """``EnginePool._lose``, plus: the requests it held while streaming become orphans that
        ``collect`` aborts and retries (and starts a replacement, ``cluster.node_wait_s > 0``)."""
        owned = self._owned.pop(eng.index, {})
        was_live = eng in self._engines
        out = super()._lose(eng, exc, calls, failed)
        for ref in [r for r, e in self._collects.items() if e is eng]:
            del self._collects[ref]
        if self._streaming and was_live:
            self.engines_lost += 1
            self._orphans.append((eng, exc, list(owned.values())))
        return out

    # -- weights -------------------------------------------------------------------------
    def stream_update_weights(self, trainer_actors: Sequence[Any], policy_version: int, mode: str,
                              payload: list | None = None) -> dict[str, float]:
        """``update_weights`` with the engines streaming: their version becomes
        ``policy_version`` once the new weights are live; episodes in flight follow ``mode``.
        ``payload``: as ``EnginePool.update_weights``' (weights already gathered).

        Returns:
            ``update_weights``' metrics plus ``async/preempted_requests`` and
            ``async/restarted_episodes`` summed over the engines' ``last_weight_load``.
        """
        m = self.update_weights(trainer_actors, policy_version=policy_version, mode=mode, payload=payload)
        self._stream_version = int(policy_version)
        preempted = restarted = 0.0
        for e in list(self._engines):
            try:
                last = ray.get(e.actor.last_weight_load.remote())
            except ENGINE_LOST_ERRORS as exc:
                self._lose(e, exc, {}, _Call(e, []))
                continue
            preempted += float(last.get("preempted_requests", 0) or 0)
            restarted += float(last.get("restarted_episodes", 0) or 0)
        m["async/preempted_requests"] = preempted
        m["async/restarted_episodes"] = restarted
        return m


__all__ = ["StreamingEnginePool"]
