"""Credit on an episode whose branches interleave (``Turn.branch``; turns 0 and 2 on branch 0,
turn 1 on branch 1): its rows (``[0, 2]`` then ``[1]``) are not in turn order, and every
per-row split, the critic's values read in row order, and the per-turn KL penalty must still
land on their own turn. Token ids are distinct, so a value read at a position names the token
it was read at (``_read``), and any mix-up between rows and turns shows in the numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import critics
from agentrl.config import AlgorithmConfig
from agentrl.credit import (
    assign_credit,
    critic_rows,
    reference_batch,
    split_per_row,
    split_tokens_per_row,
    turn_penalties,
)
from agentrl.credit.rows import row_order, to_stream_order
from agentrl.errors import ContractError
from agentrl.types import Episode, SamplingRecord, TerminationReason, Turn, ValueBatch

# Turn 0 (branch 0): prompt 101 102 103, completion 111 112        reward  0.5
# Turn 1 (branch 1): prompt 201 202 203 204, completion 211        reward -0.25  (the fork's whole prompt)
# Turn 2 (branch 0): observation 301, completion 311 312 313       reward  1.0
# Row 0 (branch 0): 101 102 103 111 112 301 311 312 313   (turns 0, 2)
# Row 1 (branch 1): 201 202 203 204 211                    (turn 1)
# Sampled tokens in stream (turn) order: j0 111, j1 112 | j2 211 | j3 311, j4 312, j5 313.
REWARDS = [0.5, -0.25, 1.0]
GAMMA, LAM = 0.9, 0.8


def _episode() -> Episode:
    turns = [
        Turn([101, 102, 103], [111, 112], [-0.1, -0.2], reward=REWARDS[0]),
        Turn([201, 202, 203, 204], [211], [-0.3], reward=REWARDS[1], branch=1),
        Turn([301], [311, 312, 313], [-0.4, -0.5, -0.6], reward=REWARDS[2]),
    ]
    return Episode(group_id="g", env_id="e", task_id="t", seed=0, turns=turns, episode_id="ep",
                   terminated=True, termination_reason=TerminationReason.ENV_TERMINATED)


def _read(token_id: int) -> float:
    """The stand-in critic's value at a position: the id of the token it is read at, / 1000."""
    return token_id / 1000.0


def _values_fn(asked: list[ValueBatch]):
    def values_fn(vb: ValueBatch) -> list[float]:
        asked.append(vb)
        ids, pos = vb.input_ids.tolist(), vb.positions.tolist()
        return [_read(ids[rows.start + p]) for rows, ps in zip(vb.row_slices(), vb.position_slices())
                for p in pos[ps]]
    return values_fn


# What each estimator must get, in stream order: turn k's value is read at turn k's boundary
# (its last prompt token); sampled token j's value at the token before it.
TURN_VALUES = [_read(103), _read(204), _read(301)]
TOKEN_VALUES = [_read(103), _read(111), _read(204), _read(301), _read(311), _read(312)]


def test_the_rows_hold_turns_0_2_and_1():
    ep = _episode()
    assert [[s.turn for s in r.turns] for r in ep.rows()] == [[0, 2], [1]]
    assert row_order(ep, "turn") == [0, 2, 1]
    assert row_order(ep, "token") == [0, 1, 3, 4, 5, 2]


def test_per_row_splits_give_each_row_its_own_turns_values():
    ep = _episode()
    assert split_per_row(ep, [10.0, 20.0, 30.0]) == [[10.0, 30.0], [20.0]]
    # per sampled token in stream order: turn 0 -> 10, 11; turn 1 -> 20; turn 2 -> 30, 31, 32
    assert split_tokens_per_row(ep, [10.0, 11.0, 20.0, 30.0, 31.0, 32.0]) == [[10.0, 11.0, 30.0, 31.0, 32.0], [20.0]]


@pytest.mark.parametrize("level, stream", [("turn", TURN_VALUES), ("token", TOKEN_VALUES)])
def test_critic_positions_read_in_row_order_go_back_to_stream_order(level, stream):
    ep = _episode()
    rows = critic_rows([ep], level=level)
    read = [_read(row.input_ids[p]) for row in rows for p in row.positions]  # row order
    assert read == [stream[i] for i in row_order(ep, level)]
    np.testing.assert_array_equal(to_stream_order(ep, read, level), stream)
    # stream-order targets handed to critic_rows sit on the positions they were read at
    with_targets = critic_rows([ep], returns=[stream], old_values=[stream], level=level)
    for row in with_targets:
        assert row.returns == row.old_values == [_read(row.input_ids[p]) for p in row.positions]


def test_to_stream_order_refuses_a_wrong_count():
    with pytest.raises(ContractError, match="got 2 values in row order for episode ep; expected 3"):
        to_stream_order(_episode(), [0.0, 0.0], "turn")


def test_turn_critic_gets_each_turns_own_value():
    ep = _episode()
    asked: list[ValueBatch] = []
    cfg = AlgorithmConfig(advantage="turn_critic", gamma=GAMMA, lam=LAM)
    res = assign_credit([ep], cfg, SamplingRecord(), values_fn=_values_fn(asked))
    assert asked[0].positions.tolist() == [2, 5, 3]  # row 0: turns 0, 2; row 1: turn 1
    adv, ret = critics.turn_critic_advantages([REWARDS], [TURN_VALUES], gamma=GAMMA, lam=LAM)
    assert res.turn_advantages["ep"] == pytest.approx(adv[0].tolist(), abs=1e-12)
    # the critic's batch is in row order: its targets and old values follow its positions
    vb = res.value_batch
    np.testing.assert_allclose(vb.returns.double().numpy(), ret[0][[0, 2, 1]], atol=1e-6)
    np.testing.assert_allclose(vb.old_values.double().numpy(), [TURN_VALUES[k] for k in (0, 2, 1)], atol=1e-6)
    # each row's sampled tokens carry their own turn's advantage
    b = res.batch
    mask, a = b.loss_mask.numpy(), b.advantages.double().numpy()
    want = [adv[0][0]] * 2 + [adv[0][2]] * 3 + [adv[0][1]]
    np.testing.assert_allclose(a[mask == 1], want, atol=1e-6)


def test_gae_gets_each_tokens_own_value():
    ep = _episode()
    asked: list[ValueBatch] = []
    cfg = AlgorithmConfig(advantage="gae", token_gamma=GAMMA, token_lam=LAM)
    res = assign_credit([ep], cfg, SamplingRecord(), values_fn=_values_fn(asked))
    assert asked[0].positions.tolist() == [2, 3, 5, 6, 7, 3]
    adv, ret = critics.token_critic_advantages([[2, 1, 3]], [REWARDS], [TOKEN_VALUES], gamma=GAMMA, lam=LAM)
    adv, ret = adv[0], ret[0]
    order = row_order(ep, "token")  # [0, 1, 3, 4, 5, 2]
    vb = res.value_batch
    np.testing.assert_allclose(vb.returns.double().numpy(), ret[order], atol=1e-6)
    np.testing.assert_allclose(vb.old_values.double().numpy(), np.asarray(TOKEN_VALUES)[order], atol=1e-6)
    b = res.batch
    mask, a = b.loss_mask.numpy(), b.advantages.double().numpy()
    np.testing.assert_allclose(a[mask == 1], adv[order], atol=1e-6)
    assert res.turn_advantages["ep"] == pytest.approx([adv[0:2].mean(), adv[2], adv[3:6].mean()], abs=1e-12)


def test_turn_penalties_sum_each_tokens_kl_into_its_own_turn():
    ep = _episode()
    scored, batch = reference_batch([ep], SamplingRecord())
    assert batch.num_rows == 2
    # per-token KL = 1 .. 6 on the loss tokens in packed (row) order: row 0 holds turn 0's
    # tokens (1, 2) and turn 2's (3, 4, 5); row 1 turn 1's (6)
    k = torch.zeros(batch.num_tokens)
    k[batch.loss_mask > 0] = torch.arange(1.0, 7.0)
    assert turn_penalties(scored, batch, k, coef=0.5) == {"ep": [0.5 * 3, 0.5 * 6, 0.5 * 12]}
