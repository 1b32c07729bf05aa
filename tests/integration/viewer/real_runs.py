"""Replay databases written by real training runs, for the viewer's browser tests and the
screenshots in docs/viewer.md (scripts/viewer_screenshots.py).

``train_runs`` runs ``agentrl.train`` (real Ray, vLLM's CPU build with the tiny model, the
bubblewrap sandbox, the FSDP2 trainer) on ``agentrl/ShellTasks-v0`` into one replay database:
every episode ends in a grading command in the sandbox, so each has at least one recorded
sandbox command, and GiGPO gives anchor-state groups. Two runs with the same seed see the
same task ids, which is what the run-against-run diff aligns on. The first run is also
ShellTasks' one real training iteration (tests/integration/cluster/test_builtin_envs_train.py),
through the session fixture ``real_runs`` (tests/integration/conftest.py).

``add_xss_episode`` stores, in a run of its own, a copy of a real episode whose model output,
observation, sandbox command, output and anchor carry HTML that runs script if a page fails
to escape it (``XSS_PAYLOAD``; its completion ids are the tokenizer's encoding of the payload,
so the token view shows it too). ``copy_database`` copies every replay table row by row into
another database (the PostgreSQL copy of the same runs).
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass
from datetime import timezone
from pathlib import Path

XSS_FLAG = "__pwned"
XSS_PAYLOAD = (
    "<script>window.__pwned = 'script';</script>"
    "<img src=x onerror=\"window.__pwned = 'onerror'; alert(1)\">"
    "\"><svg onload=\"window.__pwned = 'svg'\">"
)
"""Model output that sets ``window.__pwned`` (or opens a dialog) wherever it is not escaped."""

ENV_ID = "agentrl/ShellTasks-v0"


@dataclass(frozen=True)
class RealRuns:
    """What ``train_runs`` wrote: the database, the run ids and the run directories, in order."""

    db_url: str
    run_ids: tuple[str, ...]
    run_dirs: tuple[Path, ...] = ()
    xss_run_id: str | None = None
    xss_episode_id: str | None = None

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), "run_dirs": [str(d) for d in self.run_dirs]}

    @classmethod
    def from_json(cls, d: dict) -> RealRuns:
        return cls(**{**d, "run_ids": tuple(d["run_ids"]), "run_dirs": tuple(Path(p) for p in d["run_dirs"])})


def run_overrides(run_dir: Path, model_path: str, db_url: str, name: str) -> list[str]:
    """The ``agentrl train`` overrides of one small real run (1 iteration, 2 tasks x 2
    rollouts, up to 2 turns of at most 12 new tokens, GiGPO, bubblewrap)."""
    return [
        f"run.name={name}", f"run.dir={run_dir}", "run.iterations=1", "run.seed=0",
        f"model.path={model_path}", f"env.id={ENV_ID}", "env.tasks_per_iteration=2", "env.group_size=2",
        "rollout.max_turns=2", "rollout.max_new_tokens=12", "rollout.max_context_tokens=2048",
        "rollout.history_length=1", "sandbox.backend=bwrap", "algorithm.advantage=gigpo",
        "trainer.micro_batch_size=2", f"replay.url={db_url}", "rollout.kv_cache_gb=0.125",
    ]


def train_runs(workdir: Path, model_path: str, names: tuple[str, ...] = ("viewer-a", "viewer-b")) -> RealRuns:
    """Train one real iteration per name into ``workdir/replay.db``; returns the ids.

    Ray: a local instance (4 logical CPUs) is started for the runs unless one is already
    initialised in this process, and shut down afterwards if started here."""
    import ray

    from agentrl.cluster.actors.ray_connect import LOCAL_SYSTEM_CONFIG
    from agentrl.config import load_config
    from agentrl.driver.controller import train

    db_url = f"sqlite:///{workdir / 'replay.db'}"
    started = False
    if not ray.is_initialized():
        ray.init(address="local", num_cpus=4, include_dashboard=False, logging_level="WARNING",
                 runtime_env={"env_vars": {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}},
                 _system_config=LOCAL_SYSTEM_CONFIG)  # as agentrl's own local start: no idle prestarted workers
        started = True
    try:
        run_ids = []
        for name in names:
            cfg = load_config(None, run_overrides(workdir / name, model_path, db_url, name))
            run_ids.append(train(cfg).run_id)
    finally:
        if started:
            ray.shutdown()
    return RealRuns(db_url=db_url, run_ids=tuple(run_ids), run_dirs=tuple(workdir / name for name in names))


def add_xss_episode(runs: RealRuns, model_path: str) -> RealRuns:
    """Store a copy of the first real episode of ``runs.run_ids[0]`` under a new run
    (``<run>-xss``) with ``XSS_PAYLOAD`` in every text the environment, the sandbox and the
    model produced; returns ``runs`` with ``xss_run_id`` / ``xss_episode_id`` set."""
    from transformers import AutoTokenizer

    from agentrl.replay import ReplayStore
    from agentrl.types import ExecResult

    tok = AutoTokenizer.from_pretrained(model_path)
    payload_ids = tok.encode(XSS_PAYLOAD, add_special_tokens=False)
    store = ReplayStore(runs.db_url)
    try:
        source_run = store.get_run(runs.run_ids[0])
        (first,) = store.list_episodes(source_run.run_id, 1, limit=1)  # the first iteration
        ep = store.get_episode(first.episode_id)
        turns = []
        for k, t in enumerate(ep.turns):
            events = [ExecResult(command=f"echo '{XSS_PAYLOAD}'", exit_code=0, stdout=XSS_PAYLOAD + "\n",
                                 stderr=XSS_PAYLOAD, duration_s=0.01)] + list(t.exec_results)
            turns.append(dataclasses.replace(
                t, completion_ids=payload_ids, behavior_log_probs=[-0.5] * len(payload_ids),
                policy_versions=[t.policy_version] * len(payload_ids), action_text=XSS_PAYLOAD,
                observation_text=XSS_PAYLOAD, anchor=f"{XSS_PAYLOAD} {k}", exec_results=events))
        xss = dataclasses.replace(ep, turns=turns, episode_id=f"{ep.episode_id}-xss", group_id=f"{ep.group_id}-xss")
        xss_run_id = f"{source_run.run_id}-xss"
        store.start_run(xss_run_id, json.loads(json.dumps(source_run.config)))
        store.add_episodes(xss_run_id, first.iteration, [xss])  # the iteration of the episode it copies
        store.finish_run(xss_run_id, "finished")
    finally:
        store.close()
    return dataclasses.replace(runs, xss_run_id=xss_run_id, xss_episode_id=xss.episode_id)


def copy_database(src_url: str, dst_url: str) -> None:
    """Copy every replay row from ``src_url`` into the empty replay database ``dst_url``.

    The destination's tables are made by ``ReplayStore`` (its own schema and migrations);
    then each table both databases have is copied in foreign-key order, column by column as
    stored (text stays in its stored form), except generated columns and autoincrement ids
    (the destination numbers those itself). Naive datetimes (SQLite keeps no zone; the store
    writes UTC) are marked UTC."""
    from sqlalchemy import MetaData, create_engine, select

    from agentrl.replay import ReplayStore

    ReplayStore(dst_url).close()  # creates (or upgrades) the schema
    src, dst = create_engine(src_url), create_engine(dst_url)
    try:
        src_meta, dst_meta = MetaData(), MetaData()
        dst_meta.reflect(dst)
        src_meta.reflect(src, only=lambda name, _: name in dst_meta.tables)
        skip_tables = {"schema_version", "alembic_version"}
        with src.connect() as rc, dst.begin() as wc:
            for table in dst_meta.sorted_tables:
                if table.name in skip_tables or table.name not in src_meta.tables:
                    continue
                s_table = src_meta.tables[table.name]
                auto = table.autoincrement_column
                cols = [c.name for c in table.columns
                        if c.name in s_table.columns and c.computed is None and c is not auto]
                rows = [{k: (v.replace(tzinfo=timezone.utc) if hasattr(v, "tzinfo") and hasattr(v, "hour")
                             and v.tzinfo is None else v) for k, v in r._mapping.items()}
                        for r in rc.execute(select(*[s_table.c[c] for c in cols]))]
                if rows:
                    wc.execute(table.insert(), rows)
    finally:
        src.dispose()
        dst.dispose()
