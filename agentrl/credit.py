"""From episodes to a ``TokenBatch``: credit assignment, filtering and token accounting.

The controller calls ``build_batch`` once per iteration. It

1. sets aside errored episodes (``infra_error`` / ``reward_error``): they are counted and
   excluded from the loss, never scored 0; with ``error_policy="drop_group"`` their whole
   group goes too, else the group's statistics use its valid samples only (case C12);
2. optionally drops groups whose rewards are all equal (DAPO dynamic sampling, Yu et al.
   2025, §3.2), counting their tokens as discarded;
3. computes advantages with the configured estimator from ``critics`` (one value per turn,
   or per sampled token for ``gae``), puts them on the sampled tokens through
   ``loss_mask`` (observation tokens get 0), and packs rows with ``TokenBatch.pack``: one
   row per episode in full-history mode, one per step in per-step mode (same estimators
   either way).
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Literal, Sequence

import numpy as np

import critics
from agentrl.config import AlgorithmConfig
from agentrl.errors import ConfigError, ContractError
from agentrl.types import Episode, SamplingRecord, TokenBatch, TokenSequence, ValueRow


@dataclass
class CreditResult:
    """What ``build_batch`` returns.

    Attributes:
        batch: the packed batch, or ``None`` when nothing is left to train on.
        turn_advantages: ``episode_id -> [K]`` advantage per turn (for the replay store);
            for ``gae`` the mean over each turn's sampled tokens (see ``pack_batch``).
        metrics: token accounting and filter counts (``tokens/...``, ``filter/...``).
    """

    batch: TokenBatch | None
    turn_advantages: dict[str, list[float]] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)


def shaped_turn_rewards(episode: Episode, cfg: AlgorithmConfig, max_new_tokens: int | None = None) -> list[float]:
    """Per-turn rewards the estimators see: the env reward, minus
    ``invalid_action_penalty`` on a step whose action was invalid (that step only), plus
    DAPO's soft overlong punishment of that turn's completion length (Yu et al. 2025,
    Eq. 13) when ``overlong_buffer_tokens > 0``. The recorded env rewards are unchanged.

    Raises:
        ContractError: a turn without a reward in a non-errored episode.
    """
    out = []
    for k, t in enumerate(episode.turns):
        if t.reward is None:
            raise ContractError(f"episode {episode.episode_id}: turn {k} has no reward")
        r = float(t.reward)
        if t.invalid_action:
            r -= cfg.invalid_action_penalty
        if cfg.overlong_buffer_tokens > 0 and max_new_tokens:
            r += float(critics.overlong_penalty([len(t.completion_ids)], max_len=max_new_tokens,
                                                cache_len=cfg.overlong_buffer_tokens, penalty=cfg.overlong_penalty)[0])
        out.append(r)
    return out


def _turn_advantages(episodes: Sequence[Episode], cfg: AlgorithmConfig, max_new_tokens: int | None = None) -> list[list[float]]:
    group_ids = [e.group_id for e in episodes]
    shaped = [shaped_turn_rewards(e, cfg, max_new_tokens) for e in episodes]
    if cfg.advantage in ("grpo", "rloo", "drgrpo"):
        rewards = [sum(r) for r in shaped]
        # rloo: leave-one-out mean, no std (Ahmadian et al. 2024); drgrpo: no std (Liu et al. 2025).
        adv = np.asarray(critics.grpo_advantages(
            rewards, group_ids,
            norm_by_std=cfg.norm_by_std and cfg.advantage == "grpo",
            leave_one_out=cfg.advantage == "rloo",
        ), dtype=np.float64)
        return [[float(a)] * len(e.turns) for a, e in zip(adv, episodes)]
    if cfg.advantage == "gigpo":
        step_rewards = shaped
        anchors = [[t.anchor for t in e.turns] for e in episodes]
        out = critics.gigpo_advantages(step_rewards, anchors, group_ids, gamma=cfg.gamma)
        return [[float(x) for x in np.asarray(a, dtype=np.float64)] for a in out]
    if cfg.uses_critic:
        raise ConfigError(
            f"algorithm.advantage={cfg.advantage!r} needs a learned critic's values; build_batch applies the "
            "critic-free estimators (grpo, rloo, drgrpo, gigpo) only: the controller's train() runs turn_critic and gae"
        )
    raise ConfigError(f"algorithm.advantage={cfg.advantage!r} is not an estimator build_batch knows")


def select_episodes(episodes: Sequence[Episode], cfg: AlgorithmConfig,
                    max_new_tokens: int | None = None) -> tuple[list[Episode], dict[str, float]]:
    """Steps 1-2: the episodes that go into the loss, and the token accounting so far."""
    m: dict[str, float] = defaultdict(float)
    m["tokens/generated"] = float(sum(e.num_generated_tokens() for e in episodes))
    errored = [e for e in episodes if e.is_error]
    m["filter/infra_errors"] = float(sum(1 for e in errored if e.termination_reason.value == "infra_error"))
    m["filter/reward_errors"] = float(sum(1 for e in errored if e.termination_reason.value == "reward_error"))
    bad_groups = {e.group_id for e in errored} if cfg.error_policy == "drop_group" else set()
    kept = [e for e in episodes if not e.is_error and e.group_id not in bad_groups and e.turns]
    m["filter/error_dropped_episodes"] = float(len(episodes) - len(kept))
    if cfg.dynamic_sampling and kept:
        totals = [sum(shaped_turn_rewards(e, cfg, max_new_tokens)) for e in kept]
        keep = np.asarray(critics.dynamic_sampling_keep(totals, [e.group_id for e in kept]), dtype=bool)
        m["filter/dynamic_sampling_dropped_groups"] = float(len({e.group_id for e, k in zip(kept, keep) if not k}))
        kept = [e for e, k in zip(kept, keep) if k]
    m["tokens/discarded"] = m["tokens/generated"] - float(sum(e.num_generated_tokens() for e in kept))
    if kept and (cfg.invalid_action_penalty or cfg.overlong_buffer_tokens):
        raw = sum(float(t.reward) for e in kept for t in e.turns)
        m["shaping/reward_delta_sum"] = sum(sum(shaped_turn_rewards(e, cfg, max_new_tokens)) for e in kept) - raw
    return kept, dict(m)


Level = Literal["turn", "token"]
"""How ``pack_batch`` / ``critic_rows`` read per-episode numbers: ``"turn"``, one value per
turn (``[K_i]``); ``"token"``, one value per sampled token in stream order (``[N_i]``,
``N_i = episode.num_generated_tokens()``)."""


def _check_level(level: str) -> None:
    if level not in ("turn", "token"):
        raise ContractError(f"level={level!r}; expected 'turn' or 'token'")


def _token_sequences(e: Episode, per_token: Sequence[float]) -> list[TokenSequence]:
    """``e``'s trainer rows (``Episode.training_sequences`` layout) with one advantage per
    sampled token put on that token, 0.0 on every ``loss_mask`` 0 token."""
    rows = e.training_sequences([0.0] * len(e.turns))
    out = []
    for row, vals in zip(rows, critics.split_tokens_per_row(e, per_token)):
        adv = [0.0] * len(row.input_ids)
        it = iter(vals)
        for i, m in enumerate(row.loss_mask):
            if m:
                adv[i] = next(it)
        out.append(replace(row, advantages=adv))
    return out


def _turn_means(e: Episode, per_token: Sequence[float]) -> list[float]:
    """Mean of ``per_token`` over each turn's sampled tokens (0.0 for a turn without any)."""
    out, start = [], 0
    for t in e.turns:
        n = len(t.completion_ids)
        out.append(float(np.mean(per_token[start:start + n])) if n else 0.0)
        start += n
    return out


def pack_batch(kept: Sequence[Episode], advantages: Sequence[Sequence[float]], sampling: SamplingRecord,
               metrics: dict[str, float], *, level: Level = "turn") -> CreditResult:
    """Step 3's packing: put the advantages on each episode's sampled tokens (0 on every
    ``loss_mask`` 0 token) and pack the rows (``Episode.training_sequences`` layout).

    Args:
        kept: the episodes to train on.
        advantages: per episode of ``kept``: with ``level="turn"`` one advantage per turn
            ``[K_i]``, broadcast onto that turn's sampled tokens; with ``level="token"`` one
            per sampled token ``[N_i]`` in stream order (``gae``), placed token by token,
            across the rows of a ``per_step`` episode.
        sampling: the sampling transform every row was drawn with.
        metrics: accounting so far (``select_episodes``); copied, then extended.
        level: ``"turn"`` or ``"token"``.

    Returns:
        The ``CreditResult``. Its ``turn_advantages`` (for the replay store) hold one value
        per turn: the turn's advantage, or with ``level="token"`` the *mean* advantage over
        that turn's sampled tokens (0.0 for a turn without any). The ``advantages/*``
        metrics are over turns (``"turn"``) or sampled tokens (``"token"``).

    Raises:
        ContractError: an episode breaks the token contract (a bug, never silenced), an
            advantage count that does not match the episode, or a bad ``level``.
    """
    _check_level(level)
    m = dict(metrics)
    if not kept:
        m["tokens/trained"] = 0.0
        return CreditResult(batch=None, metrics=m)
    if len(advantages) != len(kept):
        raise ContractError(f"got advantages for {len(advantages)} episodes but {len(kept)} are kept")
    rows = []
    turn_adv: dict[str, list[float]] = {}
    for e, adv in zip(kept, advantages):
        e.validate()
        adv = [float(a) for a in (adv.tolist() if hasattr(adv, "tolist") else adv)]
        if level == "turn":
            turn_adv[e.episode_id] = adv
            rows.extend(e.training_sequences(adv))
        else:
            rows.extend(_token_sequences(e, adv))
            turn_adv[e.episode_id] = _turn_means(e, adv)
    batch = TokenBatch.pack(rows, sampling)
    m["tokens/trained"] = float(batch.num_loss_tokens)
    m["tokens/packed"] = float(batch.num_tokens)
    flat = np.concatenate([np.asarray(a, dtype=np.float64).reshape(-1) for a in advantages])
    m["advantages/mean"] = float(flat.mean()) if flat.size else 0.0
    m["advantages/abs_max"] = float(np.abs(flat).max()) if flat.size else 0.0
    m["advantages/nonzero_frac"] = float((flat != 0).mean()) if flat.size else 0.0
    return CreditResult(batch=batch, turn_advantages=turn_adv, metrics=m)


def build_batch(episodes: Sequence[Episode], cfg: AlgorithmConfig, sampling: SamplingRecord,
                max_new_tokens: int | None = None) -> CreditResult:
    """Turn an iteration's episodes into a validated ``TokenBatch`` with a critic-free
    estimator (grpo, rloo, drgrpo, gigpo). ``turn_critic`` and ``gae`` need the value
    model's values: the controller calls ``select_episodes``, the critic,
    ``critics.turn_critic_advantages`` / ``critics.token_critic_advantages`` and
    ``pack_batch`` itself.

    Raises:
        ContractError: an episode breaks the token contract (a bug, never silenced).
    """
    kept, m = select_episodes(episodes, cfg, max_new_tokens)
    return pack_batch(kept, _turn_advantages(kept, cfg, max_new_tokens) if kept else [], sampling, m)


def critic_rows(kept: Sequence[Episode], returns: Sequence[Sequence[float]] | None = None,
                old_values: Sequence[Sequence[float]] | None = None, *, level: Level = "turn") -> list:
    """The critic's input rows, in the same row layout as ``Episode.training_sequences``
    (one row per episode, or per step in per-step mode), with the positions where the
    value model is read:

    * ``level="turn"`` (``turn_critic``): each turn's boundary token
      (``critics.episode_boundaries``); ``returns`` / ``old_values`` hold one value per
      turn per episode.
    * ``level="token"`` (``gae``): the token before every sampled token
      (``critics.episode_token_positions``); ``returns`` / ``old_values`` hold one value
      per sampled token per episode, in stream order.

    Returns:
        ``list[ValueRow]``; its values, concatenated, are in episode order, then turn (or
        sampled-token) order.

    Raises:
        ContractError: a count that does not match an episode, or a bad ``level``.
    """
    _check_level(level)
    positions, split = ((critics.episode_boundaries, critics.split_per_row) if level == "turn"
                        else (critics.episode_token_positions, critics.split_tokens_per_row))
    out = []
    for i, e in enumerate(kept):
        seqs = e.training_sequences([0.0] * len(e.turns))
        rets = split(e, returns[i]) if returns is not None else [None] * len(seqs)
        olds = split(e, old_values[i]) if old_values is not None else [None] * len(seqs)
        for seq, b, r, o in zip(seqs, positions(e), rets, olds):
            out.append(ValueRow(seq.input_ids, b, returns=r, old_values=o, episode_id=e.episode_id))
    return out
