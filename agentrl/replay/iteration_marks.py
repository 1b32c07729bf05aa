"""Completion marks of a run's iterations (the ``iterations`` table) and the rewind of a
resume, as ``ReplayStore.mark_complete``, ``rewind`` and the frozen-iteration check of its
writes run them in the store's write transaction.

An iteration is complete once the checkpoint that covers it is written; a complete iteration
is frozen. Training iterations are numbered from 1; iteration 0 holds what precedes training
(``agentrl eval``'s rows). The contract is in ``agentrl.replay.store``.
"""

from __future__ import annotations

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from agentrl.errors import ContractError
from agentrl.replay.models import (
    EpisodeRow,
    IterationRow,
    MetricRow,
    SandboxEventRow,
    TurnRow,
    utcnow,
)

__all__ = ["delete_from", "mark_done", "refuse_complete"]


def mark_done(s: Session, run_id: str, n: int) -> list[int]:
    """Mark iterations ``1 .. n`` of the run complete and, when it holds rows (episodes or
    metrics), iteration 0; marks already present are kept (with their time). Returns the
    iterations newly marked, ascending."""
    have = set(s.scalars(select(IterationRow.iteration).where(
        IterationRow.run_id == run_id, IterationRow.iteration <= n)))
    before = any(s.scalar(select(row.iteration).where(row.run_id == run_id, row.iteration == 0).limit(1)) is not None
                 for row in (EpisodeRow, MetricRow))  # rows of iteration 0 (before training)
    new = [i for i in range(0 if before else 1, n + 1) if i not in have]
    if new:
        now = utcnow()
        s.execute(IterationRow.__table__.insert(),
                  [{"run_id": run_id, "iteration": i, "completed_at": now} for i in new])
    return new


def delete_from(s: Session, run_id: str, first: int) -> int:
    """Delete every episode (with its turns and sandbox events), metric and completion mark
    of the run's iterations ``>= first``. Returns how many episodes were deleted."""
    later = (select(EpisodeRow.episode_id)
             .where(EpisodeRow.run_id == run_id, EpisodeRow.iteration >= first).scalar_subquery())
    dropped = int(s.scalar(select(func.count()).select_from(EpisodeRow)
                           .where(EpisodeRow.run_id == run_id, EpisodeRow.iteration >= first)) or 0)
    s.execute(delete(SandboxEventRow).where(SandboxEventRow.episode_id.in_(later)))
    s.execute(delete(TurnRow).where(TurnRow.episode_id.in_(later)))
    s.execute(delete(EpisodeRow).where(EpisodeRow.run_id == run_id, EpisodeRow.iteration >= first))
    s.execute(delete(MetricRow).where(MetricRow.run_id == run_id, MetricRow.iteration >= first))
    s.execute(delete(IterationRow).where(IterationRow.run_id == run_id, IterationRow.iteration >= first))
    return dropped


def refuse_complete(s: Session, run_id: str, iteration: int) -> None:
    """Refuse a write into ``iteration`` of the run when it is marked complete.

    Raises:
        ContractError: the iteration is marked complete (a checkpoint covers it).
    """
    if s.get(IterationRow, (run_id, iteration)) is not None:
        raise ContractError(
            f"iteration {iteration} of run {run_id!r} is marked complete (a checkpoint covers it); "
            "expected an iteration in progress: rewind(run_id, iterations_done) before re-running it"
        )
