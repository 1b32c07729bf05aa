"""What every update does after its rollouts, in both controller modes: credit, the trainer
step, the replay and metrics writes, the checkpoint and the completion marks
(``agentrl.driver.loop`` runs them for both controller modes, so both keep invariant 7 the
same way).

Order of writes per iteration (crash safety, ``agentrl.driver.checkpoint``): episodes
(``after_replay_write``), metrics (``after_metrics``), then every ``run.checkpoint_every``
iterations the checkpoint (``mid_checkpoint_state``, ``mid_checkpoint``,
``after_checkpoint``) and only then ``ReplayStore.mark_complete``.

Timeline metrics (for the benchmark's per-phase picture): ``timeline/<phase>_start_s`` and
``timeline/<phase>_end_s``, wall seconds since ``train()`` started in this process, for
``rollout``, ``credit``, ``update``, ``sync`` of the iteration itself; a checkpoint is written
after its iteration's metrics (which it stores), so ``timeline/checkpoint_*`` of a checkpoint
are in the *next* iteration's line (the run's last checkpoint is in none). With a judge
(``reward.judge``), ``timeline/judge_*`` place the judging of the update's episodes, which
overlaps the rollout (``judge_phase``).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from agentrl.config import Config
from agentrl.credit import CreditResult, assign_credit, critic_step_metrics, reference_batch, turn_penalties
from agentrl.driver.checkpoint import CHECKPOINT_FORMAT, RunDir, kill_point
from agentrl.replay.codec import finite_trainer_values
from agentrl.replay.trainer_values import turn_trainer_values
from agentrl.rollout.loop import rollout_metrics

if TYPE_CHECKING:  # annotations only: the run's parts, built by agentrl.driver.controller
    from agentrl.cluster.actors.trainer_group import TrainerGroup
    from agentrl.cluster.engines.pool import EnginePool
    from agentrl.driver.difficulty import DifficultyFilter
    from agentrl.replay import ReplayStore
    from agentrl.tasks import TaskSource
    from agentrl.types import SamplingRecord


@dataclass
class RunContext:
    """The live parts of one ``train()`` call that the per-iteration steps share.

    ``t0``: ``time.perf_counter()`` when ``train()`` started (timeline origin);
    ``t0_epoch_s``: the same moment as wall-clock epoch seconds (``time.time()``; derived
    from ``t0`` when not given), the origin of the judge's stamps (``judge_phase``);
    ``history``: the metrics lines so far (the checkpoint stores them);
    ``policy_version``: the trainer's version (updates done).
    """

    cfg: Config
    rd: RunDir
    store: ReplayStore
    run_id: str
    pool: EnginePool  # a StreamingEnginePool in async mode
    group: TrainerGroup
    tasks: TaskSource
    sampling: SamplingRecord
    t0: float
    history: list[dict[str, float | None]] = field(default_factory=list)
    policy_version: int = 0
    progress: Any = None  # the CLI's progress bar (start / phase / advance), or None
    on_iteration: Callable[[int, dict], None] | None = None
    carried: dict[str, float] = field(default_factory=dict)  # timeline of the last checkpoint, for the next line
    difficulty: DifficultyFilter | None = None
    t0_epoch_s: float | None = None

    def __post_init__(self) -> None:
        if self.t0_epoch_s is None:  # perf_counter and the wall clock advance alike
            self.t0_epoch_s = time.time() - (time.perf_counter() - self.t0)

    def now_s(self) -> float:
        """Seconds since ``train()`` started (the timeline's clock)."""
        return time.perf_counter() - self.t0

    def phase(self, it: int, name: str) -> None:
        if self.progress is not None:
            self.progress.phase(it, name)


def kl_reward_penalties(cfg: Config, episodes: list, sampling: Any, group: Any
                        ) -> tuple[dict[str, list[float]] | None, dict[str, float]]:
    """The KL-to-reference reward penalty of ``trainer.kl.mode: reward`` (``coef > 0``):
    the trainer ranks (``group``: the run's ``TrainerGroup``) score the iteration's rows with
    the reference model (``kl_to_reference``), and ``agentrl.credit.kl_reward.turn_penalties`` turns the
    per-token estimates into per-turn penalties for ``assign_credit``. ``(None, {})``
    otherwise: the default path makes no extra actor call."""
    kl = cfg.trainer.kl
    if not (kl.coef > 0 and kl.mode == "reward"):
        return None, {}
    scored, batch = reference_batch(episodes, sampling)
    if batch is None:
        return None, {}
    per_token, metrics = group.kl_to_reference(batch)
    return turn_penalties(scored, batch, per_token, kl.coef), dict(metrics)


def compute_credit(run: RunContext, episodes: list, shaped: dict, refills: int) -> CreditResult:
    """``assign_credit`` on an update's episodes (with the KL reward penalty and the critic's
    values where configured); ``filter/refill_rounds`` = ``refills``."""
    cfg = run.cfg
    penalties, kl_metrics = kl_reward_penalties(cfg, episodes, run.sampling, run.group)
    credit = assign_credit(episodes, cfg.algorithm, run.sampling, max_new_tokens=cfg.rollout.max_new_tokens,
                           values_fn=run.group.critic_values,
                           shaped_cache=shaped, reward_penalties=penalties)
    credit.metrics["filter/refill_rounds"] = float(refills)
    credit.metrics.update(kl_metrics)
    return credit


@dataclass
class UpdateResult:
    """What an update's trainer steps return.

    Attributes:
        metrics: the policy step's ``actor/*`` metrics and the critic step's.
        token_values: ``(log_probs [T], entropies [T])`` float32 CPU tensors of the policy
            step's batch (``TrainerGroup.train_step``), or None when no policy step ran.
    """

    metrics: dict[str, float] = field(default_factory=dict)
    token_values: tuple[Any, Any] | None = None


def train_on(group: Any, credit: CreditResult) -> UpdateResult:
    """The policy step on ``credit.batch`` and the critic step on ``credit.value_batch``
    (each only when there is one); their metrics and the policy step's per-token values."""
    out = UpdateResult()
    if credit.batch is not None:
        step = group.train_step(credit.batch)
        out = UpdateResult(dict(step.metrics), (step.log_probs, step.entropies))
    if credit.value_batch is not None:
        out.metrics.update(critic_step_metrics(group.critic_step(credit.value_batch)))
    return out


def trainer_token_values(update: UpdateResult, credit: CreditResult, episodes: list) -> dict[str, list] | None:
    """The trainer-side log-prob and entropy of each sampled token of ``episodes`` from the
    update just made on ``credit.batch`` (``update.token_values``, cut per turn by
    ``agentrl.replay.trainer_values``), for the replay store; ``None`` when no update ran."""
    if credit.batch is None or update.token_values is None:
        return None
    lp, ent = update.token_values  # (T,) float32 each, aligned with credit.batch's tokens
    b = credit.batch
    return turn_trainer_values(episodes, b.episode_ids, b.seq_lens.tolist(), lp.numpy(), ent.numpy())


def record_iteration(run: RunContext, it: int, episodes: list, credit: CreditResult, update: UpdateResult, *,
                     pool_metrics: dict[str, float], sync_metrics: dict[str, float],
                     times: dict[str, float], t_iter: float,
                     extra: dict[str, float] | None = None) -> dict[str, float | None]:
    """Store iteration ``it``'s (1-based) episodes (not complete until checkpointed; with the update's
    per-token trainer log-probs and entropies from ``update``: ``trainer_token_values``), then its metrics
    line (``metrics.jsonl``, the store, ``run.history``); returns the line.

    ``times``: ``time/rollout_s``, ``time/credit_s``, ``time/update_s``, ``time/sync_s``
    (``time/replay_s`` and ``time/iteration_s`` are added here); ``extra``: further keys
    (timeline, ``async/*``), after the usual ones. Non-finite values become null.
    """
    cfg, store = run.cfg, run.store
    t0 = time.perf_counter()
    # a non-finite trainer value (a diverging update) is stored as NULL, never blocks the episodes
    values, nonfinite_turns = finite_trainer_values(trainer_token_values(update, credit, episodes))
    store.add_episodes(run.run_id, it, episodes, credit.turn_advantages,  # not complete until checkpointed
                       trainer_values=values)
    replay_s = time.perf_counter() - t0
    kill_point("after_replay_write", it)

    m: dict[str, float] = {"iteration": float(it), "policy_version": float(run.policy_version),
                           "replay/trainer_values_nonfinite_turns": float(nonfinite_turns)}
    m.update(rollout_metrics(episodes))
    m.update(pool_metrics)  # cluster/engines, cluster/engines_lost, rollout/engine_{i}_*
    m.update(sync_metrics)
    ps = run.pool.pool_stats() if cfg.sandbox.pool_size > 0 else None  # None: no engine keeps a pool
    if ps is not None:
        m.update({"sandbox/acquire_p50_ms": 1e3 * ps["acquire_p50_s"], "sandbox/acquire_p95_ms": 1e3 * ps["acquire_p95_s"],
                  "sandbox/startup_p50_ms": 1e3 * ps["startup_p50_s"], "sandbox/started": float(ps["started"]),
                  "sandbox/replaced": float(ps["replaced"])})
    m.update(credit.metrics)
    m.update(update.metrics)
    m.update(times)
    m.update({"time/replay_s": replay_s, "time/iteration_s": time.perf_counter() - t_iter})
    m.update(run.carried)
    run.carried = {}
    m.update(extra or {})
    clean = {k: (float(v) if isinstance(v, (int, float)) and math.isfinite(float(v)) else None) for k, v in m.items()}
    run.rd.append_metrics(clean)
    store.add_metrics(run.run_id, it, {k: v for k, v in clean.items() if v is not None})
    run.history.append(clean)
    kill_point("after_metrics", it)
    return clean


def checkpoint_if_due(run: RunContext, it: int, in_flight: Any, extra_state: dict[str, Any] | None = None) -> bool:
    """Every ``run.checkpoint_every`` iterations and at the last: write the checkpoint after
    iteration ``it`` (1-based, so ``it`` iterations are done: ``checkpoints/iter_{it}``;
    trainers, then the controller state: format version, run id, iterations done, policy
    version, task cursor, history, ``in_flight_rollouts`` and ``extra_state``), then mark the
    iterations it covers complete in the store. Returns whether it wrote one."""
    cfg = run.cfg
    if not (it % cfg.run.checkpoint_every == 0 or it == cfg.run.iterations):
        return False
    run.phase(it, "checkpoint")
    start = run.now_s()
    state = {"format": CHECKPOINT_FORMAT, "run_id": run.run_id, "iteration": it, "policy_version": run.policy_version,
             "tasks": run.tasks.state_dict(), "history": run.history, "in_flight_rollouts": in_flight}
    state.update(extra_state or {})
    run.rd.save_checkpoint(it, state, save_trainers=lambda d: run.group.save_checkpoint(str(d / "trainer")))
    kill_point("after_checkpoint", it)
    run.store.mark_complete(run.run_id, it)  # only now does the store call these iterations complete
    run.carried = {"timeline/checkpoint_start_s": start, "timeline/checkpoint_end_s": run.now_s()}
    return True


def end_iteration(run: RunContext, it: int, clean: dict[str, float | None]) -> None:
    """The caller's callback and the progress display, after the iteration is written."""
    if run.on_iteration is not None:
        run.on_iteration(it, clean)
    if run.progress is not None:
        run.progress.advance(it, clean)


def judge_tail_s(episodes: list, since_epoch_s: float) -> float:
    """The seconds one rollout round (a ``take`` or a refill's ``more``, started at
    ``since_epoch_s``, epoch seconds) still waited for judgements alone: the last settle minus
    the later of the last submit (the last episode's env finished) and the round's start (an
    episode judged before the round began, e.g. buffered by an async stream, kept no one
    waiting); at least 0; 0.0 when no episode has a stamped judgement."""
    recs = [e.judgement for e in episodes if e.judgement is not None
            and e.judgement.submitted_at_s is not None and e.judgement.settled_at_s is not None]
    if not recs:
        return 0.0
    last_submit, last_settle = max(r.submitted_at_s for r in recs), max(r.settled_at_s for r in recs)
    return max(0.0, last_settle - max(last_submit, since_epoch_s))


def judge_phase(episodes: list, t0_epoch_s: float, tail_s: float | None = None) -> dict[str, float]:
    """The judge phase of an update's episodes, from their ``JudgeRecord`` stamps (epoch
    seconds): ``timeline/judge_start_s`` (the first submit) and ``timeline/judge_end_s`` (the
    last settle), seconds since ``t0_epoch_s`` (``RunContext.t0_epoch_s``); ``time/judge_s``
    (that span; it overlaps the rollout) and ``time/judge_tail_s``: ``tail_s``, the seconds the
    rollout waited for judgements alone summed over its rounds (``judge_tail_s`` of each;
    ``Taken.judge_tail_s``), or when None ``judge_tail_s(episodes, t0_epoch_s)`` over all of
    them as one round. ``{}`` when no episode has a stamped judgement."""
    recs = [e.judgement for e in episodes if e.judgement is not None
            and e.judgement.submitted_at_s is not None and e.judgement.settled_at_s is not None]
    if not recs:
        return {}
    first = min(r.submitted_at_s for r in recs)
    last_settle = max(r.settled_at_s for r in recs)
    tail = judge_tail_s(episodes, t0_epoch_s) if tail_s is None else float(tail_s)
    return {**span("judge", first - t0_epoch_s, last_settle - t0_epoch_s), "time/judge_s": last_settle - first,
            "time/judge_tail_s": tail}


def span(name: str, start_s: float, end_s: float) -> dict[str, float]:
    """``{"timeline/<name>_start_s": start_s, "timeline/<name>_end_s": end_s}``."""
    return {f"timeline/{name}_start_s": start_s, f"timeline/{name}_end_s": end_s}


__all__ = ["RunContext", "UpdateResult", "checkpoint_if_due", "compute_credit", "end_iteration", "judge_phase",
           "judge_tail_s", "kl_reward_penalties", "record_iteration", "span", "train_on", "trainer_token_values"]
