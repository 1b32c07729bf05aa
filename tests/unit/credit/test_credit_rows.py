"""Episodes onto token rows (agentrl.credit.rows), all read from ``Episode.rows``:
where a turn-level critic reads V(s_k) (each turn's boundary) and a token-level one reads
each sampled token's value (``p - 1``), and per-episode numbers split per row, in both
prompt modes."""

from __future__ import annotations

import numpy as np
import pytest

from agentrl.credit import episode_boundaries, episode_token_positions, split_per_row, split_tokens_per_row
from agentrl.errors import ContractError
from agentrl.types import Episode, Turn
from tests.helpers.episodes import make_episode


_episode = make_episode


@pytest.mark.parametrize("mode", ["full_history", "per_step"])
def test_episode_token_positions_follow_training_sequences_layout(mode):
    ep = _episode(mode)
    pos = episode_token_positions(ep)
    rows = ep.training_sequences([0.0, 0.0])
    assert len(pos) == len(rows)
    for b, row in zip(pos, rows):
        mask = list(row.loss_mask)
        assert [i + 1 for i in b] == [i for i, m in enumerate(mask) if m == 1]  # the token after is sampled
    assert sum(len(b) for b in pos) == ep.num_generated_tokens() == 5
    # PPP CC OO CCC: in full_history one row, in per_step rows PPP CC and OO CCC
    assert pos == ([[2, 3, 6, 7, 8]] if mode == "full_history" else [[2, 3], [1, 2, 3]])
    # a turn's first value position is its turn boundary (where turn_critic reads V(s_k))
    flat = [x for b in pos for x in b]
    turn_bounds = [x for b in episode_boundaries(ep) for x in b]
    assert [flat[0], flat[2]] == turn_bounds


def test_episode_token_positions_name_a_row_that_starts_sampled():
    ep = _episode("per_step")
    ep.turns[1].prompt_ids = []
    with pytest.raises(ContractError, match=r"episode ep, turn 1's row: loss_mask\[0\]=1"):
        episode_token_positions(ep)


@pytest.mark.parametrize("mode", ["full_history", "per_step"])
def test_split_tokens_per_row_matches_positions(mode):
    ep = _episode(mode)
    split = split_tokens_per_row(ep, np.arange(5.0))
    assert [len(x) for x in split] == [len(b) for b in episode_token_positions(ep)]
    assert [v for row in split for v in row] == [0.0, 1.0, 2.0, 3.0, 4.0]
    with pytest.raises(ContractError, match="got 4 per-token values for episode ep with 5 sampled tokens"):
        split_tokens_per_row(ep, [0.0] * 4)


def _turn_episode(mode: str):
    turns = [
        Turn(prompt_ids=[1, 2, 3], completion_ids=[4, 5], behavior_log_probs=[-0.1, -0.2], reward=0.0),
        Turn(prompt_ids=[6, 7], completion_ids=[8, 9, 10], behavior_log_probs=[-0.1] * 3, reward=0.0),
        Turn(prompt_ids=[11, 12], completion_ids=[13], behavior_log_probs=[-0.3], reward=1.0),
    ]
    return Episode(group_id="g", env_id="e", task_id="t", seed=0, turns=turns, prompt_mode=mode, episode_id="ep")


@pytest.mark.parametrize("mode", ["full_history", "per_step"])
def test_episode_boundaries_follow_training_sequences_layout(mode):
    ep = _turn_episode(mode)
    bounds = episode_boundaries(ep)
    rows = ep.training_sequences([0.0, 0.0, 0.0])
    assert len(bounds) == len(rows)
    for b, row in zip(bounds, rows):
        mask = list(row.loss_mask)
        for i in b:
            # the boundary is a prompt token and the next token is the turn's first sampled one
            assert mask[i] == 0 and mask[i + 1] == 1
    assert sum(len(b) for b in bounds) == len(ep.turns)
    if mode == "full_history":
        assert bounds == [[2, 6, 11]]
    else:
        assert bounds == [[2], [1], [1]]


@pytest.mark.parametrize("mode", ["full_history", "per_step"])
def test_split_per_row_matches_episode_boundaries(mode):
    ep = _turn_episode(mode)
    split = split_per_row(ep, np.array([0.5, 1.5, 2.5]))
    assert [len(x) for x in split] == [len(b) for b in episode_boundaries(ep)]
    assert [v for row in split for v in row] == [0.5, 1.5, 2.5]
    with pytest.raises(ContractError, match="got 2 per-turn values for episode ep of 3 turns"):
        split_per_row(ep, [1.0, 2.0])


def test_episode_boundaries_reject_a_row_without_prompt():
    ep = _turn_episode("per_step")
    ep.turns[1].prompt_ids = []
    with pytest.raises(ContractError, match="episode ep turn 1 has no prompt_ids"):
        episode_boundaries(ep)
    ep = _turn_episode("full_history")
    ep.turns[0].prompt_ids = []
    with pytest.raises(ContractError, match=r"episode ep: turn_prompt_lens\[0\]=0"):
        episode_boundaries(ep)


@pytest.mark.parametrize("mode", ["full_history", "per_step"])
def test_rows_are_the_training_sequences_layout(mode):
    ep = _turn_episode(mode)
    layout = ep.rows()
    rows = ep.training_sequences([0.5, 1.5, 2.5])
    assert [r.key for r in layout] == [r.episode_id for r in rows]
    assert [r.length for r in layout] == [len(r.input_ids) for r in rows]
    assert [r.loss_mask() for r in layout] == [list(r.loss_mask) for r in rows]
    assert [s.turn for r in layout for s in r.turns] == [0, 1, 2]
    for r, seq in zip(layout, rows):
        for s in r.turns:
            t = ep.turns[s.turn]
            assert seq.input_ids[s.prompt_start:s.completion_start] == t.prompt_ids
            assert seq.input_ids[s.completion_start:s.completion_end] == t.completion_ids
    if mode == "full_history":
        assert len(layout) == 1 and layout[0].key == "ep"
    else:
        assert [r.key for r in layout] == ["ep:0", "ep:1", "ep:2"]
    assert Episode(group_id="g", env_id="e", task_id="t", seed=0).rows() == []
