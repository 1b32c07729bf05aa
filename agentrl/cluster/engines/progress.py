"""Episodes finished of an ``EnginePool.rollout`` call while it runs, for a progress bar
(``agentrl eval``, ``agentrl tasks profile``).

``EpisodeProgress`` is a daemon thread of the driver: every ``interval_s`` it asks each
engine how many episodes of its running ``rollout`` call finished
(``RolloutActor.rollout_progress``, answered in the actor's ``stream`` concurrency group
while ``rollout`` runs in the default one; the count grows where the agent loop finishes an
episode, ``RolloutWorker.run``'s ``on_episode``) and calls ``report(done, total)`` when the
sum grew. ``report`` gets ``(0, total)`` on entry and ``(total, total)`` when the rollout
returned. Only engines whose call is for the same ``run_id`` / ``iteration`` as the
requests count (an engine's count of an earlier call is not this one's). While an engine is
lost and its episodes are rolled out again the count is an estimate: it never goes back and
never passes ``total``.

Example::

    with EpisodeProgress(lambda: pool.actors, requests, report):
        episodes, _, _ = pool.rollout(requests, version, budget)
"""

from __future__ import annotations

import logging
import threading
from typing import Any, Callable, Sequence

log = logging.getLogger(__name__)

__all__ = ["EpisodeProgress"]


class EpisodeProgress:
    """Reports ``(episodes finished, episodes requested)`` of one rollout (module docstring).

    Args:
        actors: returns the pool's live engine actors (called at every poll: engines can be
            replaced mid-rollout).
        requests: the ``EpisodeRequest``s of the rollout; ``total = len(requests)``.
        report: called with ``(done, total)`` from the poller thread (and the caller's).
        interval_s: seconds between polls.
    """

    def __init__(self, actors: Callable[[], Sequence[Any]], requests: Sequence[Any],
                 report: Callable[[int, int], None], interval_s: float = 0.5) -> None:
        self.actors = actors
        self.total = len(requests)
        self.keys = {f"{r.run_id}/{r.iteration}" for r in requests}
        self.report = report
        self.interval_s = interval_s
        self.done = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _advance(self, done: int) -> None:
        with self._lock:
            done = min(self.total, done)
            if done <= self.done:
                return
            self.done = done
        self.report(done, self.total)

    def poll(self) -> int:
        """Ask the engines once; returns the episodes of this rollout they finished."""
        import ray  # heavy: ray

        refs = [a.rollout_progress.remote() for a in self.actors()]
        counts = ray.get(refs, timeout=30) if refs else []
        return sum(int(c[0]) for c in counts if c[2] in self.keys)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            try:
                self._advance(self.poll())
            except Exception as exc:  # a lost engine is the rollout's to handle; the bar waits
                log.debug("rollout progress poll failed: %s", exc)

    def __enter__(self) -> "EpisodeProgress":
        self.report(0, self.total)
        self._thread = threading.Thread(target=self._run, name="agentrl-rollout-progress", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        if exc_type is None:
            self._advance(self.total)
