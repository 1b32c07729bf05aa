"""Streaming rollout: one background thread owns the engine and a ``RolloutSession`` and
steps it continuously; other threads submit requests, collect finished episodes and hand
weight loads to it through queues (the rollout side of ``controller.mode: async``).

``RolloutActor``'s ``stream_*`` methods (``agentrl.cluster.actors.rollout_actor``) are thin wrappers of
``StreamRunner``; while a stream runs nothing else touches the engine.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from typing import Any, Sequence

from agentrl.errors import ClusterError, ConfigError, ContractError
from agentrl.rollout.session import LOAD_MODES, RolloutSession, WeightLoad
from agentrl.types import Episode, EpisodeRequest

log = logging.getLogger(__name__)

_IDLE_WAIT_S = 0.02  # how long the idle loop waits for a command before looking again


class LoadProxy:
    """Stands in for the engine in ``WeightReceiver`` calls: ``update_weights(views)``
    hands the load to the loop thread and returns when the new weights are live."""

    def __init__(self, runner: "StreamRunner", policy_version: int | None, mode: str) -> None:
        self.runner, self.policy_version, self.mode = runner, policy_version, mode
        self.stats: dict[str, Any] = {}

    def update_weights(self, named_tensors: Any) -> str:
        load = WeightLoad(apply=lambda: self.runner.engine.update_weights(named_tensors),
                          policy_version=self.policy_version, mode=self.mode)
        self.stats = self.runner.load(load)
        return self.stats["method"]


class StreamRunner:
    """The loop thread of a streaming rollout over one ``RolloutWorker``.

    Args:
        worker: the ``RolloutWorker`` (its engine is driven by the loop thread only).
        policy_version: the engine's weight version at start (0, or the resumed version).
    """

    def __init__(self, worker: Any, policy_version: int = 0) -> None:
        self.worker = worker
        self.engine = worker.engine
        self.policy_version = int(policy_version)
        self._inbox: queue.Queue = queue.Queue()
        self._done: list[Episode] = []
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._error: BaseException | None = None
        self._submitted = 0
        self._collected = 0
        self._unfinished: list[EpisodeRequest] = []
        self._live_ids: set[str] = set()  # episode ids submitted and not finished
        self._control = threading.Lock()  # start / stop: one at a time

    # ------------------------------------------------------------------ control
    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def start(self) -> None:
        """Start the loop thread (idempotent while it runs).

        Raises:
            ClusterError: a previous loop thread died (its error is the cause).
        """
        # Under a lock: the actor serves stream_* calls on several threads, and two concurrent
        # starts must not both start a loop thread (two threads stepping one vLLM engine
        # corrupt its scheduler: a KeyError in update_from_output).
        with self._control:
            if self.running:
                return
            if self._error is not None:
                raise ClusterError(f"the rollout stream died earlier: {type(self._error).__name__}: {self._error}") from self._error
            self._stop.clear()
            self._thread = threading.Thread(target=self._main, name="agentrl-rollout-stream", daemon=True)
            self._thread.start()

    def set_policy_version(self, version: int) -> None:
        """Set the engine's weight version (resume); only while no stream runs.

        Raises:
            ConfigError: ``version`` < 0. ClusterError: the stream runs.
        """
        if int(version) < 0:
            raise ConfigError(f"policy_version={version} must be >= 0")
        if self.running:
            raise ClusterError("set_policy_version while the rollout stream runs; a weight load sets it then")
        self.policy_version = int(version)

    def submit(self, requests: Sequence[EpisodeRequest]) -> None:
        """Enqueue requests (non-blocking); their episodes start under the version current
        when the loop thread takes them.

        Raises:
            ClusterError: the stream is not running (or died: its error is the cause).
            ContractError: an ``episode_id`` repeated in ``requests`` or still in flight.
        """
        self._check_alive()
        reqs = list(requests)
        ids = [r.episode_id for r in reqs]
        with self._cv:
            dup = sorted({i for i in ids if ids.count(i) > 1} | (set(ids) & self._live_ids))
            if dup:
                raise ContractError(f"stream_submit: episode_ids {dup[:5]} are repeated or still in flight; "
                                    "expected distinct (group_id, index, attempt) per request")
            self._live_ids.update(ids)
            self._submitted += len(reqs)
        self._inbox.put(("submit", reqs))

    def collect(self, wait_s: float) -> list[Episode]:
        """Episodes finished since the last call; waits up to ``wait_s`` seconds for at least
        one; ``[]`` on timeout.

        Raises:
            BaseException: the loop thread's error, if it died.
        """
        deadline = time.monotonic() + max(0.0, float(wait_s))
        with self._cv:
            while not self._done and self._error is None and self.running:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(left)
            out, self._done = self._done, []
            self._collected += len(out)
            if not out and self._error is not None:
                raise self._error
            return out

    def in_flight(self) -> int:
        """Episodes submitted and not yet collected."""
        with self._cv:
            return self._submitted - self._collected

    def load(self, load: WeightLoad, timeout_s: float | None = None) -> dict[str, Any]:
        """Hand ``load`` to the loop thread; returns its ``stats`` once the weights are live.

        Raises:
            ClusterError: the stream is not running, or died before the load was applied.
            BaseException: the load's own error (e.g. ``EngineError`` from the reset).
        """
        if load.mode not in LOAD_MODES:  # pragma: no cover - WeightLoad checks it
            raise ConfigError(f"mode={load.mode!r}")
        self._check_alive()
        done = threading.Event()
        box: dict[str, Any] = {}
        self._inbox.put(("load", (load, done, box)))
        while not done.wait(0.1):
            if not self.running:
                raise ClusterError("the rollout stream stopped before the weight load was applied") from self._error
        if "error" in box:
            raise box["error"]
        return load.stats

    def stop(self, timeout_s: float = 300.0) -> list[EpisodeRequest]:
        """Stop the loop thread: abort everything in flight, close every env and sandbox;
        returns the requests whose episodes had not finished (also those still queued).
        Finished episodes not yet collected stay collectable."""
        with self._control:
            if self._thread is None:
                return []
            self._stop.set()
            self._inbox.put(("wake", None))
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise ClusterError(f"the rollout stream did not stop within {timeout_s:g} s")
            self._thread = None
            out, self._unfinished = self._unfinished, []
        with self._cv:
            self._submitted -= len(out)
            self._live_ids.difference_update(r.episode_id for r in out)
        return out

    def _check_alive(self) -> None:
        if self._error is not None:
            raise ClusterError(f"the rollout stream died: {type(self._error).__name__}: {self._error}") from self._error
        if not self.running:
            raise ClusterError("the rollout stream is not running; call stream_start first")

    # ------------------------------------------------------------------ the loop thread
    def _main(self) -> None:
        session = RolloutSession(self.worker, self.policy_version)
        pending_loads: list[tuple[WeightLoad, threading.Event, dict]] = []
        try:
            while not self._stop.is_set():
                self._take_commands(session, pending_loads, block=session.idle())
                if self._stop.is_set():
                    break
                if pending_loads and not session.load_pending():
                    session.request_load(pending_loads[0][0])
                try:
                    finished = session.step_once(wait_s=_IDLE_WAIT_S)
                except BaseException as exc:
                    if pending_loads and session.load_pending():
                        pending_loads[0][2]["error"] = exc
                        pending_loads.pop(0)[1].set()
                    raise
                self.policy_version = session.policy_version
                if pending_loads and not session.load_pending():  # applied in this step
                    pending_loads.pop(0)[1].set()
                if finished:
                    with self._cv:
                        self._done.extend(finished)
                        self._live_ids.difference_update(ep.episode_id for ep in finished)
                        self._cv.notify_all()
        except BaseException as exc:  # the caller sees it at its next collect / submit / load
            log.exception("the rollout stream died")
            self._error = exc
        finally:
            try:
                self._unfinished = session.abort_all() + self._unfinished
                for kind, arg in self._drain_inbox():
                    if kind == "submit":
                        self._unfinished.extend(arg)
                    elif kind == "load":
                        pending_loads.append(arg)
                for _, done, box in pending_loads:
                    box.setdefault("error", ClusterError("the rollout stream stopped before the weight load was applied"))
                    done.set()
            finally:
                session.shutdown()
                with self._cv:
                    self._cv.notify_all()

    def _take_commands(self, session: RolloutSession, pending_loads: list, block: bool) -> None:
        try:
            cmd = self._inbox.get(timeout=_IDLE_WAIT_S) if block else self._inbox.get_nowait()
        except queue.Empty:
            return
        cmds = [cmd, *self._drain_inbox()]
        for kind, arg in cmds:
            if kind == "submit":
                session.submit(arg)
            elif kind == "load":
                pending_loads.append(arg)

    def _drain_inbox(self) -> list[tuple[str, Any]]:
        out = []
        while True:
            try:
                out.append(self._inbox.get_nowait())
            except queue.Empty:
                return out
