"""TaskSource with a skip set (``env.difficulty_filter``): the unfiltered order minus the
skipped tasks, resumable mid-epoch with the skip set in the checkpoint, and unchanged
(order and state) while no skip set was given."""

import json

import pytest

from agentrl.errors import CheckpointError, ConfigError
from agentrl.tasks import TaskSource

IDS = [f"T/{i}" for i in range(10)]
SKIP = {"T/1", "T/4", "T/5", "T/8"}


def _positions(src: TaskSource, per_iter: int) -> list[tuple[str, int]]:
    """(task id, position) of each group handed out by one ``next_requests`` call."""
    reqs = src.next_requests(per_iter)[:: src.group_size]
    return [(r.task_id, int(r.group_id.rsplit("@", 1)[1])) for r in reqs]


def test_skip_set_takes_the_unfiltered_order_minus_the_skipped_tasks_at_their_positions():
    plain = TaskSource("e", IDS, seed=5, group_size=2)
    unfiltered = [(plain.task_at(p)[0], p) for p in range(40)]
    src = TaskSource("e", IDS, seed=5, group_size=2)
    src.set_skip(SKIP, policy_version=0, iteration=0)
    got = [x for _ in range(6) for x in _positions(src, 4)]  # 24 groups: across epoch boundaries
    assert got == [x for x in unfiltered if x[0] not in SKIP][:24]
    assert src.cursor == got[-1][1] + 1  # moved past the skipped positions too
    req = src.next_requests(1)[0]  # positions (env seed, group id) are those of the unfiltered order
    assert req.seed == int(req.group_id.rsplit("@", 1)[1]) and req.task_id not in SKIP


def test_resume_mid_epoch_skips_exactly_what_the_uninterrupted_run_skipped():
    """The skip set changes after iteration 2 (a re-profile); a checkpoint after iteration 3
    (mid-epoch) resumes into the same requests as the run that was never stopped."""
    def run(src: TaskSource, iterations: range) -> list:
        out = []
        for it in iterations:
            src.iteration = it
            if it == 2:
                src.set_skip({"T/0", "T/2"}, policy_version=2, iteration=2)
            out.append([r.episode_id for r in src.next_requests(3)])
        return out

    first = TaskSource("e", IDS, seed=1, group_size=2, run_id="r")
    first.set_skip(SKIP, policy_version=0, iteration=0)
    straight = run(first, range(7))

    a = TaskSource("e", IDS, seed=1, group_size=2, run_id="r")
    a.set_skip(SKIP, policy_version=0, iteration=0)
    head = run(a, range(4))
    state = json.loads(json.dumps(a.state_dict()))  # as the checkpoint stores it
    assert state["skip"] == {"skip_task_ids": ["T/0", "T/2"], "policy_version": 2, "iteration": 2}
    assert 0 < state["cursor"] % len(IDS)  # mid-epoch
    b = TaskSource("e", IDS, seed=1, group_size=2, run_id="r")
    b.load_state_dict(state)
    assert b.skip == a.skip
    assert head + run(b, range(4, 7)) == straight


def test_no_skip_set_leaves_order_and_state_as_before():
    a, b = TaskSource("e", IDS, seed=0, group_size=4), TaskSource("e", IDS, seed=0, group_size=4)
    assert a.state_dict() == {"cursor": 0, "seed": 0, "num_tasks": 10} and a.skip is None
    b.set_skip(set(), policy_version=0, iteration=0)  # an empty set (the all-filtered fallback) changes nothing
    assert [r.episode_id for r in a.next_requests(13)] == [r.episode_id for r in b.next_requests(13)]
    assert set(a.state_dict()) == {"cursor", "seed", "num_tasks"} and b.state_dict()["skip"]["skip_task_ids"] == []
    c = TaskSource("e", IDS, seed=0, group_size=4)
    c.set_skip({"T/3"}, policy_version=1, iteration=1)
    c.load_state_dict(TaskSource("e", IDS, seed=0, group_size=4).state_dict())  # a record without a skip set
    assert c.skip is None and "T/3" in {r.task_id for r in c.next_requests(10)}


def test_bad_skip_sets_and_records_are_errors():
    src = TaskSource("e", IDS, seed=0, group_size=1)
    with pytest.raises(ConfigError, match=r"'T/99'.*not in"):
        src.set_skip({"T/99"}, policy_version=0, iteration=0)
    with pytest.raises(ConfigError, match="all 10 tasks"):
        src.set_skip(IDS, policy_version=0, iteration=0)
    state = src.state_dict()
    with pytest.raises(CheckpointError, match="expected the keys"):
        src.load_state_dict({**state, "skip": {"skip_task_ids": []}})
    with pytest.raises(CheckpointError, match="all 10 tasks"):
        src.load_state_dict({**state, "skip": {"skip_task_ids": IDS, "policy_version": 0, "iteration": 0}})
