"""The async controller's pure logic (``agentrl.driver.staleness``) on known sequences:
the admission cap, the must-include rule, drop and re-issue, the staleness histogram, and the
``controller:`` config errors. A simulated run at the end drives ``_Streamer`` (the
controller's admission and collection) against an in-process stand-in for the streaming
engines, beside the real-engine test in tests/integration/cluster/test_async_train.py."""

from __future__ import annotations

import random

import pytest

from agentrl.driver.staleness import GroupBuffer, split_stale, staleness_metrics
from agentrl.config import load_default_config
from agentrl.errors import ConfigError, ContractError
from agentrl.tasks import TaskSource, requests_from_state, requests_state, retry_requests
from agentrl.types import Episode, EpisodeRequest, TerminationReason, Turn


def _episode(req: EpisodeRequest, versions: list[int], reason=TerminationReason.ENV_TERMINATED) -> Episode:
    turns = [Turn(prompt_ids=[1, 2], completion_ids=[3, 4], behavior_log_probs=[-0.5, -0.5], policy_version=v,
                  reward=1.0) for v in versions]
    return Episode(group_id=req.group_id, env_id=req.env_id, task_id=req.task_id, seed=req.seed, turns=turns,
                   terminated=True, termination_reason=reason, episode_id=req.episode_id)


def _aborted(req: EpisodeRequest) -> Episode:
    return Episode(group_id=req.group_id, env_id=req.env_id, task_id=req.task_id, seed=req.seed,
                   termination_reason=TerminationReason.ABORTED, episode_id=req.episode_id)


def _source(group_size: int = 2) -> TaskSource:
    return TaskSource("agentrl/GuessNumber-v0", [f"t{i}" for i in range(7)], seed=0, group_size=group_size, run_id="r")


def _finish(buf: GroupBuffer, gid: str, version: int) -> None:
    g = buf.groups[gid]
    for r in g.unfinished_requests():
        buf.add_episode(_episode(r, [version]))


def test_admission_cap_is_k_plus_one_times_b():
    tasks, buf = _source(), GroupBuffer(groups_per_update=2, max_staleness=1)
    for _ in range(6):
        buf.queue(tasks.next_requests(1))
    admitted = buf.admit(version=0)
    assert buf.capacity == 4 and len(buf.groups) == 4 and len(admitted) == 4 * 2  # (k+1)*B groups of 2
    assert len(buf.pending) == 2 and buf.free_slots() == 0 and buf.admit(0) == []
    order = list(buf.groups)
    for gid in order[1:3]:
        _finish(buf, gid, 0)
    assert not buf.ready(0, 3) and buf.ready(0, 2)
    taken = buf.take(version=0, wanted=2)
    assert [g.group_id for g in taken] == order[1:3]  # complete ones, oldest admission first
    assert buf.free_slots() == 0 and buf.admit(0) == []  # the running update holds their slots
    buf.release()
    assert buf.free_slots() == 2 and len(buf.admit(1)) == 4 and not buf.pending


def test_must_include_waits_for_the_oldest_group_and_takes_it_first():
    tasks, buf = _source(), GroupBuffer(groups_per_update=1, max_staleness=1)
    for _ in range(2):
        buf.queue(tasks.next_requests(1))
    buf.admit(version=0)
    g0, g1 = list(buf.groups)
    _finish(buf, g1, 0)
    # at version 0 nothing is old yet: the complete younger group may go first
    assert buf.must_include(0) == [] and buf.ready(0, 1)
    assert [g.group_id for g in buf.take(0, 1)] == [g1]
    buf.release()
    # at version 1, g0 (admitted at 0) would be 2 > k old at the next update: this one must take it,
    # and waits while it is incomplete even though another complete group is there
    buf.queue(tasks.next_requests(1))
    g2 = buf.admit(1)[0].group_id
    _finish(buf, g2, 1)
    assert [g.group_id for g in buf.must_include(1)] == [g0]
    assert not buf.ready(1, 1)
    with pytest.raises(ContractError, match="before it is ready"):
        buf.take(1, 1)
    _finish(buf, g0, 0)
    assert [g.group_id for g in buf.take(1, 1)] == [g0]


def test_aborted_member_is_kept_and_its_retry_completes_the_group():
    tasks, buf = _source(), GroupBuffer(groups_per_update=1, max_staleness=0)
    buf.queue(tasks.next_requests(1))
    r0, r1 = buf.admit(0)
    buf.add_episode(_episode(r0, [0]))
    buf.add_episode(_aborted(r1))
    (retry,) = retry_requests([r1])
    buf.add_retry(r1.episode_id, retry)
    assert not buf.ready(0, 1) and buf.in_flight() == 1
    assert buf.held_requests() == [r0, retry]  # a checkpoint now would re-issue the retry, not a0
    buf.add_episode(_episode(retry, [0]))
    (g,) = buf.take(0, 1)
    assert [e.episode_id for e in g.episodes()] == [r1.episode_id, r0.episode_id, retry.episode_id]
    with pytest.raises(ContractError, match="not an admitted request"):
        buf.add_episode(_episode(r0, [0]))


def test_stale_group_is_dropped_whole_and_reissued_with_the_next_attempt():
    tasks, buf = _source(), GroupBuffer(groups_per_update=1, max_staleness=1)
    buf.queue(tasks.next_requests(1))
    buf.queue(tasks.next_requests(1))
    a, b = buf.admit(0)[::2]
    for r in buf.groups[a.group_id].requests:
        buf.add_episode(_episode(r, [0, 2]))  # oldest token at version 0
    for r in buf.groups[b.group_id].requests:
        buf.add_episode(_episode(r, [1]))
    fresh, stale = split_stale(buf.take(2, 2), version=2, max_staleness=1)
    assert [g.group_id for g in stale] == [a.group_id] and [g.group_id for g in fresh] == [b.group_id]
    again = retry_requests(stale[0].requests)
    buf.queue(again, front=True)
    buf.release()
    assert [r.attempt for r in buf.admit(2)] == [1, 1]
    assert {r.episode_id for r in again}.isdisjoint(r.episode_id for r in stale[0].requests)


def test_staleness_metrics_histogram_counts_rows():
    m = staleness_metrics([3, 2, 2, 3, 1], version=3)
    assert m["async/staleness_hist/0"] == 2 and m["async/staleness_hist/1"] == 2 and m["async/staleness_hist/2"] == 1
    assert m["async/staleness_mean"] == pytest.approx(0.8) and m["async/staleness_max"] == 2.0
    assert staleness_metrics([], 4) == {"async/staleness_mean": 0.0, "async/staleness_max": 0.0}
    with pytest.raises(ContractError, match="newer than the trainer"):
        staleness_metrics([5], 4)


def test_pending_requests_round_trip_and_bad_state_is_named():
    reqs = _source().next_requests(2)
    assert requests_from_state(requests_state(reqs)) == reqs
    from agentrl.errors import CheckpointError

    with pytest.raises(CheckpointError, match="pending request 0"):
        requests_from_state([{"task_id": "x"}])


@pytest.mark.parametrize("override, needle", [
    (["controller.max_staleness=-1"], "controller.max_staleness=-1"),
    (["controller.mode=async", "env.group_size=9", "rollout.max_num_seqs=4", "rollout.num_engines=2"],
     "env.group_size=9 larger than rollout.num_engines * rollout.max_num_seqs = 2 * 4 = 8"),
    (["controller.partial_rollout=pause"], "controller.partial_rollout='pause'"),
    (["controller.mode=fast"], "controller.mode='fast'"),
])
def test_controller_config_errors_name_the_values(override, needle):
    with pytest.raises(ConfigError) as exc:
        load_default_config(override)
    assert needle in str(exc.value)


def test_controller_defaults():
    c = load_default_config().controller
    assert (c.mode, c.max_staleness, c.partial_rollout) == ("sync", 1, "continue")
    assert load_default_config(["controller.mode=sync", "env.group_size=9", "rollout.max_num_seqs=4"])  # sync: no bound


class _FakeStream:
    """Stand-in for ``StreamingEnginePool``: each submitted request finishes after a random
    number of collects, its turn tagged with the version current at its start and at its
    end (a partial rollout across a load)."""

    engines_lost = 0

    def __init__(self, run, rng: random.Random) -> None:
        self.run, self.rng, self.running = run, rng, {}

    def stream_start(self, policy_version):
        pass

    def stream_submit(self, reqs):
        for r in reqs:
            self.running[r.episode_id] = [r, self.rng.choice([1, 1, 2, 8]), self.run.policy_version]

    def in_flight(self):
        return len(self.running)

    def collect(self, wait_s):
        out = []
        for eid, item in list(self.running.items()):
            item[1] -= 1
            if item[1] <= 0:
                del self.running[eid]
                out.append(_episode(item[0], [item[2], self.run.policy_version]))
        return out, []


@pytest.mark.parametrize("k", [0, 1, 2])
def test_simulated_run_never_trains_a_row_older_than_k_and_each_group_once(k):
    from types import SimpleNamespace

    from agentrl.driver.stream_source import _Streamer

    B = 3
    run = SimpleNamespace(policy_version=0, tasks=_source(), cfg=load_default_config([f"controller.max_staleness={k}"]))
    run.pool = _FakeStream(run, random.Random(k))
    buf = GroupBuffer(B, k)
    streamer = _Streamer(run, buf)
    trained: list[str] = []
    for _ in range(12):
        dropped: list = []
        groups = streamer.take_fresh(B, dropped)
        assert len(groups) >= B and not dropped  # the admission rule leaves nothing to drop
        for g in groups:
            assert g.complete and run.policy_version - g.oldest_version() <= k
        trained += [g.group_id for g in groups]
        assert len(buf.groups) + buf.in_update <= (k + 1) * B
        for _ in range(3):
            streamer.pump(0.0)  # the update runs while the engines go on
        run.policy_version += 1
        buf.release()
    assert len(trained) == len(set(trained))


def test_a_stale_group_is_dropped_at_consumption_and_its_retry_trained_instead():
    from types import SimpleNamespace

    from agentrl.driver.stream_source import _Streamer

    run = SimpleNamespace(policy_version=5, tasks=_source(), cfg=load_default_config(["controller.max_staleness=1"]))
    run.pool = _FakeStream(run, random.Random(0))
    run.pool.rng = SimpleNamespace(choice=lambda xs: 2)  # every request finishes at its second collect
    buf = GroupBuffer(groups_per_update=1, max_staleness=1)
    streamer = _Streamer(run, buf)
    streamer.pump(0.0)  # admits 2 groups at version 5
    old = next(iter(buf.groups.values()))
    for eid, item in run.pool.running.items():  # the first group's engine reports tokens of version 3
        if item[0].group_id == old.group_id:
            item[2] = 3
    dropped: list = []
    (trained,) = streamer.take_fresh(1, dropped)
    assert [g.group_id for g in dropped] == [old.group_id] and trained.group_id != old.group_id
    assert [r.attempt for r in buf.pending[0]] == [1, 1] and buf.pending[0][0].group_id == old.group_id
    buf.release()
    streamer.pump(0.0)
    streamer.pump(0.0)
    (again,) = streamer.take_fresh(1, dropped)
    assert again.group_id == old.group_id and {e.episode_id.endswith("/a1") for e in again.episodes()} == {True}


@pytest.mark.parametrize("k", [0, 1])
def test_dynamic_sampling_refills_with_further_groups_within_the_bound(k):
    """Every group of the stand-in stream has equal rewards, so dynamic sampling filters all
    of them: each update takes B groups and refills max_refill_rounds times (the loop's one
    refill, ``take_update``, over the streaming source); the filtered groups free their slots
    at once, so the refills do not wait for ever (k = 0 too)."""
    from types import SimpleNamespace

    from agentrl.driver.loop import take_update
    from agentrl.driver.stream_source import StreamSource

    B, rounds = 2, 2
    cfg = load_default_config([f"controller.max_staleness={k}", "algorithm.dynamic_sampling=true",
                               f"algorithm.max_refill_rounds={rounds}", f"env.tasks_per_iteration={B}"])
    run = SimpleNamespace(policy_version=0, tasks=_source(), cfg=cfg)
    run.pool = _FakeStream(run, random.Random(1))
    source = StreamSource(run, None)
    buf, streamer = source.buf, source.streamer
    calls = {"n": 0}
    pump = streamer.pump

    def bounded_pump(wait_s):
        calls["n"] += 1
        assert calls["n"] < 2000, "the update waits for groups that can never be admitted"
        pump(wait_s)

    streamer.pump = bounded_pump
    seen: list[str] = []
    for _ in range(3):
        taken, refills = take_update(run, source, {})
        groups = source.groups
        assert refills == rounds and len(groups) == B * (1 + rounds) and not source.dropped and not taken.dropped
        assert len(taken.episodes) == sum(len(g.episodes()) for g in groups)
        assert all(g.complete and run.policy_version - g.oldest_version() <= k for g in groups)
        seen += [g.group_id for g in groups]
        run.policy_version += 1
        buf.release()
    assert len(seen) == len(set(seen))
