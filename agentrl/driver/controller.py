"""The controller: the Ray driver that runs rounds of rollout → credit → update → sync.

Synchronous mode (``controller.mode: sync``, the default): one iteration's rollouts all use
the same ``policy_version``; the update starts when they are done, and the next iteration
starts after the new weights are in every engine. There are therefore no in-flight rollouts
at a checkpoint. Asynchronous mode (``controller.mode: async``): ``train`` sets up the same
parts with a streaming ``BatchSource`` (``agentrl.driver.stream_source``). Both modes run one
loop body (``agentrl.driver.loop``): credit, trainer step, weight sync, evaluation, replay
and metrics writes and checkpoint are written once for both.

Rollout runs on ``rollout.num_engines`` engines (``agentrl.cluster.engines.pool.EnginePool``).
An engine lost mid-rollout (node removed, actor killed) turns its in-flight episodes into
``aborted`` ones, which are stored with the iteration's other episodes and never scored
(credit sets them aside), and its requests are rolled out again with ``attempt + 1`` on
the remaining engines (or on a replacement, ``cluster.node_wait_s``); the iteration goes on.

Resume never duplicates (docs/design.md, invariant 7). Each iteration writes its episodes, then
its metrics (``metrics.jsonl`` and the store), then, every ``run.checkpoint_every``
iterations, the checkpoint, and only then marks the iterations it covers complete in the
replay store (``ReplayStore.mark_complete``). A run stopped at any point resumes from the
last checkpoint: before re-running, the store drops every row of the later iterations
(``ReplayStore.rewind``) and ``metrics.jsonl`` is rewritten from the checkpoint's history
(``RunDir.rewind``), so after the re-run the store, its metrics table and ``metrics.jsonl``
hold each iteration exactly once. The re-run's episodes keep their ids, which are
deterministic from run, iteration, request and attempt (``EpisodeRequest.episode_id``).

KL to a reference in the reward (``trainer.kl.coef > 0`` with ``trainer.kl.mode: reward``):
before credit, the trainer ranks score the iteration's rows with the frozen reference
(``TrainerGroup.kl_to_reference``) and ``assign_credit`` gets the per-turn penalties
(``agentrl.credit.kl_reward``); with ``coef`` 0 (the default) no such call is made. In
``kl.mode: loss`` the trainer handles the term inside its step.

Run directory layout and checkpoints: ``agentrl.driver.checkpoint``.
"""

from __future__ import annotations

import logging
import signal
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from agentrl.cluster.actors.actor_errors import as_cluster_error
from agentrl.cluster.actors.placement import check_placement, role_options
from agentrl.cluster.actors.ray_connect import connect
from agentrl.cluster.actors.sandbox_choice import announce_sandboxes
from agentrl.cluster.actors.trainer_group import TrainerGroup
from agentrl.config import Config, trainer_configs
from agentrl.credit import check_group_size
from agentrl.driver.checkpoint import CONTROLLER_STATE, RunDir, latest_checkpoint, load_run_config
from agentrl.driver.difficulty import DifficultyFilter
from agentrl.driver.iteration import RunContext
from agentrl.driver.judge import warn_same_judge
from agentrl.driver.loop import BatchSource, Evaluator, NoEval, run_loop
from agentrl.driver.metric_sinks import check_packages, open_sinks
from agentrl.driver.stream_source import StreamSource
from agentrl.driver.sync_source import SyncSource
from agentrl.errors import CheckpointError, ConfigError
from agentrl.model_zoo import resolve_model_path
from agentrl.replay import ReplayStore
from agentrl.tasks import TaskSource
from sandboxes import reap_orphans

log = logging.getLogger(__name__)

__all__ = ["CONTROLLER_STATE", "RunSummary", "latest_checkpoint", "load_run_config", "train"]


@dataclass
class RunSummary:
    """What ``train`` (``agentrl.train``) returns.

    Attributes:
        run_dir: the run directory (``config.yaml``, ``metrics.jsonl``, ``replay.db``,
            ``checkpoints/``).
        run_id: the run's id in the replay store.
        iterations_done: iterations done in total (``run.iterations``), a resumed run's
            earlier ones included.
        policy_version: the policy version of the final weights.
        history: one metrics dict per iteration, as in ``metrics.jsonl``.
        status: ``"finished"``; a run that stops early raises instead (its status in the
            replay store is ``interrupted`` or ``failed``).
    """

    run_dir: Path
    run_id: str
    iterations_done: int
    policy_version: int
    history: list[dict[str, float]] = field(default_factory=list)
    status: str = "finished"


def train(cfg: Config, *, resume: bool = False, on_iteration: Callable[[int, dict], None] | None = None,
          progress: Any = None) -> RunSummary:
    """Run ``cfg.run.iterations`` iterations (or continue a run up to that number).

    ``on_iteration(it, line)`` and ``progress`` get the 1-based iteration ``it`` (the
    ``iteration`` of ``line``, the metrics line; docs/design.md, "Iteration numbering").

    Raises:
        ConfigError: bad configuration (unknown env, bad split, model missing, an
            ``env.group_size`` the estimator cannot learn from: ``check_group_size`` ...),
            or a run directory that already holds a run while ``resume`` is False.
        CheckpointError: ``resume`` without a usable checkpoint (``RunDir.load_state``: one
            of an unknown format).
    """
    import ray  # heavy

    t_train = time.perf_counter()  # the timeline's origin (timeline/* metrics)
    from agentrl.cluster.actors.env_factory import env_task_ids  # heavy: ray
    from agentrl.cluster.actors.judge_service import start_judge_service, stop_judge_service  # heavy: ray
    from agentrl.cluster.actors.rollout_actor import sampling_of  # heavy: ray
    from agentrl.cluster.actors.sandbox_host import start_sandbox_hosts, stop_sandbox_hosts  # heavy: ray
    from agentrl.cluster.engines.pool import EnginePool  # heavy: ray
    from agentrl.cluster.engines.stream import StreamingEnginePool  # heavy: ray
    from agentrl.driver.evaluation import TrainingEval  # heavy: ray

    for warning in check_group_size(cfg):  # refuses a group the estimator cannot learn from, before anything starts
        log.warning("%s", warning)
    warn_same_judge(cfg.reward.judge, cfg.eval.judge)  # eval.judge = reward.judge: allowed, with a warning naming it
    run_dir = cfg.run_dir()
    rd = RunDir(run_dir)
    if resume:
        ckpt = rd.latest_checkpoint()
        if ckpt is None:
            raise CheckpointError(f"cannot resume: run directory {run_dir} has no checkpoint yet; start it "
                                  "without resume (or choose the run directory that holds the run)")
        state = rd.load_state(ckpt)
        run_id = state["run_id"]
    else:
        if rd.holds_run():
            raise ConfigError(
                f"run directory {run_dir} already holds a run; continue it with agentrl.train(cfg, resume=True), "
                "or choose another run.name / run.dir"
            )
        ckpt, state = None, None
        run_id = f"{cfg.run.name}-{uuid.uuid4().hex[:8]}"
    iterations_done = int(state["iteration"]) if state else 0

    announce_sandboxes(cfg)  # the run's first lines: which sandboxes, on which daemon; a named silent daemon stops it here
    reaped = reap_orphans(docker_host=cfg.sandbox.docker_host)
    if reaped:
        log.warning("removed %d sandbox processes left behind by earlier runs", reaped)

    task_ids = env_task_ids(cfg.env.id, cfg.env.split, cfg.env.import_modules, cfg.env.kwargs)
    if cfg.env.task_ids is not None:
        unknown = [t for t in cfg.env.task_ids if t not in set(task_ids)]
        if unknown:
            raise ConfigError(f"env.task_ids: {unknown[:5]} not in split {cfg.env.split!r} of {cfg.env.id!r}")
        task_ids = list(cfg.env.task_ids)
    tasks = TaskSource(cfg.env.id, task_ids, cfg.run.seed, cfg.env.group_size, run_id=run_id)
    difficulty = DifficultyFilter(cfg, task_ids)  # env.difficulty_filter: profiles and the TaskSource's skip set
    training_eval = TrainingEval(cfg)  # eval.every > 0: its split checked held out now, before any actor starts
    model_path = resolve_model_path(cfg.model.path)
    # The trainers' configs here, in the driver, before any actor starts: a reference model
    # whose vocabulary differs (trainer.kl.reference_path) is a start-up ConfigError, not an
    # actor-constructor error that Ray reports only at the first trainer call, after a rollout.
    trainer_configs(cfg, model_path)
    check_packages(cfg)  # logging.tensorboard / logging.wandb: a missing package is a ConfigError now
    rd.write_config(cfg.model_dump(mode="json"))  # only once the env, its tasks and the models are known to fit
    cfg_dict = cfg.model_dump(mode="json")

    replay_url = cfg.replay.url or rd.replay_url()
    store = ReplayStore(replay_url)
    store.start_run(run_id, cfg_dict)
    # Whatever an attempt wrote after the checkpoint (or, for a new run, a crashed start in this
    # directory that reached no checkpoint wrote to metrics.jsonl) is abandoned: drop it.
    dropped = store.rewind(run_id, iterations_done)
    rd.rewind(iterations_done, state.get("history", []) if state else [])
    if dropped:
        log.warning("resume: dropped %d stored episodes of iterations after checkpoint %d", dropped, iterations_done)

    started_ray = connect(cfg)  # cluster.address None: always a new local instance; else join it
    status = "failed"
    history: list[dict[str, float]] = []
    policy_version = 0
    pool = None
    group = None  # the TrainerGroup: trainer.num_ranks ranks met at rank 0's node
    hosts: list = []  # SandboxHostRefs (cluster.sandbox_hosts > 0)
    judge_service = None  # reward.judge's service (agentrl.cluster.actors.judge_service)
    eval_judge_service = None  # eval.judge's, while evals run during training
    prev_sigterm = signal.getsignal(signal.SIGTERM)

    def _sigterm(signum, frame):  # turn SIGTERM into KeyboardInterrupt: same clean-up path
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _sigterm)
    try:
        # TensorBoard / W&B (logging.*): rebuilt from the checkpoint's history, as metrics.jsonl was
        rd.sinks = open_sinks(cfg, run_dir, run_id, state.get("history", []) if state else [])
        check_placement(cfg)  # a role no node can hold is a ConfigError at start, not an actor pending forever
        # reward.judge: the judge is checked now (down, slow or garbage: a JudgeError before any engine starts)
        judge_service = start_judge_service(cfg, run_id, replay_url)
        if training_eval.task_ids and iterations_done < cfg.run.iterations:  # evals to come: eval.judge checked too
            eval_judge_service = start_judge_service(cfg, run_id, replay_url, role="eval")
        hosts = start_sandbox_hosts(cfg, run_id)  # [] with cluster.sandbox_hosts=0: sandboxes in the engine
        # The engines' actors start now (their constructors run on their own), so their process
        # start and imports overlap the trainer ranks' start and meeting below: a run's start-up
        # is the longer of the two, not their sum.
        pool_cls = StreamingEnginePool if cfg.controller.mode == "async" else EnginePool
        pool = pool_cls(cfg, cfg_dict, model_path, run_id, sandbox_hosts=hosts)  # rollout.num_engines engines
        # the ranks meet at rank 0's node within cluster.rendezvous_timeout_s (else a ClusterError);
        # their trainers build while the engines start
        group = TrainerGroup(cfg, cfg_dict, model_path, role_options(cfg, "trainer"))
        # queued behind the build: the first touch of the weight-sync buffers overlaps the engines' start
        warm_sync = [a.warm_weight_sync.remote() for a in group.actors]
        engine_start_s = pool.ready()
        log.info("%d rollout engines started in %s s", len(engine_start_s), ", ".join(f"{s:.1f}" for s in engine_start_s))
        group.ready()
        ray.get(warm_sync)

        if ckpt is not None:
            group.load_checkpoint(str(ckpt / "trainer"))
            tasks.load_state_dict(state["tasks"])
            policy_version = int(state["policy_version"])
            difficulty.restored(tasks, iterations_done)  # the filter off (or async mode): a skip set is dropped
            history = list(state.get("history", []))
            pool.update_weights(group.actors)  # every engine gets the checkpoint's weights

        sampling = sampling_of(cfg)
        run = RunContext(cfg, rd, store, run_id, pool, group, tasks, sampling, t_train, history=history,
                         policy_version=policy_version, progress=progress, on_iteration=on_iteration,
                         difficulty=difficulty)
        if progress is not None:
            progress.start(total=cfg.run.iterations, completed=iterations_done)
        source, evaluator = _source_and_evaluator(run, state, training_eval, iterations_done)
        run_loop(run, source, evaluator, iterations_done)
        policy_version = run.policy_version
        status = "finished"
        return RunSummary(run_dir, run_id, cfg.run.iterations, policy_version, run.history, status)
    except KeyboardInterrupt:
        status = "interrupted"
        raise
    except Exception as exc:  # an actor or node lost (memory monitor, node gone): one line, never a traceback
        cluster_error = as_cluster_error(exc)
        if cluster_error is None:
            raise
        raise cluster_error from exc
    finally:
        signal.signal(signal.SIGTERM, prev_sigterm)
        try:
            store.finish_run(run_id, status)
        except Exception:
            log.exception("could not record the run's status")
        if pool is not None:
            pool.kill()
        if group is not None:
            group.kill()
        stop_sandbox_hosts(hosts)  # after the engines: each host closes its sandboxes, then is killed
        stop_judge_service(judge_service)
        stop_judge_service(eval_judge_service)
        if rd.sinks:
            rd.sinks.close()
        if started_ray:
            ray.shutdown()
        # The run is over: nothing of it may outlive it (docs/design.md, invariant 8).
        left = reap_orphans(run_id, include_live_owners=True, docker_host=cfg.sandbox.docker_host)
        if left:
            log.warning("removed %d sandbox processes of run %s at exit", left, run_id)


def _source_and_evaluator(run: RunContext, state: dict[str, Any] | None, training_eval: Any,
                          iterations_done: int) -> tuple[BatchSource, Evaluator]:
    """The loop's parts for ``controller.mode``: sync, the ``TaskSource`` drained before each
    update and evaluation on the rollout engines (``training_eval``); async, the stream under
    the staleness bound (``state``: the checkpoint's, whose pending requests go first) and a
    dedicated eval engine, started now so its model loads while the stream starts."""
    if run.cfg.controller.mode != "async":
        return SyncSource(run), training_eval
    evaluator: Evaluator = NoEval()
    if training_eval.task_ids and iterations_done < run.cfg.run.iterations:
        from agentrl.driver.dedicated_eval import DedicatedEval  # heavy: ray

        evaluator = DedicatedEval(run, training_eval, state)
    return StreamSource(run, state, evaluator), evaluator
