"""The KL-to-reference penalty in the reward (``trainer.kl.mode: reward``): which token rows
the reference model scores, and how its per-token estimates become per-turn penalties.

As verl's ``use_kl_in_reward`` (``apply_kl_penalty``) and the PPO-for-RLHF recipe
(Ouyang et al. 2022, "Training language models to follow instructions with human
feedback", Eq. 2; Ziegler et al. 2019, §2): the per-token estimate ``k_t`` of
KL(sampling policy ‖ reference) on each sampled token (k1, k2 or k3 of Schulman 2020,
"Approximating KL Divergence", computed by the trainer from the engine's
``behavior_log_probs`` and the reference's log-probs) times ``coef`` is a cost, summed over
each turn's sampled tokens and subtracted from that turn's reward before the estimator runs
(``assign_credit(..., reward_penalties=...)``). Turn-level and token-level estimators both
take rewards per turn, so both get the per-turn sum (a token-level estimator sees it at the
turn's last token, where it sees the turn's reward).

The controller's round:

1. ``reference_batch(episodes, sampling)``: the rows of every scorable episode (not errored,
   with turns), in ``Episode.training_sequences`` layout with zero advantages;
2. the trainer's ``kl_to_reference(batch)``: ``k_t`` per packed token;
3. ``turn_penalties(scored, batch, k, coef)``: ``episode_id -> [K]`` penalties, passed to
   ``assign_credit``.

With ``coef == 0`` none of this runs.
"""

from __future__ import annotations

import math
from typing import Any, Sequence

from agentrl.credit.rows import turn_token_counts
from agentrl.errors import ConfigError, ContractError
from agentrl.types import Episode, SamplingRecord, TokenBatch

__all__ = ["reference_batch", "turn_penalties"]


def reference_batch(episodes: Sequence[Episode], sampling: SamplingRecord) -> tuple[list[Episode], TokenBatch | None]:
    """The token rows the reference model scores for the reward penalty.

    Args:
        episodes: the iteration's episodes (errored ones and ones without turns are left
            out: they never reach the loss).
        sampling: the transform every episode was sampled with.

    Returns:
        ``(scored, batch)``: the episodes kept, in order, and their rows packed with
        ``TokenBatch.pack`` (one row per episode in ``full_history`` mode, one per turn in
        ``per_step`` mode; advantages 0), or ``(scored, None)`` when nothing is left.

    Raises:
        ContractError: an episode that breaks the token contract.
    """
    scored = [e for e in episodes if not e.is_error and e.turns]
    rows = []
    for e in scored:
        e.validate()
        rows.extend(e.training_sequences([0.0] * len(e.turns)))
    return scored, (TokenBatch.pack(rows, sampling) if rows else None)


def turn_penalties(scored: Sequence[Episode], batch: TokenBatch, per_token_kl: Any, coef: float) -> dict[str, list[float]]:
    """Per-turn reward penalties ``coef * sum_{t in turn} k_t`` from per-token estimates.

    Args:
        scored, batch: what ``reference_batch`` returned (``batch`` not ``None``).
        per_token_kl: ``[T]`` (tensor, array or list; ``T = batch.num_tokens``) per-token
            KL estimate (nats) on the loss tokens; values elsewhere are ignored.
        coef: ``trainer.kl.coef`` (> 0).

    Returns:
        ``episode_id -> [K]`` penalties in reward units (subtracted from the shaped rewards
        by ``assign_credit``); a turn without sampled tokens gets 0.0.

    Raises:
        ConfigError: ``coef`` not a finite number > 0.
        ContractError: ``per_token_kl`` not ``[T]``, not finite on a loss token, or rows
            that do not match ``scored``.
    """
    if not (isinstance(coef, (int, float)) and math.isfinite(coef) and coef > 0):
        raise ConfigError(f"kl.coef={coef!r}; expected a finite number > 0 for a reward penalty")
    vals = [float(v) for v in (per_token_kl.tolist() if hasattr(per_token_kl, "tolist") else per_token_kl)]
    if len(vals) != batch.num_tokens:
        raise ContractError(f"per_token_kl has {len(vals)} values; expected one per packed token ({batch.num_tokens})")
    mask = batch.loss_mask.tolist()
    slices = batch.row_slices()
    out: dict[str, list[float]] = {}
    row = 0
    for e in scored:
        sampled: list[float] = []  # this episode's sampled tokens in row order
        turn_of: list[int] = []  # the turn of each of them
        for r in e.rows():
            if row >= len(slices):
                raise ContractError(f"batch has {len(slices)} rows; episode {e.episode_id} needs more")
            s = slices[row]
            sampled.extend(v for v, m in zip(vals[s], mask[s]) if m)
            turn_of.extend(span.turn for span in r.turns for _ in range(span.completion_len))
            row += 1
        counts = turn_token_counts(e)
        if len(sampled) != sum(counts):
            raise ContractError(
                f"episode {e.episode_id}: {len(sampled)} loss tokens in its rows but {sum(counts)} sampled tokens"
            )
        bad = [v for v in sampled if not math.isfinite(v)]
        if bad:
            raise ContractError(f"episode {e.episode_id}: per-token KL {bad[0]} is not finite")
        by_turn: list[list[float]] = [[] for _ in counts]
        for k, v in zip(turn_of, sampled):
            by_turn[k].append(v)
        per_turn = [coef * math.fsum(t) for t in by_turn]
        out[e.episode_id] = per_turn
    if row != len(slices):
        raise ContractError(f"batch has {len(slices)} rows but the scored episodes hold {row}")
    return out
