"""Viewer scale benchmark: page latency of ``agentrl view`` at 1,000,000 episodes (and at a
baseline of 1,000 in the same run), on SQLite and PostgreSQL, and the replay store's write
throughput.

On demand, not in CI (filling a million episodes takes minutes and gigabytes; the filled
databases are kept in a cache, so later runs start at the measurement):

    .venv/bin/python tests/benchmarks/bench_viewer.py                      # SQLite, 1,000,000 episodes
    .venv/bin/python tests/benchmarks/bench_viewer.py --postgres postgresql+psycopg://postgres@127.0.0.1:5432/postgres
    .venv/bin/python tests/benchmarks/bench_viewer.py --episodes 20000 --no-sqlite --postgres URL

For each database:

1. **Write throughput** through the store's normal write path: ``ReplayStore.add_episodes``
   in batches of ``--write-batch`` episodes (2 turns, 2 sandbox commands each, as a
   training iteration writes them), ``--write-episodes`` in all, into a fresh database;
   printed in episodes/s.
2. **Bulk fill** (once per size; cached): ``--episodes`` episodes of one run (1,000 per
   iteration, groups of 8, one turn and one sandbox command each, varied rewards, lengths,
   termination reasons and texts), inserted in chunks with SQLAlchemy Core ``executemany``
   into the tables the store made (rows built by the store's own row codecs), then its
   metrics and completion marks. This is a fill, not the write path; its rate is printed
   too. The same for ``--baseline-episodes`` (default 1,000).
3. **Page latency**: for each page a fresh ``agentrl view`` is started over the database,
   the page's **first** fetch after the server answers is timed on its own (tokenizers,
   templates, caches: nothing warmed by another page), then ``--repeats`` more, one
   request at a time: runs, run, episodes (first page, a keyset page 90% deep, filtered,
   sorted by reward, text search), one episode, one group. Printed per page: the first
   fetch, p50 and p95 of the others in ms, against the 300 ms target, and the ratio of its
   p95 to the same page's p95 over the baseline database (how the page scales with the
   run's size: 1.0 is flat).

The cache (``--cache-dir``, default ``$TMPDIR/agentrl_bench_viewer``): one SQLite file per
size and fill generator (``fill-<episodes>-<key>.db``, where ``key`` hashes the generator's
parameters), built under a temporary name and renamed when complete; on PostgreSQL one
database per size, ``<--pg-database>_<episodes>_<key>``, complete when its fill run is
finished. A cached database is opened with ``ReplayStore`` first, which upgrades it to this
agentrl's schema (a new migration runs there as on a user's database). ``--fresh``
rebuilds; ``--drop-cache`` removes them at the end. About 2 GB of SQLite at 1,000,000.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import os
import random
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
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
FILL_GENERATOR = 2
"""Version of ``bulk_fill``'s rows: bump it when they change, so that cached fills are rebuilt."""
TEMPLATES = 256
METRIC_KEYS = (
    "actor/entropy", "actor/global_step", "actor/grad_norm", "actor/kl_loss", "actor/lr", "actor/no_signal_steps",
    "actor/num_loss_seqs", "actor/num_loss_tokens", "actor/pg_clipfrac", "actor/pg_clipfrac_dual", "actor/pg_loss",
    "actor/ppo_kl", "actor/ratio_mean", "actor/skipped_step", "advantages/abs_max", "advantages/mean",
    "advantages/nonzero_frac", "cluster/engines", "cluster/engines_lost", "cluster/engines_replaced",
    "cluster/replacement_wait_s", "eval/pass@1", "eval/pass@1_high", "eval/pass@1_low", "eval/policy_version",
    "eval/reward_mean", "eval/reward_mean_high", "eval/reward_mean_low", "eval/samples_errored",
    "eval/samples_scored", "eval/tasks", "eval/tokens_generated", "eval/tokens_per_sample",
    "filter/aborted_episodes", "filter/error_dropped_episodes", "filter/infra_errors", "filter/refill_rounds",
    "filter/reward_errors", "iteration", "kl/coef", "perf/padding_frac", "perf/peak_memory_mb", "perf/step_s",
    "perf/tokens_per_s", "policy_version", "replay/trainer_values_nonfinite_turns", "rollout/aborted_episodes",
    "rollout/engine_0_episodes", "rollout/engine_0_s", "rollout/episodes", "rollout/finish_reason/abort",
    "rollout/finish_reason/length", "rollout/finish_reason/stop", "rollout/generated_tokens",
    "rollout/invalid_action_rate", "rollout/response_length_max", "rollout/response_length_mean",
    "rollout/reward_mean", "rollout/sandbox_execs", "rollout/scored_episodes", "rollout/success_rate",
    "rollout/successes", "rollout/termination/aborted", "rollout/termination/context_limit",
    "rollout/termination/env_terminated", "rollout/termination/env_truncated", "rollout/termination/infra_error",
    "rollout/termination/length", "rollout/termination/max_turns", "rollout/termination/reward_error",
    "rollout/turns_mean", "rollout_corr/ess", "rollout_corr/gap_abs_max", "rollout_corr/gap_abs_mean",
    "rollout_corr/gap_abs_p99", "rollout_corr/is_clipped_frac", "rollout_corr/is_weight_mean",
    "rollout_corr/seq_masked_frac", "rollout_corr/token_masked_frac", "sync/engine_0_s", "sync/engines_lost",
    "sync/gather_s", "sync/mb", "sync/pack_s", "sync/put_s", "sync/total_s", "time/credit_s", "time/eval_s",
    "time/iteration_s", "time/replay_s", "time/rollout_s", "time/sync_s", "time/update_s", "timeline/credit_end_s",
    "timeline/credit_start_s", "timeline/eval_end_s", "timeline/eval_start_s", "timeline/rollout_end_s",
    "timeline/rollout_start_s", "timeline/sync_end_s", "timeline/sync_start_s", "timeline/update_end_s",
    "timeline/update_start_s", "tokens/discarded", "tokens/generated", "tokens/packed", "tokens/trained",
)
"""The metric keys one iteration of a real training run writes (a 1-iteration ShellTasks run
with an eval after it): the run page reads 30 of them."""
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
    for j in range(TEMPLATES):
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
    with engine.begin() as conn:
        for lo_it in range(0, iterations, 100):
            conn.execute(MetricRow.__table__.insert(), [
                dict(run_id=FILL_RUN, iteration=it, key=k, value=float((it * 31 + j) % 97) / 97)
                for it in range(lo_it, min(iterations, lo_it + 100)) for j, k in enumerate(METRIC_KEYS)])
        conn.execute(IterationRow.__table__.insert(), [
            dict(run_id=FILL_RUN, iteration=it, completed_at=t_start + timedelta(seconds=it)) for it in range(iterations)])
    rate = n / (time.perf_counter() - t0)
    if engine.dialect.name == "postgresql":
        with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
            conn.exec_driver_sql("ANALYZE")
    else:
        with engine.begin() as conn:
            conn.exec_driver_sql("ANALYZE")
    store.finish_run(FILL_RUN, "finished")  # last: marks a complete (cacheable) fill
    store.close()
    return rate


def _deep_cursor(url: str, n: int) -> str:
    """The keyset cursor of the default episode order at 90% of the fill run."""
    from sqlalchemy import create_engine, select

    from agentrl.replay.models import EpisodeRow
    from agentrl.replay.read.listing import encode_cursor

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


def fill_key(n: int) -> str:
    """Hash of what a fill of ``n`` episodes holds (the cache key of its database)."""
    params = dict(generator=FILL_GENERATOR, episodes=n, per_iteration=PER_ITERATION, group=GROUP,
                  templates=TEMPLATES, run=FILL_RUN)
    return hashlib.sha256(json.dumps(params, sort_keys=True).encode()).hexdigest()[:12]


def _sqlite_files(db: Path) -> list[Path]:
    return [Path(str(db) + suffix) for suffix in ("", "-wal", "-shm")]


def cached_sqlite_fill(cache: Path, n: int, fresh: bool) -> str:
    """The URL of a SQLite file holding the fill of ``n`` episodes, built unless cached."""
    from sqlalchemy import create_engine

    from agentrl.replay import ReplayStore

    db = cache / f"fill-{n}-{fill_key(n)}.db"
    if db.is_file() and not fresh:
        print(f"  cached fill of {n:,} episodes: {db}", flush=True)
        ReplayStore(f"sqlite:///{db}").close()  # upgrades it to this agentrl's schema, if older
        return f"sqlite:///{db}"
    cache.mkdir(parents=True, exist_ok=True)
    building = cache / f"{db.name}.building"
    for f in _sqlite_files(building) + _sqlite_files(db):
        f.unlink(missing_ok=True)
    t0 = time.perf_counter()
    rate = bulk_fill(f"sqlite:///{building}", n)
    engine = create_engine(f"sqlite:///{building}")
    with engine.connect() as conn:
        conn.exec_driver_sql("PRAGMA wal_checkpoint(TRUNCATE)")
    engine.dispose()
    for f in _sqlite_files(building)[1:]:
        f.unlink(missing_ok=True)
    building.rename(db)
    print(f"  bulk fill: {n:,} episodes at {rate:,.0f} episodes/s ({time.perf_counter() - t0:.0f} s, "
          f"{db.stat().st_size / 1e9:.2f} GB) -> {db}", flush=True)
    return f"sqlite:///{db}"


def cached_postgres_fill(admin_url: str, prefix: str, n: int, fresh: bool) -> str:
    """The URL of a PostgreSQL database holding the fill of ``n`` episodes, built unless cached
    (complete: its fill run is finished)."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    from agentrl.replay import ReplayStore

    name = f"{prefix}_{n}_{fill_key(n)}"
    url = make_url(admin_url).set(database=name).render_as_string(hide_password=False)
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            exists = conn.execute(text("SELECT 1 FROM pg_database WHERE datname = :n"), {"n": name}).first()
        if exists and not fresh:
            engine = create_engine(url)
            try:
                with engine.connect() as conn:
                    done = conn.execute(text("SELECT status FROM runs WHERE run_id = :r"), {"r": FILL_RUN}).scalar()
            except Exception:  # noqa: BLE001 - a half-made database is rebuilt
                done = None
            finally:
                engine.dispose()
            if done == "finished":
                print(f"  cached fill of {n:,} episodes: database {name}", flush=True)
                ReplayStore(url).close()  # upgrades it to this agentrl's schema, if older
                return url
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    finally:
        admin.dispose()
    t0 = time.perf_counter()
    rate = bulk_fill(url, n)
    print(f"  bulk fill: {n:,} episodes at {rate:,.0f} episodes/s ({time.perf_counter() - t0:.0f} s) -> {name}",
          flush=True)
    return url


def drop_postgres(admin_url: str, url: str) -> None:
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{make_url(url).database}" WITH (FORCE)')
    finally:
        admin.dispose()


def pages(url: str, n: int) -> dict[str, str]:
    """Page name -> path of every page measured, over the fill of ``n`` episodes."""
    run = quote(FILL_RUN)
    mid = n // 2
    return {
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


class ViewServer:
    """``agentrl view URL`` in a subprocess, answering once ``/static/viewer.js`` loads (a file,
    not a page: no database read, no template)."""

    def __init__(self, url: str) -> None:
        self.base = f"http://127.0.0.1:{_free_port()}"
        self.proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "view", url, "--port",
                                      self.base.rsplit(":", 1)[1]], cwd=REPO, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, start_new_session=True)
        deadline = time.monotonic() + 120
        while True:
            try:
                with urlopen(self.base + "/static/viewer.js", timeout=30):
                    return
            except OSError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(f"agentrl view did not start: {self.proc.stdout.read().decode()[-2000:]}")
                time.sleep(0.05)

    def fetch_ms(self, path: str) -> float:
        t0 = time.perf_counter()
        with urlopen(self.base + path, timeout=120) as r:
            r.read()
            if r.status != 200:
                raise RuntimeError(f"{path}: HTTP {r.status}")
        return (time.perf_counter() - t0) * 1000

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@dataclasses.dataclass
class Latency:
    first_ms: float
    p50_ms: float
    p95_ms: float


def page_latency(url: str, n: int, repeats: int) -> dict[str, Latency]:
    """Per page: its first fetch from a freshly started ``agentrl view`` on ``url``, then
    p50 / p95 of ``repeats`` more fetches."""
    out = {}
    for name, path in pages(url, n).items():
        server = ViewServer(url)
        try:
            first = server.fetch_ms(path)
            times = sorted(server.fetch_ms(path) for _ in range(repeats))
        finally:
            server.stop()
        p95 = times[min(len(times) - 1, int(round(0.95 * (len(times) - 1))))]
        out[name] = Latency(first, statistics.median(times), p95)
    return out


def report(label: str, n: int, big: dict[str, Latency], base_n: int, base: dict[str, Latency]) -> bool:
    """Print one row per page; True when every page (first fetch and p95) is under the target."""
    print(f"  [{label}] page latency at {n:,} episodes (first fetch after start; p50, p95 of the rest) and "
          f"p95 ratio to {base_n:,} episodes:", flush=True)
    ok = True
    for name, lat in big.items():
        b = base[name]
        over = max(lat.first_ms, lat.p95_ms) >= TARGET_MS
        ok &= not over
        print(f"    {name:32s} first {lat.first_ms:8.1f} ms   p50 {lat.p50_ms:7.1f} ms   p95 {lat.p95_ms:7.1f} ms"
              f"   | at {base_n:,}: first {b.first_ms:6.1f} p95 {b.p95_ms:6.1f} ms   ratio {lat.p95_ms / b.p95_ms:5.2f}"
              f"{'   (over the 300 ms target)' if over else ''}", flush=True)
    return ok


def bench(label: str, fill_url: Callable[[int], str], write_url: str, args: argparse.Namespace) -> bool:
    print(f"[{label}]", flush=True)
    if args.write_episodes:
        rate = write_throughput(write_url, args.write_episodes, args.write_batch)
        print(f"  write path (ReplayStore.add_episodes into a fresh database, batches of {args.write_batch}, "
              f"2 turns + 2 commands each): {rate:,.0f} episodes/s over {args.write_episodes:,}", flush=True)
    base_url, big_url = fill_url(args.baseline_episodes), fill_url(args.episodes)
    base = page_latency(base_url, args.baseline_episodes, args.repeats)
    big = page_latency(big_url, args.episodes, args.repeats)
    return report(label, args.episodes, big, args.baseline_episodes, base)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=1_000_000, help="episodes of the filled run (default 1,000,000)")
    p.add_argument("--baseline-episodes", type=int, default=1_000,
                   help="episodes of the baseline fill whose p95 each page's is divided by (default 1,000)")
    p.add_argument("--write-episodes", type=int, default=2_000,
                   help="episodes written through add_episodes (0: skip the write path)")
    p.add_argument("--write-batch", type=int, default=100, help="episodes per add_episodes call")
    p.add_argument("--repeats", type=int, default=20, help="timed fetches of each page after its first")
    p.add_argument("--cache-dir", type=Path, default=Path(tempfile.gettempdir()) / "agentrl_bench_viewer",
                   help="folder of the cached SQLite fills (default $TMPDIR/agentrl_bench_viewer)")
    p.add_argument("--fresh", action="store_true", help="rebuild the cached fills")
    p.add_argument("--drop-cache", action="store_true", help="remove this run's fills (files, databases) at the end")
    p.add_argument("--no-sqlite", action="store_true", help="skip SQLite")
    p.add_argument("--postgres", default=os.environ.get("AGENTRL_TEST_POSTGRES_URL"),
                   help="a PostgreSQL server URL (default $AGENTRL_TEST_POSTGRES_URL); omitted: PostgreSQL is skipped")
    p.add_argument("--pg-database", default="agentrl_bench_viewer",
                   help="prefix of the PostgreSQL databases made for the fills (and, with _write, the write path)")
    args = p.parse_args()
    if args.episodes < 100 or args.baseline_episodes < 100:
        p.error("--episodes and --baseline-episodes must be at least 100")

    ok = True
    if not args.no_sqlite:
        scratch = Path(tempfile.mkdtemp(prefix="bench_viewer_write_"))
        made: list[str] = []

        def sqlite_fill(n: int) -> str:
            made.append(cached_sqlite_fill(args.cache_dir, n, args.fresh))
            return made[-1]

        try:
            ok &= bench("sqlite", sqlite_fill, f"sqlite:///{scratch / 'replay.db'}", args)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
            if args.drop_cache:
                for url in made:
                    for f in _sqlite_files(Path(url.removeprefix("sqlite:///"))):
                        f.unlink(missing_ok=True)
    if args.postgres:
        made = []
        write_url = _fresh_postgres(args.postgres, f"{args.pg_database}_write")

        def pg_fill(n: int) -> str:
            made.append(cached_postgres_fill(args.postgres, args.pg_database, n, args.fresh))
            return made[-1]

        try:
            ok &= bench("postgresql", pg_fill, write_url, args)
        finally:
            drop_postgres(args.postgres, write_url)
            if args.drop_cache:
                for url in made:
                    drop_postgres(args.postgres, url)
    else:
        print("[postgresql] skipped: pass --postgres URL or set AGENTRL_TEST_POSTGRES_URL")
    print("every page under the 300 ms target" if ok else "some page is over the 300 ms target")


def _fresh_postgres(admin_url: str, name: str) -> str:
    """The URL of a new, empty database ``name`` on ``admin_url``'s server (dropped first)."""
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.exec_driver_sql(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.exec_driver_sql(f'CREATE DATABASE "{name}"')
    finally:
        admin.dispose()
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


if __name__ == "__main__":
    main()
