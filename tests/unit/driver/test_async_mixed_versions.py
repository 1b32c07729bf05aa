"""Credit ignores policy versions within a group: one group whose members were sampled under two policy
versions (a partial rollout: member 1's first turn spans a weight update, its second turn is
all new-version tokens) gets exactly the credit it would get had every token come from one
version. GiGPO's anchor groups are keyed by group and anchor state, never by version or
engine; the turn critic reads its value at each turn's boundary, and a turn that spans two
versions is still one turn with one value. Only the rows' versions differ: each row carries
its oldest token's version (the sample's staleness), each token its own.

``values_fn`` here is a deterministic stand-in for the critic model (a function of the tokens
it is asked about); the real critic trains in
tests/integration/cluster/test_train_loop.py::test_turn_critic_trains_policy_and_critic."""

from __future__ import annotations

import copy

import numpy as np
import pytest

from agentrl.config import AlgorithmConfig
from agentrl.credit import assign_credit
from agentrl.types import Episode, SamplingRecord, TerminationReason, Turn


def _turn(prompt, completion, versions, reward, anchor):
    return Turn(prompt_ids=prompt, completion_ids=completion, behavior_log_probs=[-0.5] * len(completion),
                policy_version=versions[0], policy_versions=list(versions), reward=reward, anchor=anchor)


def _group(mixed: bool) -> list[Episode]:
    """Two members of group ``g`` with shared anchor states; with ``mixed`` member 1's first
    turn switches from version 3 to 4 mid-completion and its second turn is version 4."""
    v0, v1 = (3, 4) if mixed else (3, 3)
    members = [
        [_turn([11, 12], [21, 22, 23], [3, 3, 3], 0.0, "start"), _turn([31], [41, 42], [3, 3], 1.0, "mid")],
        [_turn([11, 12], [24, 25, 26], [v0, v1, v1], 0.0, "start"), _turn([32], [43, 44], [v1, v1], 0.0, "mid")],
        [_turn([11, 12], [27, 28], [3, 3], 0.5, "start")],
    ]
    return [Episode(group_id="g", env_id="e", task_id="t", seed=0, turns=turns, terminated=True,
                    termination_reason=TerminationReason.ENV_TERMINATED, episode_id=f"ep{i}")
            for i, turns in enumerate(members)]


def _values_fn(asked: list):
    def values_fn(vb):  # a value per asked position, from the token there: same tokens, same values
        asked.append(vb)
        ids = vb.input_ids.numpy()
        return np.array([0.01 * int(ids[p]) for p in vb.positions.numpy()])

    return values_fn


@pytest.mark.parametrize("advantage", ["gigpo", "turn_critic"])
def test_a_group_sampled_under_two_versions_gets_the_single_version_credit(advantage):
    cfg = AlgorithmConfig(advantage=advantage)
    asked_mixed, asked_one = [], []
    mixed = assign_credit(_group(True), cfg, SamplingRecord(), values_fn=_values_fn(asked_mixed))
    one = assign_credit(_group(False), cfg, SamplingRecord(), values_fn=_values_fn(asked_one))
    assert mixed.turn_advantages.keys() == {"ep0", "ep1", "ep2"}
    for eid in mixed.turn_advantages:
        assert mixed.turn_advantages[eid] == pytest.approx(one.turn_advantages[eid], abs=0)
    assert mixed.turn_advantages["ep1"] != pytest.approx(mixed.turn_advantages["ep0"])  # the advantages say something
    np.testing.assert_array_equal(mixed.batch.advantages.numpy(), one.batch.advantages.numpy())
    np.testing.assert_array_equal(mixed.batch.input_ids.numpy(), one.batch.input_ids.numpy())
    if advantage == "turn_critic":  # asked for the same positions: one value per turn, the spanning turn too
        (vm,), (vo,) = asked_mixed, asked_one
        assert vm.positions.tolist() == vo.positions.tolist() and vm.num_positions == 5
        np.testing.assert_array_equal(mixed.value_batch.returns.numpy(), one.value_batch.returns.numpy())
    # the versions: each row its oldest token's, each sampled token its own
    assert mixed.batch.policy_versions.tolist() == [3, 3, 3]
    tok = getattr(mixed.batch, "token_policy_versions", None)
    if tok is not None:
        mask = mixed.batch.loss_mask.numpy() == 1
        assert tok.numpy()[mask].tolist() == [3] * 5 + [3, 4, 4, 4, 4] + [3, 3]


def test_credit_never_rewrites_the_token_versions():
    # the controller hands credit the buffered episodes themselves; versions stay as sampled
    group = _group(True)
    before = [[list(t.policy_versions) for t in e.turns] for e in group]
    assign_credit(copy.deepcopy(group), AlgorithmConfig(advantage="gigpo"), SamplingRecord())
    assign_credit(group, AlgorithmConfig(advantage="gigpo"), SamplingRecord())
    assert [[list(t.policy_versions) for t in e.turns] for e in group] == before
    assert group[1].policy_version_range() == (3, 4)
