"""Reads of stored episodes as the data contract's records: one ``Episode`` as it was added,
``EpisodeSummary`` listings in insertion order, per-turn advantages and trainer values, and
the ``RerunInfo`` of ``agentrl replay rerun``.

Every function is one read transaction of a ``ReplayDB``; an unknown episode is ``None``.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import false, func, select, true
from sqlalchemy.orm import Session

from agentrl.errors import ContractError
from agentrl.replay.codec import episode_from_rows, reason
from agentrl.replay.models import (
    EPISODE_KINDS,
    EpisodeRow,
    IterationRow,
    JudgementRow,
    SandboxEventRow,
    TurnRow,
    unpack_floats,
)
from agentrl.replay.read.db import ReplayDB
from agentrl.replay.read.judge import judgement_of
from agentrl.replay.read.runs import complete_subquery
from agentrl.types import Episode, TerminationReason

E = EpisodeRow.__table__
T = TurnRow.__table__
S = SandboxEventRow.__table__
IT = IterationRow.__table__


@dataclass(frozen=True)
class EpisodeSummary:
    """An episode without its turns, for listings.

    ``total_reward`` is ``None`` for errored episodes and missing rewards (never 0);
    ``advantage_mean`` is the mean per-turn advantage, ``None`` when none was stored.
    ``created_at`` is when it was stored (UTC). ``complete``: its iteration is marked
    complete (covered by a checkpoint; see ``ReplayStore.mark_complete``).
    """

    episode_id: str
    run_id: str
    iteration: int
    group_id: str
    env_id: str
    task_id: str
    seed: int
    terminated: bool
    truncated: bool
    termination_reason: TerminationReason | None
    total_reward: float | None
    error: dict[str, str] | None
    num_turns: int
    num_generated_tokens: int
    policy_version_min: int | None
    policy_version_max: int | None
    advantage_mean: float | None
    created_at: datetime
    complete: bool = False
    kind: str = "train"
    """``train``, ``eval`` or ``profile`` (``models.EPISODE_KINDS``)."""

    @property
    def is_error(self) -> bool:
        return self.termination_reason is not None and self.termination_reason.is_error


@dataclass(frozen=True)
class RerunInfo:
    """One row of ``reruns`` (``ReplayStore.add_rerun``)."""

    rerun_id: int
    episode_id: str
    created_at: datetime
    same: bool | None
    """``None``: the rerun could not decide (infrastructure error)."""
    first_divergent_turn: int | None
    report: dict[str, Any]


def get_episode(db: ReplayDB, episode_id: str) -> Episode | None:
    """The stored episode, equal to what was added (token ids and log-probs bit-exact,
    exec results included), or ``None`` when it is not stored. ``-0.0`` rewards read back as
    ``0.0`` on SQLite; anchors that are neither ``str`` nor simple literals read back as
    their ``repr``. On a database of an older schema (opened read-only, not upgraded) the
    fields of later revisions read as their defaults (``ReplayDB.columns_as_found``: branch
    0, no tool calls, no counters; no judgement without the ``judgements`` table)."""
    with db.read() as conn:
        row = conn.execute(select(*db.columns_as_found(E)).where(E.c.episode_id == episode_id)).first()
        if row is None:
            return None
        turns = conn.execute(select(*db.columns_as_found(T)).where(T.c.episode_id == episode_id)
                             .order_by(T.c.turn_index)).all()
        events = conn.execute(select(S).where(S.c.episode_id == episode_id).order_by(S.c.turn_index, S.c.seq)).all()
        judgement = judgement_of(db, conn, episode_id)
    return episode_from_rows(row, turns, events, judgement)


def episode_in(s: Session, row: EpisodeRow) -> Episode:
    """The ``Episode`` of ``row`` with its turns, sandbox events and judgement, read in session ``s``
    (the writable store's, whose database is at the head revision)."""
    turns = s.scalars(select(TurnRow).where(TurnRow.episode_id == row.episode_id)
                      .order_by(TurnRow.turn_index)).all()
    events = s.scalars(select(SandboxEventRow).where(SandboxEventRow.episode_id == row.episode_id)
                       .order_by(SandboxEventRow.turn_index, SandboxEventRow.seq)).all()
    return episode_from_rows(row, turns, events, s.get(JudgementRow, row.episode_id))


def check_kind(kind: str | None) -> None:
    """Raises ``ContractError`` unless ``kind`` is ``None`` or one of ``EPISODE_KINDS``."""
    if kind is not None and kind not in EPISODE_KINDS:
        raise ContractError(f"kind={kind!r}; expected one of {list(EPISODE_KINDS)} or None (every kind)")


def _kind_is(db: ReplayDB, kind: str) -> Any:
    """``episodes.kind == kind``; on a database without the column (before schema 6), where
    every episode is ``train``, true for ``train`` and false for the other kinds."""
    if db.has_kind:
        return E.c.kind == kind
    return true() if kind == "train" else false()


def _summaries(db: ReplayDB) -> Any:
    """``select`` of the episode columns (``ReplayDB.columns_as_found``) and ``complete``
    (the episode's iteration is marked complete), ``episodes`` outer-joined to ``iterations``."""
    return (select(*db.columns_as_found(E), IT.c.iteration.is_not(None).label("complete"))
            .select_from(E.outerjoin(IT, (IT.c.run_id == E.c.run_id) & (IT.c.iteration == E.c.iteration))))


def list_episodes(
    db: ReplayDB, run_id: str, iteration: int | None = None, limit: int = 100, offset: int = 0,
    *, complete_only: bool = False, kind: str | None = None,
) -> list[EpisodeSummary]:
    """Summaries of a run's episodes (one iteration's, if given; only those of complete
    iterations with ``complete_only``; of one ``kind`` if given), in insertion order
    (iteration, then batch, then position in the batch), ``limit`` from ``offset``.
    The viewer's filtered, sorted pages are ``agentrl.replay.read.listing.episode_page``.

    Raises:
        ContractError: ``limit < 0`` or ``offset < 0``, or an unknown ``kind``.
    """
    if limit < 0 or offset < 0:
        raise ContractError(f"limit={limit}, offset={offset}; expected both >= 0")
    check_kind(kind)
    q = _summaries(db).where(E.c.run_id == run_id)
    if iteration is not None:
        q = q.where(E.c.iteration == iteration)
    if complete_only:
        q = q.where(IT.c.iteration.is_not(None))
    if kind is not None:
        q = q.where(_kind_is(db, kind))
    q = q.order_by(E.c.iteration, E.c.created_at, E.c.position, E.c.episode_id).limit(limit).offset(offset)
    with db.read() as conn:
        return [episode_summary(r, bool(r.complete)) for r in conn.execute(q)]


def get_episode_summary(db: ReplayDB, episode_id: str) -> EpisodeSummary | None:
    """The summary of one stored episode (its run, iteration, kind ...), or ``None``."""
    with db.read() as conn:
        found = conn.execute(_summaries(db).where(E.c.episode_id == episode_id)).first()
    return None if found is None else episode_summary(found, bool(found.complete))


def count_episodes(db: ReplayDB, run_id: str, iteration: int | None = None, *, complete_only: bool = False,
                   kind: str | None = None) -> int:
    """Number of stored episodes of a run (of one iteration, if given; of complete
    iterations only, with ``complete_only``; of one ``kind``, if given).

    Raises:
        ContractError: an unknown ``kind``.
    """
    check_kind(kind)
    q = select(func.count()).select_from(EpisodeRow).where(EpisodeRow.run_id == run_id)
    if kind is not None:
        q = q.where(_kind_is(db, kind))
    if iteration is not None:
        q = q.where(EpisodeRow.iteration == iteration)
    if complete_only:
        q = q.where(EpisodeRow.iteration.in_(complete_subquery(run_id)))
    with db.read() as conn:
        return int(conn.scalar(q) or 0)


def episode_summary(r: Any, complete: bool) -> EpisodeSummary:
    """``EpisodeSummary`` of an ``episodes`` row (an ``EpisodeRow``, or a result row with its
    columns, as ``ReplayDB.columns_as_found`` selects them)."""
    return EpisodeSummary(
        episode_id=r.episode_id, run_id=r.run_id, iteration=r.iteration, group_id=r.group_id,
        env_id=r.env_id, task_id=r.task_id, seed=r.seed, terminated=r.terminated,
        truncated=r.truncated, termination_reason=reason(r.termination_reason),
        total_reward=r.total_reward, error=r.error, num_turns=r.num_turns,
        num_generated_tokens=r.num_generated_tokens, policy_version_min=r.policy_version_min,
        policy_version_max=r.policy_version_max, advantage_mean=r.advantage_mean,
        created_at=r.created_at, complete=complete, kind=r.kind,
    )


def advantages(db: ReplayDB, episode_id: str) -> list[float | None] | None:
    """Per-turn advantages as stored (``None`` where none was given), ``[num_turns]``;
    ``None`` for an unknown episode."""
    with db.read() as conn:
        if conn.scalar(select(EpisodeRow.episode_id).where(EpisodeRow.episode_id == episode_id)) is None:
            return None
        return list(conn.scalars(select(TurnRow.advantage).where(TurnRow.episode_id == episode_id)
                                 .order_by(TurnRow.turn_index)))


def trainer_values(db: ReplayDB, episode_id: str) -> list[tuple[list[float] | None, list[float] | None]] | None:
    """Per turn ``(trainer_log_probs [C] or None, entropies [C] or None)`` as stored (``None``:
    not written by an update, or not recorded by this database's schema); ``None`` for an
    unknown episode. The viewer's token pages are ``agentrl.replay.read.views.token_page``."""
    lp_col, en_col = db.turn_col("trainer_log_probs"), db.turn_col("entropies")
    cols = [c for c in (lp_col, en_col) if c is not None]
    with db.read() as conn:
        if conn.scalar(select(EpisodeRow.episode_id).where(EpisodeRow.episode_id == episode_id)) is None:
            return None
        rows = conn.execute(select(TurnRow.turn_index, *cols).where(TurnRow.episode_id == episode_id)
                            .order_by(TurnRow.turn_index)).all()

    def floats(r: Any, col: Any) -> list[float] | None:
        blob = None if col is None else r._mapping[col.name]
        return None if blob is None else unpack_floats(blob)

    return [(floats(r, lp_col), floats(r, en_col)) for r in rows]


def reruns(db: ReplayDB, episode_id: str, limit: int | None = None) -> list[RerunInfo]:
    """The episode's reruns (``agentrl replay rerun``), newest first, at most ``limit``;
    ``[]`` for none, an unknown episode, or a database without a ``reruns`` table."""
    table = db.table("reruns")
    if table is None:
        return []
    q = (select(table).where(table.c.episode_id == episode_id)
         .order_by(table.c.created_at.desc(), table.c.id.desc()))
    if limit is not None:
        q = q.limit(limit)
    with db.read() as conn:
        return [RerunInfo(rerun_id=r.id, episode_id=r.episode_id, created_at=r.created_at, same=r.same,
                          first_divergent_turn=r.first_divergent_turn, report=r.report)
                for r in conn.execute(q)]
