"""The difficulty filter in asynchronous training (``StreamSource.before_iteration``): the
profile runs on the stream with training admission paused, beside the training episodes in
flight (which finish into the buffer), at the one version the engines are at; its requests
never enter the ``GroupBuffer``; the skip set applies to requests drawn after it while groups
admitted before keep their tasks; a lost engine's profile request is retried; and
``time/rollout_s`` is the wall time an update waited for its groups, refills included.

A stand-in streaming pool hands back real ``Episode`` records here (no Ray); the real run is
tests/integration/cluster/test_profile_train.py::test_async_profile_sees_one_version_and_a_resume_reproduces_it."""

from __future__ import annotations

import time
from dataclasses import replace
from types import SimpleNamespace

import pytest

from agentrl.config import load_config
from agentrl.driver.checkpoint import RunDir
from agentrl.driver.difficulty import DifficultyFilter
from agentrl.driver.iteration import RunContext
from agentrl.driver.loop import take_update
from agentrl.driver.stream_source import StreamSource
from agentrl.errors import ContractError
from agentrl.tasks import SkipSet, TaskSource
from agentrl.types import Episode, EpisodeRequest, TerminationReason, Turn

IDS = ["a", "b", "c", "d"]


def _is_profile(r) -> bool:
    return "/profile/" in r.episode_id


class _StreamPool:
    """A stand-in ``StreamingEnginePool``: one engine at ``version``; a submitted request
    finishes after ``delay(request)`` collects with one scored turn (success where
    ``solves(task, index, version)``); ``lose_first_profile``: the first profile request's
    first attempt comes back aborted with a retry (an engine lost)."""

    def __init__(self, solves, delay=lambda r: 1, lose_first_profile=False, collect_s=0.0):
        self.solves, self.delay, self.collect_s = solves, delay, collect_s
        self.version = 0
        self.submitted: list[EpisodeRequest] = []
        self.running: dict[str, list] = {}
        self.lose_first_profile = lose_first_profile
        self.engines_lost, self.engine_indices = 0, [0]

    def stream_start(self, policy_version):
        self.version = policy_version

    def stream_submit(self, requests):
        for r in requests:
            self.submitted.append(r)
            self.running[r.episode_id] = [r, self.delay(r)]

    def in_flight(self):
        return len(self.running)

    def collect(self, wait_s):
        time.sleep(self.collect_s)
        episodes, retries = [], []
        for eid, slot in list(self.running.items()):
            slot[1] -= 1
            if slot[1] > 0:
                continue
            r = slot[0]
            del self.running[eid]
            if self.lose_first_profile and _is_profile(r):
                self.lose_first_profile = False
                episodes.append(Episode(group_id=r.group_id, env_id=r.env_id, task_id=r.task_id, seed=r.seed,
                                        termination_reason=TerminationReason.ABORTED, episode_id=eid,
                                        error={"type": "ActorDiedError", "message": "engine 0 was lost"}))
                retry = replace(r, attempt=r.attempt + 1)
                retries.append((eid, retry))
                self.stream_submit([retry])
                continue
            ok = self.solves(r.task_id, r.index, self.version)
            turn = Turn(prompt_ids=[1], completion_ids=[2, 3, 4], behavior_log_probs=[-0.1] * 3, reward=float(ok),
                        policy_version=self.version, policy_versions=[self.version] * 3)
            episodes.append(Episode(group_id=r.group_id, env_id=r.env_id, task_id=r.task_id, seed=r.seed, turns=[turn],
                                    terminated=True, termination_reason=TerminationReason.ENV_TERMINATED, episode_id=eid))
        return episodes, retries

    def stream_update_weights(self, actors, policy_version, mode, payload=None):
        self.version = policy_version
        return {"async/preempted_requests": 0.0, "async/restarted_episodes": 0.0}


class _Store:
    def __init__(self):
        self.added = []

    def add_episodes(self, run_id, iteration, episodes, advantages=None, *, kind="train", trainer_values=None):
        self.added.append((run_id, iteration, list(episodes), kind))
        return len(episodes)


def _run(tmp_path, pool, *overrides: str) -> RunContext:
    cfg = load_config(None, ["env.id=agentrl/GuessNumber-v0", "controller.mode=async", "controller.max_staleness=1",
                             "env.tasks_per_iteration=2", "env.group_size=2", "env.profile_samples=2", "run.seed=5",
                             "env.difficulty_filter=skip_solved_and_unsolved", "env.profile_every=1", *overrides])
    tasks = TaskSource(cfg.env.id, IDS, cfg.run.seed, cfg.env.group_size, run_id="r")
    return RunContext(cfg, RunDir(tmp_path), _Store(), "r", pool, SimpleNamespace(actors=[]), tasks, None,
                      time.perf_counter(), difficulty=DifficultyFilter(cfg, IDS))


def _v0(task, index, version):  # a never, b always, c and d half the time
    return task == "b" or (task == "c" and index == 0) or (task == "d" and index == 1)


def _v1(task, index, version):  # from version 1: b and c always, a and d half the time
    if version == 0:
        return _v0(task, index, version)
    return task in ("b", "c") or index == 0


def test_the_async_profile_pauses_admission_sees_one_version_and_skips_later_requests_only(tmp_path):
    # training episodes take 2 collects, profile ones 4: the training in flight finishes during the profile
    pool = _StreamPool(_v1, delay=lambda r: 4 if _is_profile(r) else 2)
    run = _run(tmp_path, pool)
    src = StreamSource(run, None)
    run.tasks.iteration = 1
    m = src.before_iteration(run, 1)
    assert pool.submitted and all(_is_profile(r) for r in pool.submitted)  # nothing trained was drawn before it
    assert len(pool.submitted) == 8 and not src.buf.groups and not src.buf.pending  # never a training group
    assert run.tasks.skip == SkipSet(("a", "b"), policy_version=0, iteration=1)
    [(_, it, eps, kind)] = run.store.added
    assert (it, kind, len(eps)) == (1, "profile", 8)
    assert {v for e in eps for t in e.turns for v in t.policy_versions} == {0}
    assert m["profile/skipped_tasks"] == 2 and m["time/profile_s"] >= 0 and "timeline/profile_end_s" in m
    assert (tmp_path / "profiles" / "iter_1.json").exists()
    taken = src.take(2)
    assert {e.task_id for e in taken.episodes} <= {"c", "d"}

    # the update: the driver keeps admitting (the next update's groups, drawn under skip {a, b}) ...
    for _ in range(2):
        src.streamer.pump(0.0)
    src.after_sync(src.sync_weights(1, None))
    run.policy_version = 1
    src.streamer.pump(0.0)  # the released slots take more groups, still in flight
    held = {g.group_id: (g.admitted_version, [r.episode_id for r in g.requests]) for g in src.buf.groups.values()}
    assert held and src.buf.in_flight() > 0
    n_before = len(pool.submitted)

    # ... then the profile before iteration 2, at version 1
    run.tasks.iteration = 2
    src.before_iteration(run, 2)
    during = pool.submitted[n_before:]
    assert len(during) == 8 and all(_is_profile(r) for r in during)  # no training request drawn or admitted
    eps = run.store.added[-1][2]
    assert run.store.added[-1][1] == 2 and {v for e in eps for t in e.turns for v in t.policy_versions} == {1}
    assert run.tasks.skip == SkipSet(("b", "c"), policy_version=1, iteration=2)
    # the groups admitted before it keep their tasks, version and ids, and finished into the buffer meanwhile
    assert {g.group_id: (g.admitted_version, [r.episode_id for r in g.requests])
            for g in src.buf.groups.values()} == held
    assert src.buf.in_flight() == 0 and all(g.complete for g in src.buf.groups.values())
    assert [r.episode_id for r in src.buf.held_requests()] == [e for _, ids in held.values() for e in ids]
    # requests drawn after it skip the new set (the update's slots free at its weight sync)
    src.take(2)
    src.after_sync(src.sync_weights(2, None))
    run.policy_version = 2
    for _ in range(3):
        src.streamer.pump(0.0)
    after = pool.submitted[n_before + len(during):]
    assert after and {r.task_id for r in after} <= {"a", "d"}


def test_a_profile_request_of_a_lost_engine_is_retried_and_its_aborted_attempt_stored(tmp_path):
    pool = _StreamPool(_v0, lose_first_profile=True)
    run = _run(tmp_path, pool)
    src = StreamSource(run, None)
    run.tasks.iteration = 1
    m = src.before_iteration(run, 1)
    [(_, _, eps, kind)] = run.store.added
    aborted = [e for e in eps if e.termination_reason == TerminationReason.ABORTED]
    assert kind == "profile" and len(eps) == 9 and len(aborted) == 1
    assert any(r.attempt == 1 and r.episode_id != aborted[0].episode_id for r in pool.submitted)
    # as EnginePool.rollout's in sync mode: the aborted attempt counts as errored, its retry as the sample
    assert run.tasks.skip.task_ids == ("a", "b")
    assert m["profile/samples_errored"] == 1 and m["profile/samples_scored"] == 8
    assert not src.buf.groups and src.streamer.side is None


def test_the_stream_rollout_refuses_another_version_or_budget(tmp_path):
    run = _run(tmp_path, _StreamPool(_v0))
    src = StreamSource(run, None)
    req = TaskSource(run.cfg.env.id, IDS, 1, 1, run_id="r/profile").next_requests(1)
    with pytest.raises(ContractError, match="policy_version=3"):
        src.streamer.rollout(req, 3)
    with pytest.raises(ContractError, match="budget"):
        src.streamer.rollout(req, 0, budget=object())
    eps, seconds, metrics = src.streamer.rollout(req, 0)
    assert [e.episode_id for e in eps] == [r.episode_id for r in req] and metrics == {} and seconds >= 0


def test_a_run_without_the_filter_never_profiles_and_a_resume_keeps_the_skip_set(tmp_path):
    pool = _StreamPool(_v0)
    run = _run(tmp_path, pool, "env.difficulty_filter='off'")
    src = StreamSource(run, None)
    assert src.before_iteration(run, 1) == {} and pool.submitted == []
    on = _run(tmp_path, pool)
    on.tasks.set_skip({"a"}, policy_version=2, iteration=3)
    on.difficulty.restored(on.tasks, 3)  # async mode: the checkpoint's skip set stays
    assert on.tasks.skip == SkipSet(("a",), policy_version=2, iteration=3)


def test_rollout_seconds_are_the_wall_time_waited_for_the_groups_with_the_refill(tmp_path):
    only_d = lambda task, index, version: task == "d" and index == 0  # noqa: E731 (every other group is filtered)
    pool = _StreamPool(only_d, delay=lambda r: 3, collect_s=0.01)
    run = _run(tmp_path, pool, "env.difficulty_filter='off'", "algorithm.dynamic_sampling=true")
    src = StreamSource(run, None)
    t0 = time.perf_counter()
    taken, refills = take_update(run, src, {})
    wall = time.perf_counter() - t0
    assert refills >= 1
    assert 0.8 * wall <= taken.seconds <= wall
