"""The controller: the Ray driver that runs rounds of rollout → credit → update → sync.

Synchronous mode (the only mode so far): one iteration's rollouts all use the same
``policy_version``; the update starts when they are done, and the next iteration starts
after the new weights are in the engine. There are therefore no in-flight rollouts at a
checkpoint: a run stopped mid-iteration resumes from the last checkpoint and re-runs that
iteration from its start (its episodes are written again under the same iteration; the
replay store keeps the first copy of an episode id and the re-run's new ones).

Run directory layout::

    RUN_DIR/config.yaml          the validated config (resume reads it)
    RUN_DIR/metrics.jsonl        one JSON object per iteration
    RUN_DIR/replay.db            SQLite replay store (unless replay.url is set)
    RUN_DIR/checkpoints/iter_N/  trainer/ (model, optimizer, scheduler, RNG) + controller.json
    RUN_DIR/checkpoints/latest   name of the newest complete checkpoint (written last)
"""

from __future__ import annotations

import json
import logging
import math
import os
import shutil
import signal
import socket
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import yaml

from agentrl.config import Config, config_from_dict
from agentrl.credit import assign_credit, critic_step_metrics, missing_groups
from agentrl.errors import CheckpointError, ConfigError
from agentrl.rollout.loop import rollout_metrics
from agentrl.tasks import TaskSource

log = logging.getLogger(__name__)

CONTROLLER_STATE = "controller.json"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@dataclass
class RunSummary:
    run_dir: Path
    run_id: str
    iterations_done: int
    policy_version: int
    history: list[dict[str, float]] = field(default_factory=list)
    status: str = "finished"


def latest_checkpoint(run_dir: Path) -> Path | None:
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    ckpt = run_dir / "checkpoints" / pointer.read_text().strip()
    if not (ckpt / CONTROLLER_STATE).is_file():
        raise CheckpointError(f"checkpoint pointer names {ckpt}, which has no {CONTROLLER_STATE}")
    return ckpt


def load_run_config(run_dir: Path, overrides: list[str]) -> Config:
    """Config of an existing run (for ``--resume``), with overrides such as
    ``run.iterations=6`` applied on top."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        raise CheckpointError(f"{run_dir} is not a run directory (no config.yaml)")
    data = yaml.safe_load(path.read_text())
    cfg = config_from_dict(data, overrides)
    cfg.run.dir = str(run_dir)
    return cfg


def _save_checkpoint(run_dir: Path, iteration: int, trainers: list, state: dict) -> Path:
    import ray

    root = run_dir / "checkpoints"
    name = f"iter_{iteration}"
    tmp = root / f".{name}.tmp"
    final = root / name
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    ray.get([t.save_checkpoint.remote(str(tmp / "trainer")) for t in trainers])
    (tmp / CONTROLLER_STATE).write_text(json.dumps(state, indent=2))
    if final.exists():
        shutil.rmtree(final)
    tmp.rename(final)
    pointer_tmp = root / ".latest.tmp"
    pointer_tmp.write_text(name)
    os.replace(pointer_tmp, root / "latest")
    # keep only the newest two checkpoints
    olds = sorted((p for p in root.glob("iter_*") if p.is_dir()), key=lambda p: int(p.name.split("_")[1]))
    for p in olds[:-2]:
        shutil.rmtree(p, ignore_errors=True)
    return final


def train(cfg: Config, *, resume: bool = False, on_iteration: Callable[[int, dict], None] | None = None,
          progress: Any = None) -> RunSummary:
    """Run ``cfg.run.iterations`` iterations (or continue a run up to that number).

    Raises:
        ConfigError: bad configuration (unknown env, bad split, model missing ...).
        CheckpointError: ``resume`` without a usable checkpoint.
    """
    import ray

    from agentrl.cluster.actors import RolloutActor, TrainerActor, env_task_ids, sampling_of
    from agentrl.models import resolve_model_path
    from agentrl.replay import ReplayStore
    from sandboxes import reap_orphans

    run_dir = cfg.run_dir()
    if resume:
        ckpt = latest_checkpoint(run_dir)
        if ckpt is None:
            raise CheckpointError(f"--resume: {run_dir} has no checkpoint yet")
        state = json.loads((ckpt / CONTROLLER_STATE).read_text())
        run_id = state["run_id"]
    else:
        if (run_dir / "checkpoints" / "latest").exists():
            raise ConfigError(
                f"run directory {run_dir} already holds a run; use --resume {run_dir} to continue it, "
                "or choose another run.name / run.dir"
            )
        ckpt, state = None, None
        run_id = f"{cfg.run.name}-{uuid.uuid4().hex[:8]}"
    run_dir.mkdir(parents=True, exist_ok=True)
    (run_dir / "config.yaml").write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))

    reaped = reap_orphans()
    if reaped:
        log.warning("removed %d sandbox processes left behind by earlier runs", reaped)

    task_ids = env_task_ids(cfg.env.id, cfg.env.split, cfg.env.import_modules)
    if cfg.env.task_ids is not None:
        unknown = [t for t in cfg.env.task_ids if t not in set(task_ids)]
        if unknown:
            raise ConfigError(f"env.task_ids: {unknown[:5]} not in split {cfg.env.split!r} of {cfg.env.id!r}")
        task_ids = list(cfg.env.task_ids)
    tasks = TaskSource(cfg.env.id, task_ids, cfg.run.seed, cfg.env.group_size)
    model_path = resolve_model_path(cfg.model.path)
    cfg_dict = cfg.model_dump(mode="json")

    replay_url = cfg.replay.url or f"sqlite:///{(run_dir / 'replay.db').resolve()}"
    store = ReplayStore(replay_url)
    store.start_run(run_id, cfg_dict)

    started_ray = False
    if not ray.is_initialized():
        num_threads = str(max(1, os.cpu_count() or 1))
        ray.init(
            address=cfg.cluster.address,
            num_cpus=None if cfg.cluster.address else (cfg.cluster.num_cpus or max(4, 2 * (os.cpu_count() or 1))),
            include_dashboard=False, log_to_driver=True, logging_level="WARNING",
            runtime_env={"env_vars": {"OMP_NUM_THREADS": num_threads, "TOKENIZERS_PARALLELISM": "false",
                                      "RAY_DEDUP_LOGS": "0"}},
        )
        started_ray = True
    status = "failed"
    history: list[dict[str, float]] = []
    policy_version = 0
    start_iter = 0
    rollout = None
    trainers: list = []
    prev_sigterm = signal.getsignal(signal.SIGTERM)

    def _sigterm(signum, frame):  # turn SIGTERM into KeyboardInterrupt: same clean-up path
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _sigterm)
    try:
        world = cfg.trainer.num_ranks
        port = _free_port()
        trainers = [TrainerActor.options(num_cpus=1, name=None).remote(r, world, port, cfg_dict, model_path) for r in range(world)]
        rollout = RolloutActor.options(num_cpus=1).remote(cfg_dict, model_path, run_id)
        engine_start_s = ray.get(rollout.ready.remote())
        log.info("engine started in %.1f s", engine_start_s)

        if ckpt is not None:
            ray.get([t.load_checkpoint.remote(str(ckpt / "trainer")) for t in trainers])
            tasks.load_state_dict(state["tasks"])
            policy_version = int(state["policy_version"])
            start_iter = int(state["iteration"])
            history = list(state.get("history", []))
            refs = ray.get([t.state_dict_ref.remote() for t in trainers])
            ray.get(rollout.update_weights.remote(refs[0]))

        sampling = sampling_of(cfg)
        metrics_path = run_dir / "metrics.jsonl"
        if progress is not None:
            progress.start(total=cfg.run.iterations, completed=start_iter)
        for it in range(start_iter, cfg.run.iterations):
            t_iter = time.perf_counter()
            requests = tasks.next_requests(cfg.env.tasks_per_iteration)
            if progress is not None:
                progress.phase(it, "rollout")
            episodes, rollout_s = ray.get(rollout.rollout.remote(requests, policy_version))
            refills = 0
            while refills < cfg.algorithm.max_refill_rounds:  # DAPO dynamic sampling's refill
                missing = missing_groups(episodes, cfg.algorithm, groups_wanted=cfg.env.tasks_per_iteration,
                                         max_new_tokens=cfg.rollout.max_new_tokens)
                if missing <= 0:
                    break
                more, more_s = ray.get(rollout.rollout.remote(tasks.next_requests(missing), policy_version))
                episodes, rollout_s, refills = episodes + more, rollout_s + more_s, refills + 1

            if progress is not None:
                progress.phase(it, "credit")
            t0 = time.perf_counter()
            credit = assign_credit(episodes, cfg.algorithm, sampling, max_new_tokens=cfg.rollout.max_new_tokens,
                                   values_fn=lambda vb: ray.get([t.critic_values.remote(vb) for t in trainers])[0])
            credit.metrics["filter/refill_rounds"] = float(refills)
            credit_s = time.perf_counter() - t0

            if progress is not None:
                progress.phase(it, "update")
            t0 = time.perf_counter()
            train_metrics: dict[str, float] = {}
            if credit.batch is not None:
                results = ray.get([t.step.remote(credit.batch) for t in trainers])
                train_metrics = results[0]
            if credit.value_batch is not None:
                train_metrics.update(critic_step_metrics(
                    ray.get([t.critic_step.remote(credit.value_batch) for t in trainers])[0]))
            update_s = time.perf_counter() - t0

            if progress is not None:
                progress.phase(it, "sync")
            t0 = time.perf_counter()
            if credit.batch is not None:
                refs = ray.get([t.state_dict_ref.remote() for t in trainers])
                ray.get(rollout.update_weights.remote(refs[0]))
                policy_version += 1
            sync_s = time.perf_counter() - t0

            t0 = time.perf_counter()
            store.add_episodes(run_id, it, episodes, credit.turn_advantages)
            replay_s = time.perf_counter() - t0

            m: dict[str, float] = {"iteration": float(it + 1), "policy_version": float(policy_version)}
            m.update(rollout_metrics(episodes))
            if cfg.sandbox.pool_size > 0:
                ps = ray.get(rollout.pool_stats.remote())
                m.update({"sandbox/acquire_p50_ms": 1e3 * ps["acquire_p50_s"], "sandbox/acquire_p95_ms": 1e3 * ps["acquire_p95_s"],
                          "sandbox/startup_p50_ms": 1e3 * ps["startup_p50_s"], "sandbox/started": float(ps["started"]),
                          "sandbox/replaced": float(ps["replaced"])})
            m.update(credit.metrics)
            m.update(train_metrics)
            m.update({
                "time/rollout_s": rollout_s, "time/credit_s": credit_s, "time/update_s": update_s,
                "time/sync_s": sync_s, "time/replay_s": replay_s,
                "time/iteration_s": time.perf_counter() - t_iter,
            })
            clean = {k: (float(v) if isinstance(v, (int, float)) and math.isfinite(float(v)) else None) for k, v in m.items()}
            with metrics_path.open("a") as f:
                f.write(json.dumps(clean) + "\n")
            store.add_metrics(run_id, it, {k: v for k, v in clean.items() if v is not None})
            history.append(clean)

            if (it + 1) % cfg.run.checkpoint_every == 0 or it + 1 == cfg.run.iterations:
                if progress is not None:
                    progress.phase(it, "checkpoint")
                _save_checkpoint(run_dir, it + 1, trainers, {
                    "run_id": run_id, "iteration": it + 1, "policy_version": policy_version,
                    "tasks": tasks.state_dict(), "history": history,
                    "in_flight_rollouts": "none (synchronous mode: each iteration completes before a checkpoint)",
                })
            if on_iteration is not None:
                on_iteration(it, clean)
            if progress is not None:
                progress.advance(it, clean)
        status = "finished"
        return RunSummary(run_dir, run_id, cfg.run.iterations, policy_version, history, status)
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    finally:
        signal.signal(signal.SIGTERM, prev_sigterm)
        try:
            store.finish_run(run_id, status)
        except Exception:
            log.exception("could not record the run's status")
        for actor in [rollout, *trainers]:
            if actor is not None:
                try:
                    ray.kill(actor)
                except Exception:
                    pass
        if started_ray:
            ray.shutdown()
        # The run is over: nothing of it may outlive it (design.md, invariant 8).
        left = reap_orphans(run_id, include_live_owners=True)
        if left:
            log.warning("removed %d sandbox processes of run %s at exit", left, run_id)
