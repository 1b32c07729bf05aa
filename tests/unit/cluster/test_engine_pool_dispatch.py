"""The engine pool's pure bookkeeping: how requests are split over engines, how a lost
engine's requests become aborted episodes and retries, and that an aborted episode is
counted and never scored (rollout metrics, credit)."""

from __future__ import annotations

import pytest
from ray.exceptions import ActorDiedError

from agentrl.cluster.engines.dispatch import (abort_requests, assign_requests, describe_engine, merge_rollout_metrics,
                                             split_contiguous)
from agentrl.config import AlgorithmConfig
from agentrl.credit import assign_credit
from agentrl.rollout.loop import rollout_metrics
from agentrl.types import Episode, EpisodeRequest, SamplingRecord, TerminationReason, Turn


def _req(group: str, index: int, attempt: int = 0) -> EpisodeRequest:
    return EpisodeRequest(env_id="agentrl/GuessNumber-v0", task_id=group.split("@")[0], seed=3, group_id=group,
                          sample_seed=100 + index, run_id="run-x", iteration=2, index=index, attempt=attempt)


@pytest.mark.parametrize("n, loads, want", [
    (8, [0, 0], [4, 4]),
    (7, [0, 0], [4, 3]),          # ties go to the lower position
    (6, [0, 4], [5, 1]),          # water-filling: the loaded engine gets only what evens them out
    (2, [0, 5, 5], [2, 0, 0]),
    (10, [0, 0, 3], [5, 4, 1]),
    (0, [1, 2], [0, 0]),
    (5, [7], [5]),
])
def test_assign_requests_evens_out_in_flight_counts(n, loads, want):
    counts = assign_requests(n, loads)
    assert counts == want and sum(counts) == n
    final = [a + b for a, b in zip(loads, counts)]
    # no request could move to a less loaded engine: every engine that got one ends at most
    # one above the least loaded
    assert all(f - min(final) <= 1 for f, c in zip(final, counts) if c)


def test_assign_requests_refuses_no_engine_and_negative_counts():
    with pytest.raises(ValueError, match="no engine"):
        assign_requests(3, [])
    with pytest.raises(ValueError, match="num_requests=-1"):
        assign_requests(-1, [0])


def test_split_contiguous_keeps_request_order_and_groups_together():
    reqs = [_req(f"t{g}@{g}", i) for g in range(4) for i in range(2)]  # 4 groups of 2
    parts = split_contiguous(reqs, assign_requests(len(reqs), [0, 0]))
    assert [r for p in parts for r in p] == reqs  # nothing lost, nothing reordered
    assert [{r.group_id for r in p} for p in parts] == [{"t0@0", "t1@1"}, {"t2@2", "t3@3"}]
    with pytest.raises(ValueError, match="sum to 3"):
        split_contiguous(reqs, [1, 2])


def test_abort_requests_flags_the_lost_episodes_and_retries_with_the_next_attempt():
    reqs = [_req("t0@0", 0), _req("t0@0", 1, attempt=1)]
    node = {"node_id": "abc123", "node_ip": "10.0.0.7"}
    exc = ActorDiedError()
    aborted, retries = abort_requests(reqs, 1, node, exc, prompt_mode="per_step")
    assert [e.episode_id for e in aborted] == [r.episode_id for r in reqs]
    for ep, req, retry in zip(aborted, reqs, retries):
        ep.validate()
        assert ep.termination_reason is TerminationReason.ABORTED and ep.is_error
        assert ep.total_reward is None and not ep.terminated and not ep.truncated and ep.turns == []
        assert (ep.group_id, ep.task_id, ep.seed, ep.prompt_mode) == (req.group_id, req.task_id, req.seed, "per_step")
        assert ep.error["type"] == "ActorDiedError"
        assert "rollout engine 1 on node abc123 (10.0.0.7)" in ep.error["message"]
        assert (ep.error["engine_index"], ep.error["node_id"], ep.error["node_ip"]) == ("1", "abc123", "10.0.0.7")
        assert retry.attempt == req.attempt + 1 and retry.episode_id != req.episode_id
        # the same request otherwise: same group, index, env seed and sampling seed
        assert (retry.group_id, retry.index, retry.seed, retry.sample_seed) == (req.group_id, req.index, req.seed, req.sample_seed)
    assert retries[0].episode_id.endswith("/t0@0/0/a1") and retries[1].episode_id.endswith("/t0@0/1/a2")


def test_describe_engine_without_node():
    assert describe_engine(3, None) == "rollout engine 3 (node unknown)"


def test_merge_rollout_metrics_adds_counts_and_keeps_the_last_engine_count():
    a = {"cluster/engines": 2.0, "cluster/engines_lost": 1.0, "rollout/aborted_episodes": 3.0,
         "rollout/engine_0_episodes": 4.0, "rollout/engine_0_s": 1.5, "cluster/replacement_wait_s": 0.0}
    b = {"cluster/engines": 1.0, "cluster/engines_lost": 1.0, "rollout/aborted_episodes": 2.0,
         "rollout/engine_0_episodes": 2.0, "rollout/engine_0_s": 0.5, "cluster/replacement_wait_s": 2.0}
    m = merge_rollout_metrics(a, b)
    assert m == {"cluster/engines": 1.0, "cluster/engines_lost": 2.0, "rollout/aborted_episodes": 5.0,
                 "rollout/engine_0_episodes": 6.0, "rollout/engine_0_s": 2.0, "cluster/replacement_wait_s": 2.0}


def _scored(group: str, index: int, reward: float) -> Episode:
    req = _req(group, index, attempt=1)
    ep = Episode(group_id=group, env_id=req.env_id, task_id=req.task_id, seed=req.seed, episode_id=req.episode_id,
                 turns=[Turn(prompt_ids=[1, 2], completion_ids=[5, 6], behavior_log_probs=[-0.5, -0.5], reward=reward)],
                 termination_reason=TerminationReason.ENV_TERMINATED, terminated=True)
    return ep


def test_aborted_episodes_are_counted_and_excluded_from_credit_without_dropping_their_group():
    lost = [_req("a@0", 0), _req("b@1", 0)]
    aborted, _ = abort_requests(lost, 0, {"node_id": "n0", "node_ip": "10.0.0.1"}, ActorDiedError())
    regenerated = [_scored("a@0", 0, 1.0), _scored("a@0", 1, 0.0), _scored("b@1", 0, 1.0), _scored("b@1", 1, 0.0)]
    episodes = aborted + regenerated
    m = rollout_metrics(episodes)
    assert m["rollout/aborted_episodes"] == 2 and m["rollout/termination/aborted"] == 2
    assert m["rollout/scored_episodes"] == 4 and m["rollout/reward_mean"] == 0.5  # aborted never scored 0
    for policy in ("drop_episode", "drop_group"):
        with_aborted = assign_credit(episodes, AlgorithmConfig(error_policy=policy), SamplingRecord())
        without = assign_credit(regenerated, AlgorithmConfig(error_policy=policy), SamplingRecord())
        assert with_aborted.metrics["filter/aborted_episodes"] == 2
        assert with_aborted.metrics["filter/infra_errors"] == 0
        assert not set(with_aborted.turn_advantages) & {e.episode_id for e in aborted}
        # the regenerated groups are whole: same advantages as without the aborted attempts
        assert with_aborted.turn_advantages == without.turn_advantages and with_aborted.batch.num_rows == 4


def test_aborted_attempts_leave_the_rollout_means_unchanged():
    """An aborted attempt (no turns, never ran to the end) is counted in
    rollout/aborted_episodes only: the per-episode means are those of the episodes that ran."""
    lost = [_req("a@0", 0), _req("b@1", 0)]
    aborted, _ = abort_requests(lost, 0, {"node_id": "n0", "node_ip": "10.0.0.1"}, ActorDiedError())
    regenerated = [_scored("a@0", 0, 1.0), _scored("a@0", 1, 0.0), _scored("b@1", 0, 1.0), _scored("b@1", 1, 0.0)]
    with_aborted, without = rollout_metrics(aborted + regenerated), rollout_metrics(regenerated)
    for key in ("rollout/turns_mean", "rollout/reward_mean", "rollout/success_rate", "rollout/response_length_mean",
                "rollout/invalid_action_rate", "rollout/generated_tokens"):
        assert with_aborted[key] == without[key], key
    assert with_aborted["rollout/turns_mean"] == 1.0


def test_whole_groups_moves_each_cut_to_the_end_of_the_group_it_cuts():
    from agentrl.cluster.engines.dispatch import whole_groups

    gids = ["a", "a", "a", "b", "b", "b", "c", "c"]
    assert whole_groups([4, 4], gids) == [6, 2]  # a|b cut at 4 moves to b's end
    assert whole_groups([3, 3, 2], gids) == [3, 3, 2]  # already on boundaries
    assert whole_groups([1, 1, 6], gids) == [3, 3, 2]  # each cut moves to the end of the group it cuts
    assert whole_groups([7, 1], gids) == [8, 0]  # a cut inside the last group: the first engine takes it
    assert whole_groups([8, 0], gids) == [8, 0] and whole_groups([0, 8], gids) == [0, 8]
    assert sum(whole_groups([2, 2, 2, 2], gids)) == len(gids)
