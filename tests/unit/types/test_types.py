"""The data contract: invariants 2, 3 and 6 of design.md at the type level."""

import math

import pytest
import torch

from agentrl.errors import ContractError
from agentrl.types import Episode, SamplingRecord, TerminationReason, TokenBatch, TokenSequence, Turn, broadcast_turn_values


def _episode():
    ep = Episode(group_id="g", env_id="e", task_id="t", seed=0)
    ep.turns.append(Turn(prompt_ids=[1, 2, 3], completion_ids=[4, 5], behavior_log_probs=[-0.1, -0.2], reward=0.0))
    ep.turns.append(Turn(prompt_ids=[6], completion_ids=[7, 8, 9], behavior_log_probs=[-0.3, -0.4, -0.5], reward=1.0))
    ep.termination_reason = TerminationReason.ENV_TERMINATED
    ep.terminated = True
    return ep


def test_stream_mask_and_log_probs_line_up():
    ep = _episode()
    ep.validate()
    assert ep.token_ids() == [1, 2, 3, 4, 5, 6, 7, 8, 9]
    assert ep.loss_mask() == [0, 0, 0, 1, 1, 0, 1, 1, 1]
    assert sum(ep.loss_mask()) == len(ep.behavior_log_probs()) == 5
    assert ep.total_reward == 1.0


def test_mismatched_log_probs_are_a_contract_error():
    ep = _episode()
    ep.turns[1].behavior_log_probs.pop()
    with pytest.raises(ContractError, match="3 completion ids but 2 behavior_log_probs"):
        ep.validate()


def test_errored_episode_has_no_reward_not_zero():
    ep = _episode()
    ep.termination_reason = TerminationReason.REWARD_ERROR
    ep.terminated = False
    assert ep.is_error and ep.total_reward is None


def test_broadcast_puts_advantages_on_sampled_tokens_only():
    ep = _episode()
    assert broadcast_turn_values(ep, [0.5, -1.0]) == [0, 0, 0, 0.5, 0.5, 0, -1.0, -1.0, -1.0]
    with pytest.raises(ContractError, match="1 per-turn values for an episode of 2 turns"):
        broadcast_turn_values(ep, [0.5])


def _row(ep, adv):
    return TokenSequence(ep.token_ids(), ep.loss_mask(), ep.behavior_log_probs(), broadcast_turn_values(ep, adv), "g", 0, ep.episode_id)


def test_pack_builds_packed_tensors_and_select_rows_round_trips():
    ep1, ep2 = _episode(), _episode()
    b = TokenBatch.pack([_row(ep1, [1.0, 2.0]), _row(ep2, [0.0, -1.0])], SamplingRecord(temperature=0.7))
    assert b.num_tokens == 18 and b.num_loss_tokens == 10 and b.num_rows == 2
    assert b.position_ids.tolist() == list(range(9)) * 2
    assert b.behavior_log_probs[:9].tolist() == pytest.approx([0, 0, 0, -0.1, -0.2, 0, -0.3, -0.4, -0.5])
    assert b.input_ids.dtype == torch.long and b.loss_mask.dtype == torch.float32
    second = b.select_rows([1])
    assert second.num_tokens == 9 and second.advantages.tolist() == [0, 0, 0, 0, 0, 0, -1, -1, -1]


def test_proximal_log_probs_are_optional_checked_and_follow_select_rows():
    ep1, ep2 = _episode(), _episode()
    rows = [_row(ep1, [1.0, 2.0]), _row(ep2, [0.0, -1.0])]
    plain = TokenBatch.pack(rows, SamplingRecord())
    assert plain.proximal_log_probs is None and plain.select_rows([1]).proximal_log_probs is None
    # off the loss tokens anything goes in (NaN included) and 0 comes out
    lp = torch.full((18,), math.nan)
    on = plain.loss_mask > 0
    lp[on] = -torch.arange(1, 11, dtype=torch.float32)
    b = TokenBatch.pack(rows, SamplingRecord(), proximal_log_probs=lp.double())
    assert b.proximal_log_probs.dtype == torch.float32 and b.proximal_log_probs.shape == (18,)
    assert b.proximal_log_probs[~on].tolist() == [0.0] * 8
    assert b.proximal_log_probs[on].tolist() == [-float(k) for k in range(1, 11)]
    second = b.select_rows([1])
    assert second.proximal_log_probs.tolist() == b.proximal_log_probs[9:].tolist()
    assert torch.equal(plain.with_proximal_log_probs(lp).proximal_log_probs, b.proximal_log_probs)
    assert b.with_proximal_log_probs(None).proximal_log_probs is None
    with pytest.raises(ContractError, match=r"proximal_log_probs has shape \(17,\); expected \(18,\)"):
        plain.with_proximal_log_probs(torch.zeros(17))
    bad = lp.clone()
    bad[3] = math.inf  # token 3 is a loss token
    with pytest.raises(ContractError, match=r"proximal_log_probs\[3\]=inf on a loss token"):
        TokenBatch.pack(rows, SamplingRecord(), proximal_log_probs=bad)


def test_pack_rejects_nonfinite_and_observation_advantages():
    ep = _episode()
    bad = TokenSequence(ep.token_ids(), ep.loss_mask(), ep.behavior_log_probs(), [0.0] * 3 + [math.nan] * 6, "g", 0)
    with pytest.raises(ContractError, match="not finite"):
        TokenBatch.pack([bad], SamplingRecord())
    leak = TokenSequence(ep.token_ids(), ep.loss_mask(), ep.behavior_log_probs(), [1.0] * 9, "g", 0)
    with pytest.raises(ContractError, match="observation tokens never get an advantage"):
        TokenBatch.pack([leak], SamplingRecord())
    with pytest.raises(ContractError, match="no rows"):
        TokenBatch.pack([], SamplingRecord())


def test_training_sequences_one_row_full_history_one_per_step_in_per_step_mode():
    ep = _episode()
    (row,) = ep.training_sequences([0.5, -1.0])
    assert row.input_ids == ep.token_ids() and list(row.advantages) == broadcast_turn_values(ep, [0.5, -1.0])
    ep.prompt_mode = "per_step"
    rows = ep.training_sequences([0.5, -1.0])
    assert [r.input_ids for r in rows] == [[1, 2, 3, 4, 5], [6, 7, 8, 9]]
    assert [list(r.loss_mask) for r in rows] == [[0, 0, 0, 1, 1], [0, 1, 1, 1]]
    assert [list(r.advantages) for r in rows] == [[0, 0, 0, 0.5, 0.5], [0, -1.0, -1.0, -1.0]]
    assert [list(r.behavior_log_probs) for r in rows] == [[-0.1, -0.2], [-0.3, -0.4, -0.5]]
    assert rows[0].episode_id == f"{ep.episode_id}:0"
    b = TokenBatch.pack(rows, SamplingRecord())
    assert b.num_rows == 2 and b.num_loss_tokens == 5


def test_success_comes_from_the_env_when_it_says_so():
    from agentrl.rollout.loop import rollout_metrics

    solved, failed, silent = _episode(), _episode(), _episode()
    solved.success, failed.success = True, False  # failed has total reward 1.0 but did not solve it
    m = rollout_metrics([solved, failed, silent])
    assert m["rollout/success_rate"] == pytest.approx(2 / 3)  # silent falls back to total_reward >= 1


def test_errored_episodes_are_neither_successes_nor_failures():
    from agentrl.rollout.loop import rollout_metrics

    solved, failed, broken = _episode(), _episode(), _episode()
    solved.success, failed.success = True, False
    broken.success = True  # an infra error is never scored, whatever the env said before it
    broken.termination_reason, broken.error = TerminationReason.INFRA_ERROR, {"type": "SandboxError", "message": "x"}
    m = rollout_metrics([solved, failed, broken])
    assert (m["rollout/episodes"], m["rollout/scored_episodes"], m["rollout/successes"]) == (3.0, 2.0, 1.0)
    assert m["rollout/success_rate"] == 0.5
