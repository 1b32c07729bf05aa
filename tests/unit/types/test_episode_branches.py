"""Branches of an episode (``Turn.branch``, agentrl/types/episode.py): in ``full_history`` mode
each branch is its own token stream and trainer row (``Episode.rows``), ordered by the
branch's first turn; the methods that walk turns take ``branch``. ``Turn.tool_calls`` and
``Episode.counters`` are checked by ``validate``."""

from __future__ import annotations

import pytest

from agentrl.errors import ContractError
from agentrl.types import Episode, TerminationReason, Turn, broadcast_turn_values
from agentrl.types.rows import TurnSpan


def _interleaved(prompt_mode: str = "full_history") -> Episode:
    """Turns 0 and 2 on branch 0, turn 1 on branch 1 (a fork whose first prompt is whole)."""
    ep = Episode(group_id="g", env_id="e", task_id="t", seed=0, episode_id="ep", prompt_mode=prompt_mode)  # type: ignore[arg-type]
    ep.turns.append(Turn([1, 2, 3], [4, 5], [-0.1, -0.2], reward=0.0, policy_version=1))
    ep.turns.append(Turn([1, 2, 9, 9], [6], [-0.3], reward=0.0, branch=1, policy_version=2, tool_calls=2))
    ep.turns.append(Turn([7], [8, 10, 11], [-0.4, -0.5, -0.6], reward=1.0, policy_version=3))
    ep.termination_reason, ep.terminated = TerminationReason.ENV_TERMINATED, True
    return ep


def test_two_interleaved_branches_give_two_rows_with_their_spans_and_keys():
    ep = _interleaved()
    ep.validate()
    rows = ep.rows()
    assert [r.key for r in rows] == ["ep", "ep:b1"]
    assert rows[0].turns == (TurnSpan(0, 0, 3, 5), TurnSpan(2, 5, 6, 9)) and rows[0].length == 9
    assert rows[1].turns == (TurnSpan(1, 0, 4, 5),) and rows[1].length == 5
    assert rows[0].loss_mask() == [0, 0, 0, 1, 1, 0, 1, 1, 1]
    assert rows[1].loss_mask() == [0, 0, 0, 0, 1]
    assert ep.branches() == [0, 1] and ep.branch_turns(0) == [0, 2] and ep.branch_turns(1) == [1]


def test_training_sequences_follow_the_branch_rows():
    ep = _interleaved()
    seqs = ep.training_sequences([0.5, -1.0, 2.0])
    assert [s.episode_id for s in seqs] == ["ep", "ep:b1"]
    main, fork = seqs
    assert main.input_ids == [1, 2, 3, 4, 5, 7, 8, 10, 11]
    assert main.loss_mask == [0, 0, 0, 1, 1, 0, 1, 1, 1]
    assert main.behavior_log_probs == [-0.1, -0.2, -0.4, -0.5, -0.6]
    assert main.advantages == [0, 0, 0, 0.5, 0.5, 0, 2.0, 2.0, 2.0]
    assert main.token_policy_versions == [0, 0, 0, 1, 1, 0, 3, 3, 3] and main.policy_version == 1
    assert fork.input_ids == [1, 2, 9, 9, 6] and fork.loss_mask == [0, 0, 0, 0, 1]
    assert fork.behavior_log_probs == [-0.3] and fork.advantages == [0, 0, 0, 0, -1.0]
    assert fork.token_policy_versions == [0, 0, 0, 0, 2] and fork.policy_version == 2
    assert sum(sum(s.loss_mask) for s in seqs) == ep.num_generated_tokens() == 6


def test_per_branch_streams_and_the_all_turns_concatenation():
    ep = _interleaved()
    assert ep.token_ids(0) == [1, 2, 3, 4, 5, 7, 8, 10, 11] and ep.token_ids(1) == [1, 2, 9, 9, 6]
    assert ep.loss_mask(1) == [0, 0, 0, 0, 1] and ep.behavior_log_probs(1) == [-0.3]
    assert ep.token_policy_versions(0) == [0, 0, 0, 1, 1, 0, 3, 3, 3]
    assert broadcast_turn_values(ep, [0.5, -1.0, 2.0], branch=1) == [0, 0, 0, 0, -1.0]
    # None: every turn in turn order (all three lists aligned)
    assert ep.token_ids() == [1, 2, 3, 4, 5, 1, 2, 9, 9, 6, 7, 8, 10, 11]
    assert len(ep.loss_mask()) == len(ep.token_policy_versions()) == len(broadcast_turn_values(ep, [0, 0, 0])) == 14
    assert ep.token_ids(5) == []


def test_an_episode_without_branches_keeps_one_row_keyed_by_its_id():
    ep = _interleaved()
    for t in ep.turns:
        t.branch = 0
    rows = ep.rows()
    assert len(rows) == 1 and rows[0].key == "ep" and rows[0].length == len(ep.token_ids()) == 14
    assert rows[0].loss_mask() == ep.loss_mask() and ep.token_ids(0) == ep.token_ids()


def test_per_step_rows_are_unchanged_and_refuse_a_branch():
    ep = _interleaved("per_step")
    ep.turns[1].branch = 0
    assert [r.key for r in ep.rows()] == ["ep:0", "ep:1", "ep:2"]
    ep.validate()
    ep.turns[1].branch = 1
    with pytest.raises(ContractError, match="turn 1 has branch=1 in per_step mode"):
        ep.validate()


@pytest.mark.parametrize("field, value", [("branch", -1), ("branch", True), ("tool_calls", -2), ("tool_calls", 1.0)])
def test_a_bad_branch_or_tool_call_count_is_a_contract_error(field, value):
    ep = _interleaved()
    setattr(ep.turns[0], field, value)
    with pytest.raises(ContractError, match=f"turn {field}={value!r}; expected an int >= 0"):
        ep.validate()


@pytest.mark.parametrize("counters, pattern", [
    ({"gateway/forks": float("nan")}, r"counters\['gateway/forks'\]=nan"),
    ({"gateway/forks": "1"}, "expected a str key and a finite number"),
    ({1: 1.0}, r"counters\[1\]"),
])
def test_counters_must_be_finite_numbers_by_name(counters, pattern):
    ep = _interleaved()
    ep.counters = {"gateway/requests": 3.0}
    ep.validate()
    ep.counters = counters
    with pytest.raises(ContractError, match=pattern):
        ep.validate()
