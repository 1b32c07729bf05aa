"""Reads of the judge's tables: an episode's ``judgements`` row (``Episode.judgement``) and the
judge cache (``ReplayStore.judge_cache_get``). A database without these tables (schema 9 and
older, opened read-only and not upgraded) has no judgement and an empty cache.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import select
from sqlalchemy.engine import Connection

from agentrl.replay.codec import chunks
from agentrl.replay.read.db import ReplayDB

__all__ = ["judge_cache", "judgement_of"]


def judgement_of(db: ReplayDB, conn: Connection, episode_id: str) -> Any | None:
    """The ``judgements`` row of ``episode_id`` (every column of ``models.JudgementRow``) read
    on ``conn``, a read transaction of ``db``; None when the episode has no judgement or the
    database no such table."""
    table = db.table("judgements")
    if table is None:
        return None
    return conn.execute(select(table).where(table.c.episode_id == episode_id)).first()


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
