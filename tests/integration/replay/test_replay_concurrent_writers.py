"""Four OS processes writing episodes (turns, sandbox events, metrics) into one new replay
database at once lose nothing and duplicate nothing (as rollout workers on several nodes do): SQLite (one file, WAL,
``BEGIN IMMEDIATE`` with a busy timeout and retries) and PostgreSQL (row locks; an advisory
lock serializes the schema set-up of the new database). Real processes
(``concurrent_writer.py``), real databases."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import func, select

from agentrl.replay import ReplayStore
from agentrl.replay.models import EpisodeRow, MetricRow, SandboxEventRow, TurnRow
from tests.integration.replay.concurrent_writer import batch

REPO = Path(__file__).resolve().parents[3]
WRITERS, BATCHES, EPISODES = 4, 4, 10


def test_four_processes_writing_at_once_lose_nothing(db_url: str) -> None:
    start_at = time.time() + 3.0  # every process is up and imported by then (2 cores)
    env = dict(os.environ, PYTHONPATH=str(REPO))
    procs = [subprocess.Popen([sys.executable, "-m", "tests.integration.replay.concurrent_writer", db_url,
                               str(w), str(BATCHES), str(EPISODES), str(start_at)],
                              cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for w in range(WRITERS)]
    results = []
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, f"writer exited {p.returncode}:\n{err[-3000:]}"
        results.append(json.loads(out.strip().splitlines()[-1]))

    n = WRITERS * BATCHES * EPISODES
    with ReplayStore(db_url) as store:
        with store.engine.connect() as conn:
            ids = list(conn.scalars(select(EpisodeRow.episode_id)))
            turns = conn.scalar(select(func.count()).select_from(TurnRow))
            events = conn.scalar(select(func.count()).select_from(SandboxEventRow))
            metrics = conn.scalar(select(func.count()).select_from(MetricRow))
        assert len(ids) == len(set(ids)) == n
        assert set(ids) == {i for r in results for i in r["ids"]}
        assert (turns, events, metrics) == (2 * n, 4 * n, WRITERS * BATCHES * 2)
        for w in range(WRITERS):
            assert store.count_episodes(f"w{w}") == BATCHES * EPISODES
            assert store.get_run(f"w{w}").resume_count == 0
            for b in (0, BATCHES - 1):
                for ep in batch(w, b, EPISODES)[:: EPISODES // 3]:
                    assert store.get_episode(ep.episode_id) == ep
            assert store.get_advantages(f"w{w}/it0/0") == [None, None]  # the replace won
            assert store.get_advantages(f"w{w}/it1/0") == [0.5, -0.5]
    assert all(r["replaced"] == EPISODES for r in results)
    slowest = max(t for r in results for t in r["write_s"])
    print(f"\n[{db_url.split(':')[0]}] {WRITERS} writers x {BATCHES} batches x {EPISODES} episodes: "
          f"slowest batch write {slowest * 1e3:.0f} ms")


def test_a_write_locked_out_past_its_retries_is_a_clear_infra_error(tmp_path, make_episode) -> None:
    import sqlite3

    import pytest

    from agentrl.errors import InfraError

    url = f"sqlite:///{tmp_path / 'replay.db'}"
    with ReplayStore(url, busy_timeout_s=0.2) as store:
        store.start_run("run-l", {})
        other = sqlite3.connect(tmp_path / "replay.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # another process's write transaction that never ends
        t0 = time.perf_counter()
        with pytest.raises(InfraError, match=r"add_episodes failed 3 times on a locked database.*0\.2 s busy timeout"):
            store.add_episodes("run-l", 0, [make_episode(0)])
        assert time.perf_counter() - t0 < 5.0
        other.execute("ROLLBACK")
        store.add_episodes("run-l", 0, [make_episode(0)])  # the lock gone, the write goes through
        assert store.count_episodes("run-l") == 1
        other.close()
