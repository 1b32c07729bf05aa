"""TaskSource order is deterministic and resumable across epoch boundaries (case C11, the task part)."""

import dataclasses

import pytest

from agentrl.errors import ConfigError
from agentrl.tasks import TaskSource

IDS = [f"T/{i}" for i in range(10)]


def _order(src, iters, per_iter):
    return [[r.task_id for r in src.next_requests(per_iter)][:: src.group_size] for _ in range(iters)]


def test_each_epoch_visits_every_task_once():
    src = TaskSource("e", IDS, seed=3, group_size=2)
    first, second = _order(src, 1, 10)[0], _order(src, 1, 10)[0]
    assert sorted(first) == sorted(IDS) and sorted(second) == sorted(IDS)
    assert first != second  # a new permutation per epoch


@pytest.mark.parametrize("per_iter, split_at", [(4, 3), (5, 2)])  # (5, 2): checkpoint exactly on the epoch boundary
def test_C11_resume_gives_the_same_task_order(per_iter, split_at):
    straight = _order(TaskSource("e", IDS, seed=0, group_size=4), 6, per_iter)
    a = TaskSource("e", IDS, seed=0, group_size=4)
    head = _order(a, split_at, per_iter)
    b = TaskSource("e", IDS, seed=0, group_size=4)
    b.load_state_dict(a.state_dict())
    tail = _order(b, 6 - split_at, per_iter)
    assert head + tail == straight


def test_groups_share_group_id_and_differ_in_sampling_seed():
    reqs = TaskSource("e", IDS, seed=0, group_size=4).next_requests(2)
    assert len(reqs) == 8
    assert len({r.group_id for r in reqs[:4]}) == 1 and reqs[0].group_id != reqs[4].group_id
    assert len({r.sample_seed for r in reqs}) == 8


def test_mismatched_checkpoint_and_empty_split_are_errors():
    a = TaskSource("e", IDS, seed=0, group_size=1)
    with pytest.raises(ConfigError, match="does not match"):
        TaskSource("e", IDS[:5], seed=0, group_size=1).load_state_dict(a.state_dict())
    with pytest.raises(ConfigError, match="no tasks"):
        TaskSource("e", [], seed=0, group_size=1)


def test_episode_ids_are_deterministic_from_run_iteration_request_and_attempt():
    a = TaskSource("e", IDS, seed=0, group_size=2, run_id="run-1")
    a.iteration = 3
    reqs = a.next_requests(2)
    assert [r.episode_id for r in reqs] == [
        f"run-1/it3/{reqs[0].task_id}@0/0/a0", f"run-1/it3/{reqs[0].task_id}@0/1/a0",
        f"run-1/it3/{reqs[2].task_id}@1/0/a0", f"run-1/it3/{reqs[2].task_id}@1/1/a0",
    ]
    refill = a.next_requests(1)  # a dynamic-sampling refill in the same iteration: new positions, new ids
    assert refill[0].episode_id == f"run-1/it3/{refill[0].task_id}@2/0/a0"
    assert not {r.episode_id for r in refill} & {r.episode_id for r in reqs}
    # A resume from a checkpoint taken before this iteration re-issues the same ids.
    b = TaskSource("e", IDS, seed=0, group_size=2, run_id="run-1")
    b.iteration = 3
    assert [r.episode_id for r in b.next_requests(3)] == [r.episode_id for r in reqs + refill]
    # Another run, iteration or attempt gives another id.
    other = TaskSource("e", IDS, seed=0, group_size=2, run_id="run-2").next_requests(1)[0]
    assert other.episode_id.startswith("run-2/it0/")
    assert dataclasses.replace(reqs[0], attempt=1).episode_id == f"run-1/it3/{reqs[0].task_id}@0/0/a1"


def test_long_episode_ids_stay_within_the_store_limit_and_distinct():
    from agentrl.types import EPISODE_ID_MAX_LEN

    src = TaskSource("e", ["x" * 190 + "a", "x" * 190 + "b"], seed=0, group_size=2, run_id="r" * 60)
    ids = [r.episode_id for r in src.next_requests(2)]
    assert all(len(i) <= EPISODE_ID_MAX_LEN for i in ids) and len(set(ids)) == 4
    again = TaskSource("e", ["x" * 190 + "a", "x" * 190 + "b"], seed=0, group_size=2, run_id="r" * 60)
    assert [r.episode_id for r in again.next_requests(2)] == ids
