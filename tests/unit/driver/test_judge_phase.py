"""The judge phase of an iteration (``agentrl.driver.iteration.judge_phase``, written by
``agentrl.driver.loop.run_iteration`` for both controller modes): from the taken episodes'
``JudgeRecord`` stamps, ``timeline/judge_start_s`` (first submit) and ``_end_s`` (last settle)
on the timeline's clock (``RunContext.t0_epoch_s``), ``time/judge_s`` (that span) and
``time/judge_tail_s`` (last settle minus last submit, at least 0); nothing without a stamped
judgement. Stand-in source, store and trainer group (no Ray)."""

from __future__ import annotations

import time
from types import SimpleNamespace

from agentrl.config import load_config
from agentrl.driver.checkpoint import RunDir
from agentrl.driver.iteration import RunContext, judge_phase
from agentrl.driver.loop import NoEval, Taken, run_iteration
from agentrl.tasks import TaskSource
from agentrl.types import Episode, JudgeRecord, SamplingRecord, TerminationReason

ENV = "agentrl/GuessNumber-v0"


def _ep(i: int, submitted: float | None, settled: float | None, judged: bool = True) -> Episode:
    rec = JudgeRecord(model="m", rubric="r", rubric_digest="d", submitted_at_s=submitted, settled_at_s=settled)
    # a reward error (a judgement with no reward): stored, never trained, so the update trains nothing
    return Episode(group_id="g", env_id=ENV, task_id="a", seed=0, episode_id=f"e{i}",
                   termination_reason=TerminationReason.REWARD_ERROR, error={"type": "RewardError", "message": "x"},
                   judgement=rec if judged else None)


def test_the_phase_runs_from_the_first_submit_to_the_last_settle_and_its_tail_follows_the_last_submit():
    eps = [_ep(0, 100.0, 101.0), _ep(1, 100.5, 103.5), _ep(2, 102.0, 102.5), _ep(3, None, None, judged=False)]
    assert judge_phase(eps, 90.0) == {"timeline/judge_start_s": 10.0, "timeline/judge_end_s": 13.5,
                                      "time/judge_s": 3.5, "time/judge_tail_s": 1.5}  # 103.5 - 102.0
    # the last episode to go to the judge settled first: no tail, never a negative one
    assert judge_phase([_ep(0, 100.0, 103.0), _ep(1, 103.5, 103.5)], 100.0)["time/judge_tail_s"] == 0.0


def test_no_stamped_judgement_no_phase():
    assert judge_phase([_ep(0, None, None, judged=False)], 0.0) == {}
    assert judge_phase([_ep(0, None, None)], 0.0) == {}  # a record from the store carries no stamps
    assert judge_phase([], 0.0) == {}


def test_the_run_context_knows_its_origin_on_the_wall_clock():
    t0 = time.perf_counter() - 5.0  # train() started 5 s ago
    run = RunContext(None, None, None, "r", None, None, None, None, t0)  # type: ignore[arg-type]
    assert abs(run.t0_epoch_s - (time.time() - 5.0)) < 0.05
    assert RunContext(None, None, None, "r", None, None, None, None, t0, t0_epoch_s=42.0).t0_epoch_s == 42.0  # type: ignore[arg-type]


class _Store:
    def add_episodes(self, *args, **kwargs) -> int:
        return 0

    def add_metrics(self, *args, **kwargs) -> None:
        return None


class _Source:
    """A ``BatchSource`` handing over ``episodes`` once (4 rollout seconds)."""

    def __init__(self, episodes: list[Episode]) -> None:
        self.episodes = episodes

    def before_iteration(self, run, it):
        return {}

    def take(self, groups):
        return Taken(list(self.episodes), [], 4.0)

    def more(self, missing):
        return Taken()

    def while_updating(self, step, after_submit):
        after_submit()
        return step()

    def sync_weights(self, version, payload):
        raise AssertionError("nothing was trained: no sync")

    def after_sync(self, metrics):
        return metrics

    def metrics(self, taken, credit, version):
        return {}, {}

    def checkpoint_state(self):
        return "", {}

    def stop(self, interrupted):
        return None


LATER = float(int(time.time()) + 3600)
"""Stamps an hour from now (whole seconds: exact differences): after the rollout round began,
so the tail is not clipped to the round's start."""


def _iteration(tmp_path, episodes: list[Episode]) -> dict:
    cfg = load_config(None, [f"env.id={ENV}", "env.tasks_per_iteration=1", "env.group_size=2", "run.iterations=3",
                                 "run.checkpoint_every=3"])
    tasks = TaskSource(cfg.env.id, ["a"], cfg.run.seed, cfg.env.group_size, run_id="r")
    run = RunContext(cfg, RunDir(tmp_path), _Store(), "r", SimpleNamespace(), SimpleNamespace(critic_values=None),
                     tasks, SamplingRecord(), time.perf_counter(), t0_epoch_s=LATER - 10.0)
    run_iteration(run, _Source(episodes), NoEval(), 1)
    return run.history[-1]


def test_an_iteration_writes_the_judge_phase_of_its_episodes(tmp_path):
    line = _iteration(tmp_path, [_ep(0, LATER, LATER + 1.0), _ep(1, LATER + 2.0, LATER + 3.5)])
    assert (line["timeline/judge_start_s"], line["timeline/judge_end_s"]) == (10.0, 13.5)
    assert (line["time/judge_s"], line["time/judge_tail_s"], line["time/rollout_s"]) == (3.5, 1.5, 4.0)
    assert (line["judge/wait_p50_s"], line["judge/wait_p99_s"]) == (1.5, 1.5)  # waits 1.0 and 1.5


def test_an_iteration_without_judgements_has_no_judge_phase(tmp_path):
    line = _iteration(tmp_path, [_ep(0, None, None, judged=False), _ep(1, None, None, judged=False)])
    assert not any("judge" in k for k in line)
