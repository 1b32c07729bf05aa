"""Viewer scale benchmark (issue 13, point 6): page latency of ``agentrl view`` at 1,000,000
episodes, on SQLite and PostgreSQL, and the replay store's write throughput.

On demand, not in CI (filling a million episodes takes minutes and gigabytes):

    .venv/bin/python tests/benchmarks/bench_viewer.py                      # SQLite, 1,000,000 episodes
    .venv/bin/python tests/benchmarks/bench_viewer.py --postgres postgresql+psycopg://postgres@127.0.0.1:5432/postgres
    .venv/bin/python tests/benchmarks/bench_viewer.py --episodes 20000 --no-sqlite --postgres URL

For each database:

1. **Write throughput** through the store's normal write path: ``ReplayStore.add_episodes``
   in batches of ``--write-batch`` episodes (2 turns, 2 sandbox commands each, as a
   training iteration writes them), ``--write-episodes`` in all; printed in episodes/s.
2. **Bulk fill**: ``--episodes`` episodes of one run (1,000 per iteration, groups of 8, one
   turn and one sandbox command each, varied rewards, lengths, termination reasons and
   texts), inserted in chunks with SQLAlchemy Core ``executemany`` into the tables the
   store made (rows built by the store's own row codecs), then its metrics and completion
   marks. This is a fill, not the write path; its rate is printed too.
3. **Page latency**: ``agentrl view`` is started over the database and every page is fetched
   ``--repeats`` times over HTTP, one request at a time, after one warm-up fetch: runs, run,
   episodes (first page, a keyset page 90% deep, filtered, sorted by reward, text search),
   one episode, one group. p50 and p95 in ms against the 300 ms target.

PostgreSQL: ``--postgres`` names a server (any database on it); a database
``agentrl_bench_viewer`` (``--pg-database``) is created there (dropped first if it exists) and dropped at the
end unless ``--keep``. SQLite: a file under ``--dir`` (default a temporary folder; about
2 GB at 1,000,000 episodes).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timedelta, timezone
from pathlib import Path
from urllib.parse import quote, urlencode
from urllib.request import urlopen

REPO = Path(__file__).resolve().parents[2]
TARGET_MS = 300.0
PER_ITERATION = 1000
GROUP = 8
FILL_RUN = "bench-fill"
WRITE_RUN = "bench-write"
TERMINATIONS = ("env_terminated", "env_truncated", "max_turns", "length", "context_limit")
WORDS = ("grep", "sed", "awk", "sort", "uniq", "head", "tail", "wc", "cat", "find", "xargs", "tr", "cut", "paste")


def _episode(i: int, num_turns: int, events_per_turn: int, prompt_len: int, completion_len: int):
    """One valid episode, varied by ``i`` (rewards, lengths, texts, termination)."""
    from agentrl.types import Episode, ExecResult, SamplingRecord, TerminationReason, Turn

    rng = random.Random(i)
    turns = []
    for k in range(num_turns):
        n_c = max(1, completion_len - rng.randrange(completion_len // 2 + 1))
        word, file = rng.choice(WORDS), f"file_{rng.randrange(1000)}.txt"
        turns.append(Turn(
            prompt_ids=[rng.randrange(49152) for _ in range(prompt_len)],
            completion_ids=[rng.randrange(49152) for _ in range(n_c)],
            behavior_log_probs=[-rng.random() * 5 for _ in range(n_c)],
            sampling=SamplingRecord(temperature=1.0, top_p=1.0, top_k=-1),
            policy_version=i // PER_ITERATION, finish_reason=rng.choice(("stop", "length")),
            reward=float(rng.random() < 0.3) if k == num_turns - 1 else 0.0,
            anchor=f"state {i % 97}-{k}",
            action_text=f'<tool_call>{{"name": "bash", "arguments": {{"command": "{word} {file}"}}}}</tool_call>',
            observation_text=f"Result (bash):\nexit code {k % 2}\n{word} output line {i % 1013}\n",
            exec_results=[ExecResult(command=("bash", "-c", f"{word} {file}"), exit_code=rng.choice((0, 0, 1)),
                                     stdout=f"{word} output line {i % 1013}\n", stderr="", duration_s=rng.random() / 10)
                          for _ in range(events_per_turn)],
        ))
    return Episode(group_id=f"g{i // GROUP}", env_id="agentrl/ShellTasks-v0", task_id=f"shell/task_{(i // GROUP) % 500}",
                   seed=i // GROUP, turns=turns, terminated=True, truncated=False,
                   termination_reason=TerminationReason(TERMINATIONS[i % len(TERMINATIONS)]),
                   episode_id=f"ep{i:08d}", success=turns[-1].reward == 1.0)


def _config() -> dict:
    from agentrl.config import load_config

    return load_config(None, ["run.name=bench-viewer"]).model_dump(mode="json")


def write_throughput(url: str, n: int, batch: int) -> float:
    """Episodes per second through ``ReplayStore.add_episodes`` (batches of ``batch``)."""
    from agentrl.replay import ReplayStore

    eps = [dataclasses.replace(_episode(i, 2, 2, 200, 32), episode_id=f"w{i:08d}") for i in range(n)]
    store = ReplayStore(url)
    try:
        store.start_run(WRITE_RUN, _config())
        t0 = time.perf_counter()
        for start in range(0, n, batch):
            chunk = eps[start:start + batch]
            store.add_episodes(WRITE_RUN, start // batch, chunk, {e.episode_id: [0.1] * len(e.turns) for e in chunk})
        dt = time.perf_counter() - t0
        store.finish_run(WRITE_RUN, "finished")
    finally:
        store.close()
    return n / dt


def bulk_fill(url: str, n: int, chunk: int = 20_000) -> float:
    """Insert ``n`` episodes of ``FILL_RUN`` with Core ``executemany``; returns episodes/s."""
    from agentrl.replay import ReplayStore
    from agentrl.replay.codec import episode_row, event_row, turn_row
    from agentrl.replay.models import EpisodeRow, IterationRow, MetricRow, SandboxEventRow, TurnRow

    store = ReplayStore(url)
    store.start_run(FILL_RUN, _config())
    engine = store.engine
    t_start = datetime.now(timezone.utc) - timedelta(days=1)
    # rows of 256 template episodes, built once by the store's codecs; each filled episode
    # is a template's rows with its own ids, iteration, reward and time
    templates = []
    for j in range(256):
        tpl = _episode(j, 1, 1, 64, 24)
        adv = [0.25 - (j % 7) / 10]
        templates.append((episode_row(FILL_RUN, 0, 0, tpl, adv, t_start), turn_row(tpl, 0, tpl.turns[0], adv[0]),
                          event_row(tpl.episode_id, 0, 0, tpl.turns[0].exec_results[0], t_start)))
    t0 = time.perf_counter()
    for lo in range(0, n, chunk):
        ep_rows, turn_rows, event_rows = [], [], []
        for i in range(lo, min(n, lo + chunk)):
            e_tpl, t_tpl, ev_tpl = templates[i % len(templates)]
            eid, it = f"ep{i:08d}", i // PER_ITERATION
            now = t_start + timedelta(milliseconds=i)
            reward = float((i * 7919) % 11 == 0) + (i % 5) / 10
            ep_rows.append({**e_tpl, "episode_id": eid, "iteration": it, "position": i % PER_ITERATION,
                            "group_id": f"g{i // GROUP}", "task_id": f"shell/task_{(i // GROUP) % 500}",
                            "seed": i // GROUP, "total_reward": reward, "policy_version_min": it,
                            "policy_version_max": it, "success": reward >= 1.0, "created_at": now})
            turn_rows.append({**t_tpl, "episode_id": eid, "policy_version": it, "reward": reward})
            event_rows.append({**ev_tpl, "episode_id": eid, "created_at": now})
        with engine.begin() as conn:
            conn.execute(EpisodeRow.__table__.insert(), ep_rows)
            conn.execute(TurnRow.__table__.insert(), turn_rows)
            conn.execute(SandboxEventRow.__table__.insert(), event_rows)
        done = min(n, lo + chunk)
        print(f"  filled {done:,} episodes ({done / (time.perf_counter() - t0):,.0f}/s)", flush=True)
    iterations = (n + PER_ITERATION - 1) // PER_ITERATION
    keys = ("rollout/reward_mean", "rollout/success_rate", "tokens/generated", "tokens/trained", "tokens/discarded",
            "time/rollout_s", "time/credit_s", "time/update_s", "time/sync_s", "time/replay_s", "time/iteration_s",
            "actor/logprob_gap_mean")
    with engine.begin() as conn:
        conn.execute(MetricRow.__table__.insert(), [
            dict(run_id=FILL_RUN, iteration=it, key=k, value=float((it * 31 + j) % 97) / 97)
            for it in range(iterations) for j, k in enumerate(keys)])
        conn.execute(IterationRow.__table__.insert(), [
            dict(run_id=FILL_RUN, iteration=it, completed_at=t_start + timedelta(seconds=it)) for it in range(iterations)])
    rate = n / (time.perf_counter() - t0)
    store.finish_run(FILL_RUN, "finished")
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("ANALYZE")
    else:
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")
    store.close()
    return rate


def _deep_cursor(url: str, n: int) -> str:
    """The keyset cursor of the default episode order at 90% of the fill run."""
    from sqlalchemy import create_engine, select

    from agentrl.replay.models import EpisodeRow
    from agentrl.replay.queries import encode_cursor

    e = EpisodeRow.__table__
    engine = create_engine(url)
    try:
        with engine.connect() as conn:
            eid = f"ep{int(n * 0.9):08d}"
            r = conn.execute(select(e.c.iteration, e.c.created_at, e.c.position, e.c.episode_id)
                             .where(e.c.episode_id == eid)).one()
    finally:
        engine.dispose()
    created = r.created_at if r.created_at.tzinfo else r.created_at.replace(tzinfo=timezone.utc)
    return encode_cursor([r.iteration, created, r.position, r.episode_id, 0])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def page_latency(url: str, n: int, repeats: int) -> list[tuple[str, float, float]]:
    """``(page, p50_ms, p95_ms)`` of each page, over ``agentrl view`` on ``url``."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "view", url, "--port", str(port)], cwd=REPO,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                with urlopen(base + "/", timeout=30):
                    break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"agentrl view did not start: {proc.stdout.read().decode()[-2000:]}")
                time.sleep(0.3)
        run = quote(FILL_RUN)
        mid = n // 2
        pages = {
            "runs": "/",
            "run": f"/run?id={run}",
            "episodes (first page)": f"/episodes?run={run}",
            "episodes (keyset page at 90%)": "/episodes?" + urlencode({"run": FILL_RUN, "cursor": _deep_cursor(url, n)}),
            "episodes (filtered)": "/episodes?" + urlencode({"run": FILL_RUN, "termination": "length", "reward_min": 1,
                                                              "success": "true"}),
            "episodes (sorted by reward)": "/episodes?" + urlencode({"run": FILL_RUN, "sort": "reward", "desc": "true"}),
            "episodes (text search)": "/episodes?" + urlencode({"run": FILL_RUN, "q": "xargs"}),
            "episode": "/episode?" + urlencode({"id": f"ep{mid:08d}"}),
            "group": "/group?" + urlencode({"run": FILL_RUN, "id": f"g{mid // GROUP}"}),
        }
        out = []
        for name, path in pages.items():
            times = []
            for k in range(repeats + 1):
                t0 = time.perf_counter()
                with urlopen(base + path, timeout=120) as r:
                    r.read()
                    if r.status != 200:
                        raise RuntimeError(f"{path}: HTTP {r.status}")
                if k:  # the first fetch warms the caches
                    times.append((time.perf_counter() - t0) * 1000)
            times.sort()
            p95 = times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))]
            out.append((name, statistics.median(times), p95))
            print(f"  {name:32s} p50 {out[-1][1]:8.1f} ms   p95 {p95:8.1f} ms"
                  f"{'' if p95 < TARGET_MS else '   (over the 300 ms target)'}", flush=True)
        return out
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def bench(label: str, url: str, args: argparse.Namespace) -> None:
    print(f"[{label}] {url}", flush=True)
    rate = write_throughput(url, args.write_episodes, args.write_batch)
    print(f"  write path (ReplayStore.add_episodes, batches of {args.write_batch}, 2 turns + 2 commands each): "
          f"{rate:,.0f} episodes/s over {args.write_episodes:,}", flush=True)
    t0 = time.perf_counter()
    fill = bulk_fill(url, args.episodes)
    print(f"  bulk fill: {args.episodes:,} episodes at {fill:,.0f} episodes/s ({time.perf_counter() - t0:.0f} s)",
          flush=True)
    page_latency(url, args.episodes, args.repeats)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=1_000_000, help="episodes of the filled run (default 1,000,000)")
    p.add_argument("--write-episodes", type=int, default=2_000, help="episodes written through add_episodes")
    p.add_argument("--write-batch", type=int, default=100, help="episodes per add_episodes call")
    p.add_argument("--repeats", type=int, default=20, help="timed fetches of each page")
    p.add_argument("--dir", type=Path, default=None, help="folder of the SQLite file (default: a temporary one)")
    p.add_argument("--no-sqlite", action="store_true", help="skip SQLite")
    p.add_argument("--postgres", default=os.environ.get("AGENTRL_TEST_POSTGRES_URL"),
                   help="a PostgreSQL server URL (default $AGENTRL_TEST_POSTGRES_URL); omitted: PostgreSQL is skipped")
    p.add_argument("--pg-database", default="agentrl_bench_viewer", help="name of the PostgreSQL database made for the run")
    p.add_argument("--keep", action="store_true", help="keep the databases")
    args = p.parse_args()

    if not args.no_sqlite:
        folder = args.dir or Path(tempfile.mkdtemp(prefix="bench_viewer_"))
        folder.mkdir(parents=True, exist_ok=True)
        db = folder / "replay.db"
        for suffix in ("", "-wal", "-shm"):
            Path(str(db) + suffix).unlink(missing_ok=True)
        try:
            bench("sqlite", f"sqlite:///{db}", args)
            print(f"  database size {db.stat().st_size / 1e9:.2f} GB", flush=True)
        finally:
            if not args.keep:
                shutil.rmtree(folder) if args.dir is None else [Path(str(db) + s).unlink(missing_ok=True)
                                                                  for s in ("", "-wal", "-shm")]
    if args.postgres:
        from sqlalchemy import create_engine
        from sqlalchemy.engine import make_url

        name = args.pg_database
        admin = create_engine(args.postgres, isolation_level="AUTOCOMMIT")
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
        try:
            bench("postgresql", make_url(args.postgres).set(database=name).render_as_string(hide_password=False), args)
        finally:
            if not args.keep:
                with admin.connect() as conn:
                    conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            admin.dispose()
    else:
        print("[postgresql] skipped: pass --postgres URL or set AGENTRL_TEST_POSTGRES_URL")


if __name__ == "__main__":
    main()
