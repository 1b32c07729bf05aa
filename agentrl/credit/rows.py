"""Episodes onto token rows: where a critic reads values, and per-episode numbers split or
placed per row. Every function here reads ``Episode.rows`` (agentrl/types/episode.py), the one
place the ``full_history`` / ``per_step`` row layout is derived, and maps it onto the
arrays-only helpers of ``critics``.

Row order and layout are those of ``Episode.training_sequences``: one row per episode in
``full_history`` mode, one ``prompt_ids + completion_ids`` row per turn in ``per_step`` mode.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Literal, Sequence

import numpy as np

import critics
from agentrl.errors import ContractError
from agentrl.types import Episode, TokenSequence, ValueRow

Level = Literal["turn", "token"]
"""How per-episode numbers are read: ``"turn"``, one value per turn (``[K_i]``);
``"token"``, one value per sampled token in stream order (``[N_i]``,
``N_i = episode.num_generated_tokens()``)."""


def check_level(level: str) -> None:
    """Raises ``ContractError`` unless ``level`` is ``"turn"`` or ``"token"``."""
    if level not in ("turn", "token"):
        raise ContractError(f"level={level!r}; expected 'turn' or 'token'")


def _floats(x: Any) -> list[float]:
    return [float(v) for v in (x.tolist() if hasattr(x, "tolist") else x)]


def episode_boundaries(episode: Episode) -> list[list[int]]:
    """Turn boundaries (``critics.turn_boundaries``: the last token before each turn's
    completion) of each trainer row of ``episode``.

    Either way the rows' boundaries, concatenated, hold one entry per turn, in row order
    (``row_order(episode, "turn")``: turn order unless branches interleave), so critic values
    over these rows split back per episode by ``len(episode.turns)`` and go to turn order
    with ``to_stream_order``.

    Raises:
        ContractError: a row whose first turn has no prompt tokens (the episode named).
    """
    out = []
    for row in episode.rows():
        p = [s.prompt_len for s in row.turns]
        c = [s.completion_len for s in row.turns]
        if episode.prompt_mode == "per_step" and p[0] == 0:
            raise ContractError(
                f"episode {episode.episode_id} turn {row.turns[0].turn} has no prompt_ids; in per_step mode "
                "every turn is a row and must start with its prompt"
            )
        try:
            out.append(critics.turn_boundaries(p, c))
        except ContractError as exc:
            raise ContractError(f"episode {episode.episode_id}: {exc}") from exc
    return out


def episode_token_positions(episode: Episode) -> list[list[int]]:
    """Token-level value positions (``critics.token_value_positions``: ``p - 1`` for every
    sampled token ``p``) of each trainer row of ``episode``.

    The rows' positions, concatenated, hold one entry per sampled token
    (``episode.num_generated_tokens()`` in all), in row order (``row_order(episode,
    "token")``: stream order unless branches interleave), so critic values over these rows
    split back per episode by that count and go to stream order with ``to_stream_order``.

    Raises:
        ContractError: a row that starts with a sampled token (no prompt before it); the
            episode and row are named.
    """
    out = []
    for row in episode.rows():
        try:
            out.append(critics.token_value_positions(row.loss_mask()))
        except ContractError as exc:
            where = f"turn {row.turns[0].turn}'s row" if episode.prompt_mode == "per_step" else "its row"
            raise ContractError(f"episode {episode.episode_id}, {where}: {exc}") from exc
    return out


def split_per_row(episode: Episode, per_turn: Sequence[float] | Any) -> list[list[float]]:
    """Per-turn numbers (returns, old values) split like ``episode_boundaries``.

    Raises:
        ContractError: ``len(per_turn) != len(episode.turns)``.
    """
    vals = _floats(per_turn)
    if len(vals) != len(episode.turns):
        raise ContractError(
            f"got {len(vals)} per-turn values for episode {episode.episode_id} of {len(episode.turns)} turns"
        )
    return [[vals[s.turn] for s in row.turns] for row in episode.rows()]


def split_tokens_per_row(episode: Episode, per_token: Sequence[float] | Any) -> list[list[float]]:
    """Per-sampled-token numbers (advantages, returns, old values) of ``episode``, in stream
    order (turn by turn, each turn's tokens in order), split like
    ``episode_token_positions`` (each row gets its sampled tokens' values; rows of
    interleaved branches take their turns' tokens wherever they sit in the stream).

    Raises:
        ContractError: ``len(per_token) != episode.num_generated_tokens()``.
    """
    vals = _floats(per_token)
    n = episode.num_generated_tokens()
    if len(vals) != n:
        raise ContractError(
            f"got {len(vals)} per-token values for episode {episode.episode_id} with {n} sampled tokens"
        )
    pos = iter(row_order(episode, "token"))
    return [[vals[next(pos)] for _ in range(row.num_sampled)] for row in episode.rows()]


def row_order(episode: Episode, level: Level) -> list[int]:
    """Stream positions in the order ``episode``'s rows hold them: turn indices
    (``level="turn"``) or sampled-token indices in stream order (``"token"``), row by row.
    The identity for an episode whose rows keep turn order (one branch, or ``per_step``);
    a permutation when branches interleave (a row holds turns 0 and 2, the next turn 1).
    Values that come back in row order (a critic's, read at ``critic_rows``' positions) go
    to stream order with ``out[order[i]] = value[i]``."""
    check_level(level)
    spans = [s for row in episode.rows() for s in row.turns]
    if level == "turn":
        return [s.turn for s in spans]
    starts = np.cumsum([0] + turn_token_counts(episode)).tolist()
    return [starts[s.turn] + j for s in spans for j in range(s.completion_len)]


def to_stream_order(episode: Episode, values: Sequence[float] | Any, level: Level) -> np.ndarray:
    """``values`` given in row order (``row_order``) put back in stream order. ``[K]`` or
    ``[N_tokens]`` float64.

    Raises:
        ContractError: not one value per position.
    """
    order = row_order(episode, level)
    vals = np.asarray(values, dtype=np.float64).reshape(-1)
    if vals.size != len(order):
        raise ContractError(f"got {vals.size} values in row order for episode {episode.episode_id}; "
                            f"expected {len(order)} ({level} level)")
    out = np.empty(len(order), dtype=np.float64)
    out[order] = vals
    return out


def turn_token_counts(episode: Episode) -> list[int]:
    """``[K]`` sampled tokens per turn (what token-level estimators get)."""
    return [len(t.completion_ids) for t in episode.turns]


def token_sequences(episode: Episode, per_token: Sequence[float] | Any) -> list[TokenSequence]:
    """``episode``'s trainer rows with one advantage per sampled token put on that token,
    0.0 on every ``loss_mask`` 0 token.

    Raises:
        ContractError: ``len(per_token) != episode.num_generated_tokens()``.
    """
    rows = episode.training_sequences([0.0] * len(episode.turns))
    out = []
    for row, vals in zip(rows, split_tokens_per_row(episode, per_token)):
        adv = [0.0] * len(row.input_ids)
        it = iter(vals)
        for i, m in enumerate(row.loss_mask):
            if m:
                adv[i] = next(it)
        out.append(replace(row, advantages=adv))
    return out


def turn_means(episode: Episode, per_token: Sequence[float]) -> list[float]:
    """Mean of ``per_token`` over each turn's sampled tokens (0.0 for a turn without any)."""
    out, start = [], 0
    for n in turn_token_counts(episode):
        out.append(float(np.mean(per_token[start:start + n])) if n else 0.0)
        start += n
    return out


def critic_rows(kept: Sequence[Episode], returns: Sequence[Sequence[float]] | None = None,
                old_values: Sequence[Sequence[float]] | None = None, *, level: Level = "turn") -> list[ValueRow]:
    """The critic's input rows, in the row layout of ``Episode.training_sequences``, with
    the positions where the value model is read:

    * ``level="turn"`` (``turn_critic``): each turn's boundary token
      (``episode_boundaries``); ``returns`` / ``old_values`` hold one value per turn per
      episode.
    * ``level="token"`` (``gae``): the token before every sampled token
      (``episode_token_positions``); ``returns`` / ``old_values`` hold one value per
      sampled token per episode, in stream order.

    Returns:
        ``list[ValueRow]``; its positions, concatenated, are in episode order, then in each
        episode's row order (``row_order``: turn order unless branches interleave).

    Raises:
        ContractError: a count that does not match an episode, or a bad ``level``.
    """
    check_level(level)
    positions, split = ((episode_boundaries, split_per_row) if level == "turn"
                        else (episode_token_positions, split_tokens_per_row))
    out = []
    for i, e in enumerate(kept):
        seqs = e.training_sequences([0.0] * len(e.turns))
        rets = split(e, returns[i]) if returns is not None else [None] * len(seqs)
        olds = split(e, old_values[i]) if old_values is not None else [None] * len(seqs)
        for seq, b, r, o in zip(seqs, positions(e), rets, olds):
            out.append(ValueRow(seq.input_ids, b, returns=r, old_values=o, episode_id=e.episode_id))
    return out


def drop_turns_from_loss(episode: Episode, rows: Sequence[TokenSequence], turns: set[int]) -> list[TokenSequence]:
    """``rows`` (``episode``'s trainer rows, from ``Episode.training_sequences`` or
    ``token_sequences``) with the completion tokens of ``turns`` taken out of the loss:
    ``loss_mask`` 0, advantage 0.0, token version 0, their ``behavior_log_probs`` entries
    removed (that list holds one value per ``loss_mask`` 1 token) and the row's
    ``policy_version`` recomputed over the sampled tokens left. A row keeps its length
    (``Episode.rows`` still describes it, as the replay store's per-turn trainer values
    need); a row left without any loss token is dropped. Used by DAPO's overlong filtering
    (``AlgorithmConfig.overlong_filtering``).

    Raises:
        ContractError: ``rows`` does not follow ``episode.rows()``.
    """
    layouts = episode.rows()
    if len(layouts) != len(rows):
        raise ContractError(f"episode {episode.episode_id}: {len(rows)} rows for a layout of {len(layouts)}")
    out: list[TokenSequence] = []
    for layout, row in zip(layouts, rows):
        if len(row.input_ids) != layout.length:
            raise ContractError(f"episode {episode.episode_id}: row {layout.key} has {len(row.input_ids)} ids; "
                                f"its layout says {layout.length}")
        spans = [s for s in layout.turns if s.turn in turns]
        if not spans:
            out.append(row)
            continue
        mask, adv = list(row.loss_mask), [float(a) for a in row.advantages]
        versions = None if row.token_policy_versions is None else list(row.token_policy_versions)
        for s in spans:
            for i in range(s.completion_start, s.completion_end):
                mask[i], adv[i] = 0, 0.0
                if versions is not None:
                    versions[i] = 0
        if not any(mask):
            continue
        sampled = [i for i, m in enumerate(row.loss_mask) if m]  # [sum(loss_mask)], aligned with behavior_log_probs
        lps = [lp for i, lp in zip(sampled, row.behavior_log_probs) if mask[i]]
        version = (min(v for v, m in zip(versions, mask) if m) if versions is not None else row.policy_version)
        out.append(replace(row, loss_mask=mask, advantages=adv, behavior_log_probs=lps,
                           token_policy_versions=versions, policy_version=version))
    return out
