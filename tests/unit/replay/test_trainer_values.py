"""``agentrl.replay.trainer_values``: per-token trainer values of an update's packed batch cut
back into the turns of its episodes, in both row layouts, for episodes the batch left out,
and refused when the batch does not match."""

from __future__ import annotations

import numpy as np
import pytest

from agentrl.errors import ContractError
from agentrl.replay import ReplayStore
from agentrl.replay.codec import finite_trainer_values
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


def test_non_finite_trainer_values_never_block_the_episode_write(tmp_path) -> None:
    """A diverging update's NaN / inf log-prob (the trainer skips such a step) is diagnostic
    data: ``add_episodes`` writes every episode of the batch and stores that turn's values as
    NULL, the finite turns as given; ``finite_trainer_values`` counts the dropped turns (the
    training loop's ``replay/trainer_values_nonfinite_turns``)."""
    eps = [make_episode("full_history", completions=(2, 3), prompts=(3, 2), episode_id=f"e{i}") for i in range(3)]
    good = [([-0.5] * len(t.completion_ids), [1.0] * len(t.completion_ids)) for t in eps[0].turns]
    nan_turn = ([float("nan")] + [-0.1] * (len(eps[1].turns[1].completion_ids) - 1),
                [0.2] * len(eps[1].turns[1].completion_ids))
    values = {"e0": good,
              "e1": [good[0], nan_turn],
              "e2": [None, ([-0.3] * 3, [float("inf"), 0.0, 0.0])]}
    cleaned, dropped = finite_trainer_values(values)
    assert dropped == 2 and cleaned["e1"] == [good[0], None] and cleaned["e2"] == [None, None]
    with ReplayStore(f"sqlite:///{tmp_path / 'replay.db'}") as store:
        store.start_run("r", {})
        store.add_episodes("r", 0, eps, trainer_values=values)
        assert store.count_episodes("r") == 3
        assert store.get_trainer_values("e0") == good
        assert store.get_trainer_values("e1") == [good[0], (None, None)]
        assert store.get_trainer_values("e2") == [(None, None), (None, None)]
        # a malformed value (not a NaN) is still a contract error, named
        with pytest.raises(ContractError, match="expected one per completion id"):
            store.add_episodes("r", 1, [make_episode("full_history", episode_id="bad")],
                               trainer_values={"bad": [([0.0], [0.0]), None]})
