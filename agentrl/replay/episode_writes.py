"""The episode write of ``ReplayStore.add_episodes`` and ``set_trainer_values``: one batch of
episodes made into rows (``episodes``, ``turns``, ``sandbox_events``, ``judgements``) and
written in the store's transaction, replacing the copies a run already holds.

    batch = batch_rows(run_id, iteration, episodes, advantages, "train", utcnow())
    replaced = replace_episodes(session, run_id, batch, url)   # in the store's write transaction

The row codecs are in ``agentrl.replay.codec``; the store's contract (idempotent upsert, one
transaction, errors) is in ``agentrl.replay.store``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.orm import Session

from agentrl.errors import ContractError
from agentrl.replay.codec import (
    chunks,
    episode_row,
    event_row,
    judgement_row,
    trainer_value_updates,
    turn_row,
)
from agentrl.replay.models import EPISODE_KINDS, EpisodeRow, JudgementRow, SandboxEventRow, TurnRow
from agentrl.types import Episode

__all__ = ["EpisodeBatch", "batch_rows", "replace_episodes", "write_trainer_values"]


@dataclass(frozen=True)
class EpisodeBatch:
    """The rows of one ``add_episodes`` batch, as ``insert()`` takes them."""

    ids: list[str]
    """The batch's episode ids, in batch order (each once)."""
    episodes: list[dict[str, Any]]
    """One ``episodes`` row per episode, ``position`` its index in the batch."""
    turns: list[dict[str, Any]]
    """One ``turns`` row per turn of every episode."""
    events: list[dict[str, Any]]
    """One ``sandbox_events`` row per exec result of every turn."""
    judgements: list[dict[str, Any]]
    """One ``judgements`` row per episode with a judgement (``Episode.judgement``)."""


def batch_rows(run_id: str, iteration: int, episodes: Sequence[Episode],
               advantages: Mapping[str, Sequence[float | None]], kind: str, now: datetime) -> EpisodeBatch:
    """The rows of ``episodes`` stored under ``(run_id, iteration)`` with episode ``kind``,
    written at ``now`` (UTC); ``advantages``: ``{episode_id: [one float or None per turn]}``
    (episodes absent from it get NULL). Reads no database.

    Raises:
        ContractError: ``kind`` not in ``EPISODE_KINDS``, an ``episode_id`` repeated in the
            batch, advantages for an episode not in it, or what the row codecs refuse (an
            invalid episode, a token id outside int32, a non-finite reward or advantage,
            advantages of the wrong length).
    """
    if kind not in EPISODE_KINDS:
        raise ContractError(f"kind={kind!r}; expected one of {list(EPISODE_KINDS)}")
    ids = [ep.episode_id for ep in episodes]
    if len(set(ids)) != len(ids):
        dup = sorted({i for i in ids if ids.count(i) > 1})
        raise ContractError(f"episode_ids {dup} appear more than once in one add_episodes batch")
    unknown = sorted(set(advantages) - set(ids))
    if unknown:
        raise ContractError(f"advantages given for episode_ids {unknown} that are not in the batch")

    episode_rows: list[dict[str, Any]] = []
    turn_rows: list[dict[str, Any]] = []
    event_rows: list[dict[str, Any]] = []
    judgement_rows: list[dict[str, Any]] = []
    for position, ep in enumerate(episodes):
        adv = advantages.get(ep.episode_id)
        episode_rows.append(episode_row(run_id, iteration, position, ep, adv, now) | {"kind": kind})
        judged = judgement_row(ep, now)
        if judged is not None:
            judgement_rows.append(judged)
        for k, turn in enumerate(ep.turns):
            turn_rows.append(turn_row(ep, k, turn, None if adv is None else adv[k]))
            for seq, res in enumerate(turn.exec_results):
                event_rows.append(event_row(ep.episode_id, k, seq, res, now))
    return EpisodeBatch(ids, episode_rows, turn_rows, event_rows, judgement_rows)


def replace_episodes(s: Session, run_id: str, batch: EpisodeBatch, url: str) -> int:
    """Write ``batch`` in the caller's transaction: an episode the run already holds is
    deleted (row, turns, sandbox events, judgement) and written again (an episode without a
    judgement then has no ``judgements`` row). ``url`` names the database in errors.
    Returns how many episodes were replaced.

    Raises:
        ContractError: an ``episode_id`` of the batch is stored under another run (nothing
            is written then).
    """
    existing: dict[str, str] = {}
    for chunk in chunks(batch.ids):
        existing.update(s.execute(
            select(EpisodeRow.episode_id, EpisodeRow.run_id).where(EpisodeRow.episode_id.in_(chunk))
        ).tuples().all())
    foreign = sorted(e for e, r in existing.items() if r != run_id)
    if foreign:
        raise ContractError(
            f"episode_ids {foreign[:5]} are already stored under another run "
            f"({existing[foreign[0]]!r}); episode ids must be unique across runs"
        )
    for chunk in chunks(sorted(existing)):
        s.execute(delete(SandboxEventRow).where(SandboxEventRow.episode_id.in_(chunk)))
        s.execute(delete(JudgementRow).where(JudgementRow.episode_id.in_(chunk)))
        s.execute(delete(TurnRow).where(TurnRow.episode_id.in_(chunk)))
        s.execute(delete(EpisodeRow).where(EpisodeRow.episode_id.in_(chunk)))
    for model, rows in ((EpisodeRow, batch.episodes), (TurnRow, batch.turns), (SandboxEventRow, batch.events),
                        (JudgementRow, batch.judgements)):
        if rows:
            s.execute(model.__table__.insert(), rows)
    return len(existing)


def write_trainer_values(s: Session, eps: Mapping[str, Episode], values: Mapping[str, Sequence[Any]]) -> int:
    """Set the stored turns' trainer log-probs and entropies (``codec.trainer_value_updates``
    checks ``values`` against the episodes ``eps``) in the caller's transaction. Returns how
    many turns were written.

    Raises:
        ContractError: what ``codec.trainer_value_updates`` refuses (values for an episode
            not in ``eps``, a list of the wrong length, a non-finite value).
    """
    updates = trainer_value_updates(eps, values)
    if updates:
        s.execute(update(TurnRow), updates)
    return len(updates)
