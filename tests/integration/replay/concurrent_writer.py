"""One of the writer processes of ``test_replay_concurrent_writers.py``:

    python -m tests.integration.replay.concurrent_writer URL WRITER BATCHES EPISODES START_AT

waits until the wall clock reaches ``START_AT`` (so the writers open the new database at the
same moment), opens the store, starts run ``w<WRITER>``, writes ``BATCHES`` iterations of
``EPISODES`` episodes (turns and sandbox events) with their metrics, then writes its first
batch again (a replace). Prints one JSON line: the ids it wrote and its write times.
"""

from __future__ import annotations

import json
import sys
import time

from agentrl.replay import ReplayStore
from tests.integration.replay.episode_factory import build_episode


def batch(writer: int, b: int, n: int) -> list:
    return [build_episode(1000 * writer + 100 * b + i, num_turns=2, events_per_turn=2,
                          episode_id=f"w{writer}/it{b}/{i}") for i in range(n)]


def main(url: str, writer: int, batches: int, episodes: int, start_at: float) -> None:
    time.sleep(max(0.0, start_at - time.time()))
    times = []
    with ReplayStore(url) as store:
        run = f"w{writer}"
        store.start_run(run, {"writer": writer})
        ids = []
        for b in range(batches):
            eps = batch(writer, b, episodes)
            t0 = time.perf_counter()
            store.add_episodes(run, b, eps, {e.episode_id: [0.5, -0.5] for e in eps})
            store.add_metrics(run, b, {"writer": float(writer), "batch": float(b)})
            times.append(time.perf_counter() - t0)
            ids += [e.episode_id for e in eps]
        replaced = store.add_episodes(run, 0, batch(writer, 0, episodes))
    print(json.dumps({"writer": writer, "ids": ids, "replaced": replaced, "write_s": times}))


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), float(sys.argv[5]))
