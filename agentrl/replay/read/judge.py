"""Reads of the judge's tables: an episode's ``judgements`` row (``Episode.judgement``), a run's
judge score against its rule reward per iteration (the run page's chart), and the judge cache
(``ReplayStore.judge_cache_get``). A database without these tables (schema 9 and older, opened
read-only and not upgraded) has no judgement, no judged iteration and an empty cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import and_, case, func, or_, select
from sqlalchemy.engine import Connection

from agentrl.replay.codec import chunks
from agentrl.replay.models import EpisodeRow
from agentrl.replay.read.db import ReplayDB

__all__ = ["JUDGE_PASS", "RULE_PASS", "JudgeIteration", "judge_cache", "judge_iterations", "judgement_of"]

JUDGE_PASS = 0.5
"""A judge score at or above this says "correct" when judge and rule are compared."""
RULE_PASS = 1.0
"""A rule reward at or above this says "correct" (``reward.rule_pass``'s default)."""
_E = EpisodeRow.__table__


def judgement_of(db: ReplayDB, conn: Connection, episode_id: str) -> Any | None:
    """The ``judgements`` row of ``episode_id`` (every column of ``models.JudgementRow``) read
    on ``conn``, a read transaction of ``db``; None when the episode has no judgement or the
    database no such table."""
    table = db.table("judgements")
    if table is None:
        return None
    return conn.execute(select(table).where(table.c.episode_id == episode_id)).first()


@dataclass(frozen=True)
class JudgeIteration:
    """The judgements of one iteration's training episodes (``judge_iterations``).

    Attributes:
        iteration: the iteration (numbered from 1).
        episodes: training episodes of the iteration with a ``judgements`` row.
        judged: of those, the ones the judge was asked about (``judged``; the rest the rule
            decided).
        scored: of those, the ones with a judge score (no ``error``).
        errors: episodes whose judgement failed (``error`` set: a reward error).
        score_mean: mean judge score of the ``scored`` episodes; None when there are none.
        rule_reward_mean: mean rule reward of the ``scored`` episodes that have one; None
            when there are none.
        compared: ``scored`` episodes that also have a rule reward.
        disagree: of the ``compared``, those where the judge (score >= ``judge_pass``) and
            the rule (rule reward >= ``rule_pass``) say different things.
    """

    iteration: int
    episodes: int
    judged: int
    scored: int
    errors: int
    score_mean: float | None
    rule_reward_mean: float | None
    compared: int
    disagree: int

    @property
    def disagree_share(self) -> float | None:
        """``disagree / compared`` in [0, 1]; None when nothing was compared."""
        return self.disagree / self.compared if self.compared else None


def judge_iterations(db: ReplayDB, run_id: str, *, judge_pass: float = JUDGE_PASS,
                     rule_pass: float = RULE_PASS) -> list[JudgeIteration]:
    """The judge score against the rule reward of run ``run_id``'s training episodes
    (``kind='train'``), one ``JudgeIteration`` per iteration that has a judgement, ascending
    by iteration. One query, grouped by iteration (SQLite and PostgreSQL); ``[]`` for a run
    without judgements and for a database without the table (schema 9 and older)."""
    j = db.table("judgements")
    if j is None:
        return []
    scored = j.c.score.isnot(None)
    compared = and_(scored, j.c.rule_reward.isnot(None))
    disagree = and_(compared, or_(and_(j.c.score >= judge_pass, j.c.rule_reward < rule_pass),
                                  and_(j.c.score < judge_pass, j.c.rule_reward >= rule_pass)))

    def count(cond: Any) -> Any:
        return func.coalesce(func.sum(case((cond, 1), else_=0)), 0)

    where = _E.c.run_id == run_id
    if db.has_kind:
        where = and_(where, _E.c.kind == "train")
    query = (select(_E.c.iteration, func.count().label("episodes"), count(j.c.judged.is_(True)), count(scored),
                    count(j.c.error.isnot(None)), func.avg(j.c.score), func.avg(case((scored, j.c.rule_reward))),
                    count(compared), count(disagree))
             .select_from(j.join(_E, _E.c.episode_id == j.c.episode_id)).where(where)
             .group_by(_E.c.iteration).order_by(_E.c.iteration))
    with db.read() as conn:
        rows = conn.execute(query).all()
    return [JudgeIteration(int(it), int(n), int(judged), int(n_scored), int(errors),
                           None if score is None else float(score), None if rule is None else float(rule),
                           int(n_compared), int(n_disagree))
            for it, n, judged, n_scored, errors, score, rule, n_compared, n_disagree in rows]


def judge_cache(db: ReplayDB, keys: Sequence[str]) -> dict[str, str]:
    """``{cache_key: output}`` for the ``keys`` (hex sha256) the judge cache holds, in one read
    transaction (one ``IN`` query per ``codec.CHUNK`` keys); keys it lacks are left out, and
    a database without the table gives ``{}``."""
    table = db.table("judge_cache")
    wanted = sorted(set(keys))
    if table is None or not wanted:
        return {}
    found: dict[str, str] = {}
    with db.read() as conn:
        for chunk in chunks(wanted):
            found.update(conn.execute(select(table.c.cache_key, table.c.output)
                                      .where(table.c.cache_key.in_(chunk))).tuples().all())
    return found
