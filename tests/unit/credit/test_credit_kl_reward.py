"""The KL-to-reference penalty in the reward: rows for the reference, per-token estimates
summed per turn, and ``assign_credit(..., reward_penalties=...)`` subtracting them after
shaping (hand-computed values)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

import critics
from agentrl.config import AlgorithmConfig
from agentrl.credit import assign_credit, reference_batch, turn_penalties
from agentrl.errors import ConfigError, ContractError
from agentrl.types import SamplingRecord, TerminationReason
from tests.helpers.episodes import make_episode


def _eps(mode: str):
    a = make_episode(mode, completions=(2, 3), prompts=(3, 2), rewards=(0.0, 1.0), episode_id="a")
    b = make_episode(mode, completions=(1, 2), prompts=(2, 1), rewards=(0.0, 0.0), episode_id="b")
    for e in (a, b):
        e.group_id = "g"
    broken = make_episode(mode, episode_id="broken")
    broken.termination_reason = TerminationReason.INFRA_ERROR
    return [a, broken, b]


@pytest.mark.parametrize("mode", ["full_history", "per_step"])
def test_per_token_estimates_are_summed_per_turn_and_scaled(mode: str) -> None:
    eps = _eps(mode)
    scored, batch = reference_batch(eps, SamplingRecord())
    assert [e.episode_id for e in scored] == ["a", "b"]  # the errored episode never reaches the loss
    assert batch.num_rows == (2 if mode == "full_history" else 4) and batch.num_loss_tokens == 8
    # per-token estimate = 1, 2, 3, ... on the loss tokens in stream order; NaN elsewhere is ignored
    k = torch.full((batch.num_tokens,), math.nan)
    k[batch.loss_mask > 0] = torch.arange(1.0, 9.0)
    got = turn_penalties(scored, batch, k, coef=0.5)
    # a: turn 0 tokens 1, 2; turn 1 tokens 3, 4, 5. b: turn 0 token 6; turn 1 tokens 7, 8
    assert got == {"a": [0.5 * 3, 0.5 * 12], "b": [0.5 * 6, 0.5 * 15]}


def test_bad_inputs_are_refused() -> None:
    scored, batch = reference_batch(_eps("full_history"), SamplingRecord())
    with pytest.raises(ContractError, match="per_token_kl has 3 values; expected one per packed token"):
        turn_penalties(scored, batch, [0.0] * 3, coef=0.1)
    with pytest.raises(ConfigError, match="kl.coef=0"):
        turn_penalties(scored, batch, torch.zeros(batch.num_tokens), coef=0)
    k = torch.zeros(batch.num_tokens)
    k[int((batch.loss_mask > 0).nonzero()[0])] = math.inf
    with pytest.raises(ContractError, match="episode a: per-token KL inf is not finite"):
        turn_penalties(scored, batch, k, coef=0.1)
    with pytest.raises(ContractError, match="rows"):
        turn_penalties(scored[:1], batch, torch.zeros(batch.num_tokens), coef=0.1)
    assert reference_batch([], SamplingRecord()) == ([], None)


def test_assign_credit_subtracts_the_penalties_after_shaping() -> None:
    eps = _eps("full_history")
    cfg = AlgorithmConfig(advantage="gigpo", gamma=1.0, invalid_action_penalty=0.25)
    eps[0].turns[0].invalid_action = True  # shaping: turn 0 of a gets -0.25
    penalties = {"a": [0.1, 0.2], "b": [0.0, 0.4]}
    res = assign_credit(eps, cfg, SamplingRecord(), reward_penalties=penalties)
    shaped = [[-0.25 - 0.1, 1.0 - 0.2], [0.0 - 0.0, 0.0 - 0.4]]
    anchors = [[t.anchor for t in e.turns] for e in (eps[0], eps[2])]
    want = critics.gigpo_advantages(shaped, anchors, ["g", "g"], gamma=1.0)
    assert res.turn_advantages["a"] == pytest.approx(list(want[0]), abs=1e-12)
    assert res.turn_advantages["b"] == pytest.approx(list(want[1]), abs=1e-12)
    # and the penalty really changed the advantages, and nothing was written back
    plain = assign_credit(eps, cfg, SamplingRecord())
    assert not np.allclose(plain.turn_advantages["a"], res.turn_advantages["a"])
    assert [t.reward for t in eps[0].turns] == [0.0, 1.0]


def test_reward_penalties_must_cover_every_kept_episode() -> None:
    eps = _eps("full_history")
    with pytest.raises(ContractError, match="no entry for kept episode b"):
        assign_credit(eps, AlgorithmConfig(), SamplingRecord(), reward_penalties={"a": [0.0, 0.0]})
    with pytest.raises(ContractError, match=r"reward_penalties\['a'\].*expected 2 finite numbers"):
        assign_credit(eps, AlgorithmConfig(), SamplingRecord(), reward_penalties={"a": [0.0], "b": [0.0, 0.0]})
    with pytest.raises(ContractError, match="expected 2 finite numbers"):
        assign_credit(eps, AlgorithmConfig(), SamplingRecord(), reward_penalties={"a": [0.0, math.nan], "b": [0.0, 0.0]})
