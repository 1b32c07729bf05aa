"""Reads for the viewer's per-episode pages: one episode turn by turn with its sandbox
commands, its tokens in pages, a group of rollouts with their anchor-state step groups, and
two runs (or iterations) aligned on the same task.

Every function reads one snapshot of a ``ReplayDB`` with a fixed number of queries (no query
per turn or per episode); an unknown episode is ``None``. Token arrays are unpacked from the
store's packed columns (``agentrl.replay.models``: ``<i4`` ids, ``<f8`` log-probs).
"""

from __future__ import annotations

import difflib
import json
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from sqlalchemy import func, select

from agentrl.errors import ContractError
from agentrl.replay.models import (
    LOG_PROB_DTYPE,
    TOKEN_DTYPE,
    SandboxEventRow,
    decode_anchor,
)
from agentrl.replay.read.db import ReplayDB
from agentrl.replay.read.judge import judgement_of
from agentrl.replay.read.listing import LIST_COLUMNS, E, T

S = SandboxEventRow.__table__
CHAT_ROLES = ("system", "developer", "user", "assistant", "tool")
TOKEN_PAGE_SIZE = 1024
"""Tokens per page of the token view (an episode of 32k tokens has 32 pages)."""

_TURN_TEXT_COLUMNS = (T.c.turn_index, T.c.policy_version, T.c.finish_reason, T.c.reward, T.c.anchor,
                      T.c.anchor_kind, T.c.action_text, T.c.observation_text, T.c.invalid_action,
                      T.c.advantage, T.c.temperature, T.c.top_p, T.c.top_k)


@dataclass
class TurnView:
    """One turn for display; ``events`` are its sandbox commands in order (rows of
    ``sandbox_events``), ``num_prompt`` / ``num_completion`` its token counts. ``row`` has
    ``branch`` and ``tool_calls`` (0 on a database without them, schema 8 and older)."""

    row: Any
    num_prompt: int
    num_completion: int
    events: list[Any] = field(default_factory=list)

    @property
    def anchor(self) -> str:
        return str(decode_anchor(self.row.anchor, self.row.anchor_kind))

    @property
    def messages(self) -> list[tuple[str, str]] | None:
        """The observation as chat messages ``[(role, content), ...]`` when it is a list of
        them (an agent behind the gateway: the messages its next call added, as
        ``AgentEnv`` records them, ``[[role, content], ...]`` in JSON); None for any other
        observation text."""
        text = self.row.observation_text or ""
        if not text.startswith("[["):
            return None
        try:
            items = json.loads(text)
        except ValueError:
            return None
        if not isinstance(items, list) or not all(
                isinstance(m, list) and len(m) == 2 and m[0] in CHAT_ROLES and isinstance(m[1], (str, type(None)))
                for m in items):
            return None
        return [(m[0], m[1] or "") for m in items]


@dataclass
class EpisodeView:
    """One episode for display (the episode and diff pages): its listing row and its turns;
    ``get_episode`` (``agentrl.replay.read.episodes``) is the ``Episode`` record instead."""

    summary: Any
    """The episode's row (``LIST_COLUMNS``)."""
    turns: list[TurnView]
    counters: dict[str, float] = field(default_factory=dict)
    """``Episode.counters`` (name → count); empty when the episode has none, or on a database
    without the column (schema 8 and older)."""
    judgement: Any | None = None
    """The episode's ``judgements`` row (the columns of ``models.JudgementRow``: ``model``,
    ``rubric``, ``scores``, ``reasons``, ``output`` ...); None when it was not judged, or on a
    database without the table (schema 9 and older)."""

    @property
    def branches(self) -> dict[int, list[int]]:
        """Branch → the indices of its turns, in turn order, branches in order of their first
        turn (``{0: [...]}`` for an episode that never forked; ``{}`` without turns)."""
        out: dict[int, list[int]] = {}
        for t in self.turns:
            out.setdefault(int(t.row.branch), []).append(int(t.row.turn_index))
        return out

    @property
    def tool_calls(self) -> int:
        """The sum of the turns' ``tool_calls``."""
        return sum(int(t.row.tool_calls) for t in self.turns)


def episode_view(db: ReplayDB, episode_id: str) -> EpisodeView | None:
    """The episode ``episode_id`` with every turn, sandbox command and judgement, or None (four
    queries). On a database of an older schema the fields of later revisions read as their defaults
    (``ReplayDB.columns_as_found``: branch 0, no tool calls, no counters, no judgement)."""
    sizes = (func.length(T.c.prompt_ids) / 4, func.length(T.c.completion_ids) / 4)  # packed <i4: 4 bytes/id
    turn_cols = {c.name: c for c in db.columns_as_found(T)}
    counters = {c.name: c for c in db.columns_as_found(E)}["counters"]
    with db.read() as conn:
        summary = conn.execute(select(*LIST_COLUMNS, counters).where(E.c.episode_id == episode_id)).first()
        if summary is None:
            return None
        turns = [TurnView(r, int(r.n_prompt), int(r.n_completion)) for r in conn.execute(
            select(*_TURN_TEXT_COLUMNS, turn_cols["branch"], turn_cols["tool_calls"], sizes[0].label("n_prompt"),
                   sizes[1].label("n_completion"))
            .where(T.c.episode_id == episode_id).order_by(T.c.turn_index))]
        by_index = {t.row.turn_index: t for t in turns}
        for ev in conn.execute(select(S.c.turn_index, S.c.seq, S.c.command, S.c.exit_code, S.c.stdout, S.c.stderr,
                                      S.c.duration_s, S.c.timed_out, S.c.truncated_bytes)
                               .where(S.c.episode_id == episode_id).order_by(S.c.turn_index, S.c.seq)):
            if ev.turn_index in by_index:
                by_index[ev.turn_index].events.append(ev)
        judgement = judgement_of(db, conn, episode_id)
    return EpisodeView(summary, turns, dict(summary.counters or {}), judgement)


# ---------------------------------------------------------------------------------------
# Tokens
# ---------------------------------------------------------------------------------------

TOKEN_FIELDS = ("behavior_log_prob", "trainer_log_prob", "gap", "entropy", "advantage", "policy_version")
"""Per-token values of the token view (NaN where not recorded or not sampled)."""


@dataclass
class TokenPage:
    """Tokens ``[start, start + len(ids))`` of an episode, in the order the model read them.

    Arrays are ``[n]``: ``ids`` int, ``loss_mask`` 0/1 (1 on sampled tokens, except those of
    a turn the update left out of the loss: a NULL advantage in an episode with advantages,
    as overlong filtering stores it),
    ``turn`` the turn index; float64 ``behavior_log_prob``, ``trainer_log_prob`` (nats, NaN
    where not sampled or not recorded), ``gap`` (trainer − behavior), ``entropy`` (nats),
    ``advantage`` (the turn's, on sampled tokens), ``policy_version`` (on sampled tokens).
    """

    start: int
    total: int
    ids: np.ndarray
    loss_mask: np.ndarray
    turn: np.ndarray
    values: dict[str, np.ndarray]
    has: dict[str, bool]
    """Whether the database records the field at all (schema) and any of this page has it."""


def token_page(db: ReplayDB, episode_id: str, start: int = 0, size: int = TOKEN_PAGE_SIZE) -> TokenPage | None:
    """One page of an episode's tokens (None: unknown episode). Reads the packed arrays of the
    turns (one query) and slices them; a 32k-token episode's arrays are well under 1 MB."""
    cols = [T.c.turn_index, T.c.prompt_ids, T.c.completion_ids, T.c.behavior_log_probs,
            T.c.policy_version, T.c.policy_versions, T.c.advantage]
    optional = {"trainer_log_prob": db.turn_col("trainer_log_probs"), "entropy": db.turn_col("entropies")}
    cols += [c for c in optional.values() if c is not None]
    with db.read() as conn:
        if conn.execute(select(E.c.episode_id).where(E.c.episode_id == episode_id)).first() is None:
            return None
        rows = list(conn.execute(select(*cols).where(T.c.episode_id == episode_id).order_by(T.c.turn_index)))
    parts: dict[str, list[np.ndarray]] = defaultdict(list)
    nan = np.nan
    trained = any(r.advantage is not None for r in rows)  # else never trained (eval, errored): the contract's mask
    for r in rows:
        p = np.frombuffer(r.prompt_ids, dtype=TOKEN_DTYPE)
        c = np.frombuffer(r.completion_ids, dtype=TOKEN_DTYPE)
        n_p, n_c = len(p), len(c)
        parts["ids"] += [p, c]
        left_out = trained and r.advantage is None  # a turn the update left out of the loss
        parts["loss_mask"] += [np.zeros(n_p, np.int8), np.full(n_c, 0 if left_out else 1, np.int8)]
        parts["turn"].append(np.full(n_p + n_c, r.turn_index, np.int32))
        pad = np.full(n_p, nan)
        blp = np.frombuffer(r.behavior_log_probs, dtype=LOG_PROB_DTYPE)
        parts["behavior_log_prob"] += [pad, blp]
        for name, col in optional.items():
            blob = None if col is None else r._mapping[col.name]
            arr = _floats(blob, n_c)
            parts[name] += [pad, arr]
        versions = (np.full(n_c, r.policy_version, np.float64) if r.policy_versions is None
                    else np.frombuffer(r.policy_versions, dtype=TOKEN_DTYPE).astype(np.float64))
        parts["policy_version"] += [pad, versions]
        parts["advantage"] += [pad, np.full(n_c, nan if r.advantage is None else r.advantage)]
    full = {k: (np.concatenate(v) if v else np.zeros(0)) for k, v in parts.items()}
    total = len(full.get("ids", ()))
    if not full.get("ids", np.zeros(0)).size:
        empty = np.zeros(0)
        return TokenPage(0, 0, empty.astype(np.int64), empty.astype(np.int8), empty.astype(np.int32),
                         {k: empty for k in TOKEN_FIELDS}, {k: False for k in TOKEN_FIELDS})
    full["gap"] = full["trainer_log_prob"] - full["behavior_log_prob"]
    start = max(0, min(int(start), max(0, total - 1)))
    sl = slice(start, start + size)
    values = {k: full[k][sl] for k in TOKEN_FIELDS}
    has = {k: bool(np.isfinite(values[k]).any()) for k in TOKEN_FIELDS}
    for k, col in (("trainer_log_prob", optional["trainer_log_prob"]), ("entropy", optional["entropy"])):
        has[k] = has[k] and col is not None
    has["gap"] = has["gap"] and has["trainer_log_prob"]
    return TokenPage(start, total, full["ids"][sl].astype(np.int64), full["loss_mask"][sl], full["turn"][sl],
                     values, has)


def _floats(blob: bytes | None, n: int) -> np.ndarray:
    """A per-token float column of ``n`` tokens packed by ``models.pack_floats`` (float64);
    NaN where the column is NULL (not written yet).

    Raises:
        ContractError: the blob does not hold ``n`` float64 values.
    """
    if blob is None:
        return np.full(n, np.nan)
    if len(blob) != n * np.dtype(LOG_PROB_DTYPE).itemsize:
        raise ContractError(f"a per-token float column holds {len(blob)} bytes for {n} tokens; "
                            f"expected {n * np.dtype(LOG_PROB_DTYPE).itemsize} (float64 each)")
    return np.frombuffer(blob, dtype=LOG_PROB_DTYPE).astype(np.float64)


# ---------------------------------------------------------------------------------------
# Groups and diffs
# ---------------------------------------------------------------------------------------


@dataclass
class GroupView:
    """The rollouts of one task instance (``episodes`` rows) and per episode its turns
    (``turns[episode_id]``: rows with reward, advantage, anchor). ``anchor_groups``: anchor
    text → the ``(episode_id, turn_index)`` steps that acted from it, only anchors shared by
    two or more steps (GiGPO's step groups, by equal anchors as stored)."""

    episodes: list[Any]
    turns: dict[str, list[Any]]
    anchor_groups: dict[str, list[tuple[str, int]]]


def get_group(db: ReplayDB, run_id: str, group_id: str, limit: int = 64) -> GroupView:
    """Two queries: the group's episodes, then all their turns' scalars."""
    cols = (T.c.episode_id, T.c.turn_index, T.c.reward, T.c.advantage, T.c.anchor, T.c.anchor_kind,
            T.c.action_text, T.c.finish_reason)
    with db.read() as conn:
        eps = list(conn.execute(select(*LIST_COLUMNS).where(E.c.run_id == run_id, E.c.group_id == group_id)
                                .order_by(E.c.iteration, E.c.position, E.c.episode_id).limit(limit)))
        ids = [e.episode_id for e in eps]
        turns: dict[str, list[Any]] = {i: [] for i in ids}
        if ids:
            for t in conn.execute(select(*cols).where(T.c.episode_id.in_(ids)).order_by(T.c.episode_id, T.c.turn_index)):
                turns[t.episode_id].append(t)
    by_anchor: dict[str, list[tuple[str, int]]] = defaultdict(list)
    for eid in ids:
        for t in turns[eid]:
            by_anchor[str(decode_anchor(t.anchor, t.anchor_kind))].append((eid, t.turn_index))
    shared = {a: steps for a, steps in by_anchor.items() if len(steps) > 1}
    return GroupView(eps, turns, shared)


COMMON_TASK_SCAN = 5000
"""Side A's episodes (in task order) whose tasks the diff page offers."""


def common_tasks(db: ReplayDB, a: tuple[str, int | None], b: tuple[str, int | None], limit: int = 100) -> list[str]:
    """Task ids that both sides ran, at most ``limit``: a side is ``(run_id, iteration or None
    for any)``. Bounded work on any run size: the tasks of side A's first ``COMMON_TASK_SCAN``
    episodes (in task order, or of the one iteration), then which of its first ``limit`` tasks
    side B has: among one iteration's episodes, or by one ``LIMIT 1`` probe per task (neither
    database skips through an index for ``DISTINCT``)."""
    def side(run_id: str, it: int | None):
        q = select(E.c.task_id).where(E.c.run_id == run_id)
        return q.where(E.c.iteration == it) if it is not None else q

    with db.read() as conn:
        if a[1] is None:  # the run's (run_id, task_id) index range, in task order
            found = conn.scalars(side(*a).order_by(E.c.task_id).limit(COMMON_TASK_SCAN))
        else:  # one iteration's episodes (its index), sorted here
            found = sorted(conn.scalars(side(*a).limit(COMMON_TASK_SCAN)))
        first = list(dict.fromkeys(found))[:limit]
        if b[1] is not None:  # one iteration of side B: its episodes, through its index
            have = set(conn.scalars(side(*b).where(E.c.task_id.in_(first)).distinct()))
            return [t for t in first if t in have]
        return [t for t in first if conn.scalar(side(*b).where(E.c.task_id == t).limit(1)) is not None]


def first_episode(db: ReplayDB, run_id: str, it: int | None, task_id: str) -> str | None:
    """The first stored episode of ``task_id`` in the run (in that iteration, if given)."""
    q = select(E.c.episode_id).where(E.c.run_id == run_id, E.c.task_id == task_id)
    if it is not None:
        q = q.where(E.c.iteration == it)
    with db.read() as conn:
        return conn.scalar(q.order_by(E.c.iteration, E.c.created_at, E.c.position, E.c.episode_id).limit(1))


def align_turns(a: EpisodeView | None, b: EpisodeView | None
                ) -> list[tuple[TurnView | None, TurnView | None, bool, str]]:
    """Turn k of ``a`` beside turn k of ``b`` (None past the shorter one), whether action and
    observation are equal, and their unified diff (``difflib``, "" when equal or one-sided)."""
    ta = a.turns if a else []
    tb = b.turns if b else []
    out = []
    for k in range(max(len(ta), len(tb))):
        x = ta[k] if k < len(ta) else None
        y = tb[k] if k < len(tb) else None
        same = (x is not None and y is not None and x.row.action_text == y.row.action_text
                and x.row.observation_text == y.row.observation_text)
        diff = ""
        if x is not None and y is not None and not same:
            parts = []
            for name in ("action_text", "observation_text"):
                ax, bx = getattr(x.row, name), getattr(y.row, name)
                if ax != bx:
                    parts += difflib.unified_diff(ax.splitlines(), bx.splitlines(), f"A {name}", f"B {name}",
                                                  lineterm="", n=2)
            diff = "\n".join(parts)
        out.append((x, y, same, diff))
    return out
