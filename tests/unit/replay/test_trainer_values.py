"""``agentrl.replay.trainer_values``: per-token trainer values of an update's packed batch cut
back into the turns of its episodes, in both row layouts, for episodes the batch left out,
and refused when the batch does not match."""

from __future__ import annotations

import numpy as np
import pytest

from agentrl.errors import ContractError
from agentrl.replay.trainer_values import turn_trainer_values
from agentrl.types import SamplingRecord, TokenBatch
from tests.helpers.episodes import make_episode


def _batch(episodes) -> TokenBatch:
    rows = [r for ep in episodes for r in ep.training_sequences([1.0] * len(ep.turns))]
    return TokenBatch.pack(rows, SamplingRecord())


@pytest.mark.parametrize("mode", ["full_history", "per_step"])
def test_each_turn_gets_its_completions_values(mode: str) -> None:
    a = make_episode(mode, completions=(2, 3), prompts=(3, 2), episode_id="a")
    b = make_episode(mode, completions=(4, 1), prompts=(1, 5), episode_id="b")
    left_out = make_episode(mode, episode_id="not-trained")
    batch = _batch([a, b])
    T = batch.num_tokens
    lp = -np.arange(T, dtype=np.float32) / 8  # value = -(token index) / 8: positions readable
    ent = np.arange(T, dtype=np.float32)
    out = turn_trainer_values([a, b, left_out], batch.episode_ids, batch.seq_lens.tolist(), lp, ent)
    assert set(out) == {"a", "b"}
    ids = batch.input_ids.tolist()
    mask = batch.loss_mask.tolist()
    for ep in (a, b):
        for k, t in enumerate(ep.turns):
            got_lp, got_ent = out[ep.episode_id][k]
            assert len(got_lp) == len(got_ent) == len(t.completion_ids)
            positions = [int(e) for e in got_ent]  # the token indices the values came from
            assert [ids[p] for p in positions] == t.completion_ids  # the sampled ids exactly
            assert all(mask[p] == 1 for p in positions)
            assert got_lp == [-p / 8 for p in positions]


def test_a_batch_that_does_not_match_is_refused() -> None:
    a = make_episode("full_history", episode_id="a")
    batch = _batch([a])
    T = batch.num_tokens
    with pytest.raises(ContractError, match="expected them to match"):
        turn_trainer_values([a], batch.episode_ids, batch.seq_lens.tolist(), np.zeros(T - 1), np.zeros(T))
    with pytest.raises(ContractError, match="was not built from this episode"):
        turn_trainer_values([a], ("a", "x"), [T - 1, 1], np.zeros(T), np.zeros(T))
