"""DAPO overlong filtering (``algorithm.overlong_filtering``, agentrl/credit/assign.py) acts on
every completion cut by a token budget, read from the turn's ``finish_reason``: one that hit
``max_new_tokens`` (termination ``length``) and one cut by the context budget (termination
``context_limit``), and on that turn only; a ``context_limit`` episode that ended before
sampling a turn has no cut completion and keeps everything in the loss."""

from __future__ import annotations

import numpy as np
import pytest

from agentrl.config import AlgorithmConfig
from agentrl.credit import assign_credit
from agentrl.types import Episode, SamplingRecord, TerminationReason, Turn

S = 0.5 / (np.sqrt(0.5) + 1e-6)  # GRPO's advantage for returns 1 vs 0 in a group of two


def _episode(episode_id, rewards, finish_reasons, termination):
    ep = Episode(group_id="g", env_id="e", task_id="t", seed=0, episode_id=episode_id,
                 termination_reason=termination, terminated=termination == TerminationReason.ENV_TERMINATED,
                 truncated=termination != TerminationReason.ENV_TERMINATED)
    for k, (r, fr) in enumerate(zip(rewards, finish_reasons)):
        tok, lp = (7, -0.25) if fr == "length" else (5, -0.5)
        ep.turns.append(Turn(prompt_ids=[1, 2], completion_ids=[tok] * 3, behavior_log_probs=[lp] * 3, reward=r,
                             anchor=f"s{k}", finish_reason=fr))
    return ep


def _check_only_the_cut_turn_left_the_loss(eps, cut_id, cut_turn):
    plain = assign_credit(eps, AlgorithmConfig(), SamplingRecord())
    res = assign_credit(eps, AlgorithmConfig(overlong_filtering=True), SamplingRecord())
    want = list(plain.turn_advantages[cut_id])
    want[cut_turn] = None
    assert res.turn_advantages[cut_id] == want  # the cut turn trained nothing, the others as before
    b = res.batch
    assert all(m == 0.0 for i, m in zip(b.input_ids.tolist(), b.loss_mask.tolist()) if i == 7)
    assert b.num_loss_tokens == plain.batch.num_loss_tokens - 3
    assert sorted(set(b.behavior_log_probs[b.loss_mask > 0].tolist())) == [-0.5]  # sum(loss_mask) == len(lps)
    assert res.metrics["tokens/discarded"] == plain.metrics["tokens/discarded"] + 3
    assert res.metrics["filter/overlong_filtered_turns"] == 1.0
    return res


def test_a_reply_cut_by_max_new_tokens_leaves_the_loss():
    eps = [_episode("cut", [0.0, 1.0], ["stop", "length"], TerminationReason.LENGTH),
           _episode("ok", [0.0, 0.0], ["stop", "stop"], TerminationReason.ENV_TERMINATED)]
    res = _check_only_the_cut_turn_left_the_loss(eps, "cut", 1)
    assert res.turn_advantages["cut"][0] == pytest.approx(S, abs=1e-12)
    assert res.metrics["filter/overlong_filtered_turns_context_limit"] == 0.0


def test_a_reply_cut_by_the_context_budget_leaves_the_loss():
    eps = [_episode("cut", [0.0, 1.0], ["stop", "length"], TerminationReason.CONTEXT_LIMIT),
           _episode("ok", [0.0, 0.0], ["stop", "stop"], TerminationReason.ENV_TERMINATED)]
    res = _check_only_the_cut_turn_left_the_loss(eps, "cut", 1)
    assert res.turn_advantages["cut"][0] == pytest.approx(S, abs=1e-12)  # the complete first turn stays
    assert res.metrics["filter/overlong_filtered_turns_context_limit"] == 1.0


def test_a_context_limit_before_any_cut_reply_filters_nothing():
    """The next prompt left no room, so no turn was sampled: every recorded reply is whole."""
    eps = [_episode("full", [0.0, 1.0], ["stop", "stop"], TerminationReason.CONTEXT_LIMIT),
           _episode("ok", [0.0, 0.0], ["stop", "stop"], TerminationReason.ENV_TERMINATED)]
    plain = assign_credit(eps, AlgorithmConfig(), SamplingRecord())
    res = assign_credit(eps, AlgorithmConfig(overlong_filtering=True), SamplingRecord())
    assert res.turn_advantages == plain.turn_advantages
    assert res.turn_advantages["full"] == pytest.approx([S, S], abs=1e-12)
    assert res.batch.num_loss_tokens == plain.batch.num_loss_tokens == 12
    assert res.metrics["filter/overlong_filtered_turns"] == 0.0


@pytest.mark.parametrize("mode", ["full_history", "per_step"])
def test_the_cut_reply_of_a_context_limit_episode_leaves_in_both_prompt_modes(mode):
    eps = [_episode("cut", [1.0, 0.0, 0.0], ["stop", "stop", "length"], TerminationReason.CONTEXT_LIMIT),
           _episode("ok", [0.0, 0.0, 0.0], ["stop", "stop", "stop"], TerminationReason.MAX_TURNS)]
    for e in eps:
        e.prompt_mode = mode
    res = _check_only_the_cut_turn_left_the_loss(eps, "cut", 2)
    # per-step mode: the cut turn's own row has nothing left and is dropped
    assert res.batch.num_rows == (1 + 1 if mode == "full_history" else 2 + 3)
