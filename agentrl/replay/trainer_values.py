"""The trainer-side log-prob and entropy of each sampled token, from an update's packed
batch back to the turns of the replay store (``ReplayStore.add_episodes(...,
trainer_values=...)`` / ``set_trainer_values``).

The update's ``TokenBatch`` holds one row per ``EpisodeRows`` of each trained episode (one row
in ``full_history`` mode, one per turn in ``per_step`` mode; ``Episode.rows`` says
where each turn's completion sits in its row, and ``TokenBatch.episode_ids`` holds the rows'
keys). The trainer returns ``[T]`` arrays aligned with the batch's tokens
(``StepResult.log_probs`` / ``entropies`` of ``PolicyTrainer.step``); this module cuts each turn's completion out of them.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from agentrl.errors import ContractError
from agentrl.types import Episode

TurnValues = tuple[list[float], list[float]] | None
"""Per turn: ``(log_probs [C], entropies [C])`` (nats), or ``None`` for a turn not trained."""


def turn_trainer_values(
    episodes: Sequence[Episode],
    row_keys: Sequence[str],
    seq_lens: Sequence[int],
    log_probs: np.ndarray,
    entropies: np.ndarray,
) -> dict[str, list[TurnValues]]:
    """Per-turn trainer values of ``episodes`` from one update's batch.

    Args:
        episodes: the iteration's episodes (those the batch does not hold are left out).
        row_keys: ``[B]`` the batch's row keys (``TokenBatch.episode_ids``).
        seq_lens: ``[B]`` the batch's row lengths (``TokenBatch.seq_lens``).
        log_probs, entropies: ``[T]`` float arrays aligned with the batch's tokens
            (``T = sum(seq_lens)``).

    Returns:
        ``{episode_id: [per turn: (log_probs [C], entropies [C]) or None]}`` for every
        episode with at least one row in the batch.

    Raises:
        ContractError: arrays of another length than ``sum(seq_lens)``, or a row whose
            length differs from the episode's layout (the batch was not built from it).
    """
    lens = [int(n) for n in seq_lens]
    total = sum(lens)
    lp = np.asarray(log_probs, dtype=np.float64).reshape(-1)
    ent = np.asarray(entropies, dtype=np.float64).reshape(-1)
    if lp.shape[0] != total or ent.shape[0] != total or len(row_keys) != len(lens):
        raise ContractError(f"trainer values of {lp.shape[0]} / {ent.shape[0]} tokens and {len(row_keys)} row keys "
                            f"for a batch of {len(lens)} rows and {total} tokens; expected them to match")
    starts = np.concatenate([[0], np.cumsum(lens)[:-1]]).astype(int).tolist() if lens else []
    row_of = {key: (start, n) for key, start, n in zip(row_keys, starts, lens)}
    out: dict[str, list[TurnValues]] = {}
    for ep in episodes:
        per_turn: list[TurnValues] = [None] * len(ep.turns)
        found = False
        for layout in ep.rows():
            hit = row_of.get(layout.key)
            if hit is None:
                continue
            start, n = hit
            if n != layout.length:
                raise ContractError(f"batch row {layout.key!r} has {n} tokens; episode {ep.episode_id}'s layout "
                                    f"says {layout.length}: the batch was not built from this episode")
            for span in layout.turns:
                a, b = start + span.completion_start, start + span.completion_end
                per_turn[span.turn] = (lp[a:b].tolist(), ent[a:b].tolist())
            found = True
        if found:
            out[ep.episode_id] = per_turn
    return out


__all__ = ["TurnValues", "turn_trainer_values"]
