"""The ``gae`` estimator's credit path with a stand-in ``values_fn`` (known values instead of
the critic model): known token advantages on a hand-built 2-turn episode, put on the tokens
by ``assign_credit`` in both prompt modes, the critic's own batch, and the critic rows that
read a value before every sampled token."""

from __future__ import annotations

import numpy as np
import pytest

import critics
from agentrl.config import AlgorithmConfig
from agentrl.credit import assign_credit, critic_rows, pack_batch, shaped_turn_rewards
from agentrl.errors import ConfigError, ContractError
from agentrl.types import ValueBatch
from agentrl.types import Episode, SamplingRecord, TerminationReason, Turn

# Stream (both modes): PPP CC OO CCC
#   turn 0: prompt [11, 12, 13], completion [21, 22]      reward 0.5
#   turn 1: observation [31, 32], completion [41, 42, 43]  reward 1.0
# Sampled tokens j = 0..4 (stream positions 3, 4, 7, 8, 9), values V_j = 0.1 .. 0.5.
# Rewards on each turn's last sampled token: r = [0, 0.5, 0, 0, 1.0].
# gamma = 0.9, lam = 0.8 (gamma * lam = 0.72); the observation tokens are skipped, V_5 = 0:
#   delta_4 = 1.0 + 0.9*0   - 0.5 = 0.5    A_4 = 0.5
#   delta_3 = 0   + 0.9*0.5 - 0.4 = 0.05   A_3 = 0.05 + 0.72*0.5      = 0.41
#   delta_2 = 0   + 0.9*0.4 - 0.3 = 0.06   A_2 = 0.06 + 0.72*0.41     = 0.3552
#   delta_1 = 0.5 + 0.9*0.3 - 0.2 = 0.57   A_1 = 0.57 + 0.72*0.3552   = 0.825744
#   delta_0 = 0   + 0.9*0.2 - 0.1 = 0.08   A_0 = 0.08 + 0.72*0.825744 = 0.67453568
# (delta_1 bootstraps from V_2, turn 1's first token, across the observation.)
# returns = A + V = 0.77453568, 1.025744, 0.6552, 0.81, 1.0
GAMMA, LAM = 0.9, 0.8
VALUES = [0.1, 0.2, 0.3, 0.4, 0.5]
WANT_ADV = [0.67453568, 0.825744, 0.3552, 0.41, 0.5]
WANT_RET = [0.77453568, 1.025744, 0.6552, 0.81, 1.0]


def _episode(mode: str, episode_id: str = "ep") -> Episode:
    turns = [
        Turn(prompt_ids=[11, 12, 13], completion_ids=[21, 22], behavior_log_probs=[-0.1, -0.2], reward=0.5),
        Turn(prompt_ids=[31, 32], completion_ids=[41, 42, 43], behavior_log_probs=[-0.3] * 3, reward=1.0),
    ]
    return Episode(group_id="g", env_id="e", task_id="t", seed=0, turns=turns, prompt_mode=mode,
                   episode_id=episode_id, terminated=True, termination_reason=TerminationReason.ENV_TERMINATED)


@pytest.mark.parametrize("mode", ["full_history", "per_step"])
def test_known_token_advantages_on_the_tokens_in_both_prompt_modes(mode):
    ep = _episode(mode)
    cfg = AlgorithmConfig(advantage="gae", token_gamma=GAMMA, token_lam=LAM)
    asked = []

    def values_fn(vb):  # the critic's values at the ValueBatch's positions
        asked.append(vb)
        return np.array(VALUES)

    res = assign_credit([ep], cfg, SamplingRecord(), values_fn=values_fn)
    assert len(asked) == 1 and asked[0].num_positions == 5 and asked[0].returns is None
    vb = res.value_batch  # the critic's own batch: returns as targets, rollout values as old_values
    np.testing.assert_allclose(vb.returns.double().numpy(), WANT_RET, rtol=0, atol=1e-6)
    np.testing.assert_allclose(vb.old_values.double().numpy(), VALUES, rtol=0, atol=1e-6)
    assert vb.positions.tolist() == asked[0].positions.tolist()
    assert res.metrics["critic/values_mean_rollout"] == pytest.approx(np.mean(VALUES), abs=1e-12)
    adv, ret = critics.token_critic_advantages([[2, 3]], [shaped_turn_rewards(ep, cfg)], [VALUES],
                                               gamma=cfg.token_gamma, lam=cfg.token_lam)
    np.testing.assert_allclose(adv[0], WANT_ADV, rtol=0, atol=1e-12)
    np.testing.assert_allclose(ret[0], WANT_RET, rtol=0, atol=1e-12)

    batch = res.batch
    mask = batch.loss_mask.numpy()
    a = batch.advantages.double().numpy()
    np.testing.assert_allclose(a[mask == 1], WANT_ADV, rtol=0, atol=1e-6)  # float32 in the batch
    assert np.all(a[mask == 0] == 0.0)  # exactly 0 on prompt and observation tokens
    if mode == "full_history":
        assert batch.num_rows == 1 and mask.tolist() == [0, 0, 0, 1, 1, 0, 0, 1, 1, 1]
    else:
        assert batch.num_rows == 2 and mask.tolist() == [0, 0, 0, 1, 1] + [0, 0, 1, 1, 1]
    assert batch.input_ids.tolist() == [11, 12, 13, 21, 22, 31, 32, 41, 42, 43]
    # the replay store gets the mean over each turn's sampled tokens
    assert res.turn_advantages["ep"] == pytest.approx([(0.67453568 + 0.825744) / 2, (0.3552 + 0.41 + 0.5) / 3], abs=1e-12)
    assert res.metrics["tokens/trained"] == 5.0
    assert res.metrics["advantages/mean"] == pytest.approx(np.mean(WANT_ADV), abs=1e-12)
    assert res.metrics["advantages/abs_max"] == pytest.approx(0.825744, abs=1e-12)


def test_full_history_and_per_step_give_the_same_token_advantages():
    eps = [_episode("full_history", "a"), _episode("per_step", "b")]
    values = [np.array(VALUES), np.array(VALUES)]
    adv, _ = critics.token_critic_advantages([[2, 3]] * 2, [[0.5, 1.0]] * 2, values, gamma=GAMMA, lam=LAM)
    np.testing.assert_array_equal(adv[0], adv[1])
    res = pack_batch(eps, adv, SamplingRecord(), {}, level="token")
    sl = res.batch.row_slices()
    full = res.batch.advantages[sl[0]]
    per_step = np.concatenate([res.batch.advantages[s].numpy() for s in sl[1:]])
    np.testing.assert_array_equal(full.numpy(), per_step)
    assert res.turn_advantages["a"] == res.turn_advantages["b"]


@pytest.mark.parametrize("mode", ["full_history", "per_step"])
def test_critic_rows_read_a_value_before_every_sampled_token(mode):
    ep = _episode(mode)
    rows = critic_rows([ep], returns=[WANT_RET], old_values=[VALUES], level="token")
    assert [list(r.input_ids) for r in rows] == [list(s.input_ids) for s in ep.training_sequences([0.0, 0.0])]
    if mode == "full_history":
        assert [list(r.positions) for r in rows] == [[2, 3, 6, 7, 8]]
    else:
        assert [list(r.positions) for r in rows] == [[2, 3], [1, 2, 3]]
    batch = ValueBatch.pack(rows)
    assert batch.num_positions == 5  # one value position per sampled token
    np.testing.assert_allclose(batch.returns.numpy(), WANT_RET, rtol=0, atol=1e-6)
    np.testing.assert_allclose(batch.old_values.numpy(), VALUES, rtol=0, atol=1e-6)
    for r, seq in zip(rows, ep.training_sequences([0.0, 0.0])):  # position + 1 is exactly the sampled tokens
        assert [b + 1 for b in r.positions] == [i for i, x in enumerate(seq.loss_mask) if x == 1]
    # turn level keeps its one boundary per turn
    assert [list(r.positions) for r in critic_rows([ep])] == ([[2, 6]] if mode == "full_history" else [[2], [1]])


def test_pack_batch_checks_counts_and_level():
    ep = _episode("full_history")
    with pytest.raises(ContractError, match="got 4 per-token values for episode ep with 5 sampled tokens"):
        pack_batch([ep], [[0.0] * 4], SamplingRecord(), {}, level="token")
    with pytest.raises(ContractError, match="got advantages for 2 episodes but 1 are kept"):
        pack_batch([ep], [[0.0, 0.0], [0.0, 0.0]], SamplingRecord(), {})
    with pytest.raises(ContractError, match="level='tokens'; expected 'turn' or 'token'"):
        pack_batch([ep], [[0.0, 0.0]], SamplingRecord(), {}, level="tokens")
    with pytest.raises(ContractError, match="level='x'"):
        critic_rows([ep], level="x")
    # per-turn callers are unchanged: the turn's value on each of its sampled tokens
    res = pack_batch([ep], [[0.25, -1.0]], SamplingRecord(), {})
    assert res.batch.advantages.tolist() == [0, 0, 0, 0.25, 0.25, 0, 0, -1.0, -1.0, -1.0]
    assert res.turn_advantages["ep"] == [0.25, -1.0]


@pytest.mark.parametrize("advantage", ["turn_critic", "gae"])
def test_the_critic_estimators_need_values_fn(advantage):
    with pytest.raises(ConfigError, match=f"algorithm.advantage='{advantage}' needs a learned critic's values"):
        assign_credit([_episode("full_history")], AlgorithmConfig(advantage=advantage), SamplingRecord())


def test_values_fn_count_is_checked():
    with pytest.raises(ContractError, match="values_fn returned 4 values for 5 value positions"):
        assign_credit([_episode("full_history")], AlgorithmConfig(advantage="gae"), SamplingRecord(),
                      values_fn=lambda vb: [0.0] * 4)
