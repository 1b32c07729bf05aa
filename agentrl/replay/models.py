"""ORM models and column codecs of the replay store (SQLAlchemy 2.x typed ORM).

One schema for SQLite (the embedded default) and PostgreSQL: only portable column types
(``Integer``, ``BigInteger``, ``Double``, ``Boolean``, ``Text``, ``String``, ``JSON``,
``LargeBinary``, ``DateTime``) and no dialect-specific SQL.

Storage choices:

* Token ids and log-probs are packed little-endian arrays in ``LargeBinary`` columns (BLOB on
  SQLite, BYTEA on PostgreSQL): token ids as ``int32`` (4 bytes per token; every vocabulary in
  use is far below ``2**31``, and a larger id is refused with ``ContractError``), and
  ``behavior_log_probs`` as ``float64`` (8 bytes per token). Python floats are IEEE doubles,
  so the round trip is bit-exact, ``-0.0``, subnormals and values such as ``-1e-30``
  included. Packing as float32 would be half the size but would change values that did not
  come from a float32 engine, so it is not done. JSON lists are avoided on purpose:
  PostgreSQL's JSON numerics lose ``-0.0`` and the text is 2-3 times larger.
* Scalar floats (rewards, advantages, durations, metric values) are ``Double`` columns so the
  viewer and ad-hoc SQL can sort and filter on them. SQLite stores ``-0.0`` in a REAL column
  as ``0.0`` (equal by value, sign lost) and a NaN as NULL; the store refuses non-finite
  rewards and advantages and maps NaN metric values to NULL explicitly (read back as NaN).
* Free text (actions, observations, commands, stdout/stderr, anchors) goes through
  ``SafeText``: PostgreSQL's ``text`` cannot hold U+0000 and no driver can encode a lone
  surrogate, so such strings are stored JSON-escaped behind a marker character and decoded
  on read. Every other string is stored verbatim.
* ``loss_mask`` is not stored: it is 0 on ``prompt_ids`` and 1 on ``completion_ids`` by the
  contract of ``agentrl.types``.

Schema changes go through Alembic (``agentrl.replay.migrations``: the revisions ship inside
the package, and ``ReplayStore`` upgrades a database to the head revision when it opens it).
A change to any table here needs a new revision there and a bump of ``SCHEMA_VERSION``, which
the one-row ``schema_version`` table still holds so that an agentrl release older than
Alembic refuses a newer database with a clear error. Databases of schema_version 3, 4 and 5
(made before Alembic, no ``alembic_version`` table) are upgraded in place: 3 → 4 adds the
``iterations`` table (iterations stored before carry no completion mark), 4 → 5 the column
``turns.policy_versions`` (a turn stored before reads back with every token at the turn's
``policy_version``), then the baseline revision is stamped and the revisions after it run.
Schema 6 (revision ``0006``): ``turns.trainer_log_probs`` and ``turns.entropies`` (NULL on
turns stored before, or not trained), ``episodes.kind`` (``'train'`` for every older
episode), the ``reruns`` table, the viewer's indexes and the full-text index over actions
and observations (``agentrl.replay.search_index``). Schema 7 (revision ``0007``): the index
``ix_metrics_key`` (run_id, key, iteration, value), which serves one metric's series of a run.
Schema 8 (revision ``0008``): no table changes; the ``iteration`` columns (episodes, metrics,
completion marks) number training iterations from 1, as every other place a user sees an
iteration (docs/design.md, "Iteration numbering"; 0 holds what precedes training), and the
rows stored 0-based before are shifted by one. Schema 9 (revision ``0009``): ``turns.branch``
and ``turns.tool_calls`` (0 on turns stored before: one branch, no tool calls reported) and
``episodes.counters`` (NULL: none, on every episode stored before). Schema 10 (revision
``0010``): the tables ``judgements`` (``Episode.judgement``, one row per judged episode) and
``judge_cache`` (the judge's answers by prompt digest).
"""

from __future__ import annotations

import ast
import json
from datetime import datetime, timezone
from typing import Any, Hashable, Literal, Sequence

import numpy as np
from sqlalchemy import (
    JSON,
    BigInteger,
    Boolean,
    DateTime,
    Double,
    ForeignKey,
    ForeignKeyConstraint,
    Index,
    Integer,
    LargeBinary,
    String,
    Text,
    UniqueConstraint,
)
from sqlalchemy.engine import Dialect
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.types import TypeDecorator

from agentrl.errors import ContractError

SCHEMA_VERSION = 10
"""Version of the tables below. Bump it with every schema change, together with a new Alembic
revision (4: the ``iterations`` table of completion marks; 5: ``turns.policy_versions``,
per-token weight versions; 6: trainer-side log-probs and entropies, ``episodes.kind``,
``reruns``, the viewer's indexes and full-text search; 7: the index of ``metrics`` by key;
8: iterations numbered from 1; 9: ``turns.branch``, ``turns.tool_calls``, ``episodes.counters``;
10: the ``judgements`` and ``judge_cache`` tables)."""

EPISODE_KINDS = ("train", "eval", "profile")
"""Values of ``episodes.kind``: training rollouts, evaluation episodes, and a training run's
difficulty-profile episodes (``agentrl.commands.profile``), each kept apart from the others."""

TOKEN_DTYPE = np.dtype("<i4")
"""On-disk dtype of token ids: little-endian int32."""
LOG_PROB_DTYPE = np.dtype("<f8")
"""On-disk dtype of log-probs: little-endian float64 (bit-exact for Python floats)."""

_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1
_SAFE_TEXT_MARK = "\ufdd0"  # a Unicode noncharacter: never produced by tokenizers or tools


# ---------------------------------------------------------------------------------------
# Codecs (pure functions; unit-tested in tests/unit/replay)
# ---------------------------------------------------------------------------------------


def pack_token_ids(ids: Sequence[int], *, what: str = "token ids") -> bytes:
    """Pack token ids ``[N]`` into ``4 * N`` bytes of little-endian int32.

    Raises:
        ContractError: an id is not an integer or lies outside ``[-2**31, 2**31 - 1]``.
    """
    arr = np.asarray(ids)
    if arr.size == 0:
        return b""
    if arr.ndim != 1 or arr.dtype.kind not in "iu":
        raise ContractError(f"{what} must be a flat list of ints; got dtype {arr.dtype}, shape {arr.shape}")
    lo, hi = int(arr.min()), int(arr.max())
    if lo < _INT32_MIN or hi > _INT32_MAX:
        bad = lo if lo < _INT32_MIN else hi
        raise ContractError(f"{what} contain {bad}, outside the int32 range the replay store packs")
    return arr.astype(TOKEN_DTYPE).tobytes()


def unpack_token_ids(blob: bytes) -> list[int]:
    """Inverse of ``pack_token_ids``: ``bytes`` → list of Python ints ``[len(blob) // 4]``."""
    return np.frombuffer(blob, dtype=TOKEN_DTYPE).tolist()


def pack_floats(values: Sequence[float], *, what: str = "values") -> bytes:
    """Pack floats ``[N]`` into ``8 * N`` bytes of little-endian float64 (bit-exact).

    Raises:
        ContractError: ``values`` is not a flat sequence of real numbers.
    """
    try:
        arr = np.asarray(values, dtype=LOG_PROB_DTYPE)
    except (TypeError, ValueError) as exc:
        raise ContractError(f"{what} must be a flat list of floats: {exc}") from exc
    if arr.ndim != 1:
        raise ContractError(f"{what} must be a flat list of floats; got shape {arr.shape}")
    return arr.tobytes()


def unpack_floats(blob: bytes) -> list[float]:
    """Inverse of ``pack_floats``: ``bytes`` → list of Python floats ``[len(blob) // 8]``."""
    return np.frombuffer(blob, dtype=LOG_PROB_DTYPE).tolist()


AnchorKind = Literal["str", "literal", "repr"]


def encode_anchor(anchor: Hashable) -> tuple[str, AnchorKind]:
    """Text form of a GiGPO anchor and how to read it back.

    Returns ``(text, kind)``: a ``str`` anchor is stored as is (``"str"``); an anchor whose
    ``repr`` is a Python literal that evaluates back to an equal value of the same type (ints,
    floats, bools, ``None``, bytes and tuples of these, e.g. ``(3, 4)``) is stored as that
    repr (``"literal"``, exact round trip); any other hashable is stored as its ``repr``
    (``"repr"``, read back as that string: lossy, for humans only).
    """
    if isinstance(anchor, str):
        return anchor, "str"
    text = repr(anchor)
    try:
        back = ast.literal_eval(text)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return text, "repr"
    if type(back) is type(anchor) and repr(back) == text:
        return text, "literal"
    return text, "repr"


def decode_anchor(text: str, kind: str) -> Hashable:
    """Inverse of ``encode_anchor``. Raises ``ContractError`` on an unknown ``kind``."""
    if kind in ("str", "repr"):
        return text
    if kind == "literal":
        return ast.literal_eval(text)
    raise ContractError(f"anchor_kind={kind!r} in the database; expected 'str', 'literal' or 'repr'")


def _needs_escape(value: str) -> bool:
    if "\x00" in value or value.startswith(_SAFE_TEXT_MARK):
        return True
    if value.isascii():
        return False
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates
        return True
    return False


def escape_text(value: str) -> str:
    """Make ``value`` storable in any SQL text column (no U+0000, no lone surrogate).

    Strings that need it become ``MARK + json.dumps(value)`` (ASCII-only); others are
    returned unchanged. ``unescape_text(escape_text(s)) == s`` for every ``str``.
    """
    if _needs_escape(value):
        return _SAFE_TEXT_MARK + json.dumps(value, ensure_ascii=True)
    return value


def unescape_text(stored: str) -> str:
    """Inverse of ``escape_text``."""
    if stored.startswith(_SAFE_TEXT_MARK):
        return json.loads(stored[len(_SAFE_TEXT_MARK):])
    return stored


class SafeText(TypeDecorator[str]):
    """``Text`` that round-trips every Python ``str`` on SQLite and PostgreSQL."""

    impl = Text
    cache_ok = True

    def process_bind_param(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else escape_text(value)

    def process_result_value(self, value: str | None, dialect: Dialect) -> str | None:
        return None if value is None else unescape_text(value)


class UTCDateTime(TypeDecorator[datetime]):
    """Timezone-aware UTC ``datetime`` on both dialects.

    SQLite keeps no zone: values are stored as naive UTC and read back with ``tzinfo=UTC``.
    Naive input is refused (``ContractError``) rather than guessed.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            raise ContractError(f"datetime {value!r} has no time zone; expected an aware UTC datetime")
        value = value.astimezone(timezone.utc)
        return value.replace(tzinfo=None) if dialect.name == "sqlite" else value

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


def utcnow() -> datetime:
    return datetime.now(timezone.utc)


# ---------------------------------------------------------------------------------------
# Tables
# ---------------------------------------------------------------------------------------

_ID = String(200)
_AUTO_ID = BigInteger().with_variant(Integer, "sqlite")  # SQLite autoincrements INTEGER PKs only


class Base(DeclarativeBase):
    pass


class SchemaVersionRow(Base):
    """One row (``id == 1``): the schema version of this database."""

    __tablename__ = "schema_version"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    version: Mapped[int] = mapped_column(Integer)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime, default=utcnow)


class RunRow(Base):
    """One training run. A resumed run keeps its row (``resume_count`` goes up)."""

    __tablename__ = "runs"
    __table_args__ = (Index("ix_runs_created", "created_at", "run_id"),)

    run_id: Mapped[str] = mapped_column(_ID, primary_key=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    finished_at: Mapped[datetime | None] = mapped_column(UTCDateTime)
    config: Mapped[dict[str, Any]] = mapped_column(JSON)
    status: Mapped[str] = mapped_column(String(32))
    resume_count: Mapped[int] = mapped_column(Integer, default=0)


class EpisodeRow(Base):
    """One episode: the ``Episode`` fields plus summaries for listing without the turns."""

    __tablename__ = "episodes"
    __table_args__ = (
        Index("ix_episodes_run_iteration", "run_id", "iteration", "created_at", "position"),
        # The viewer's filters and sort keys (keyset pagination: episode_id breaks ties).
        Index("ix_episodes_kind_iteration", "run_id", "kind", "iteration", "episode_id"),
        Index("ix_episodes_reward", "run_id", "total_reward", "episode_id"),
        Index("ix_episodes_tokens", "run_id", "num_generated_tokens", "episode_id"),
        Index("ix_episodes_turns", "run_id", "num_turns", "episode_id"),
        Index("ix_episodes_termination", "run_id", "termination_reason", "episode_id"),
        Index("ix_episodes_success", "run_id", "success", "episode_id"),
        Index("ix_episodes_group_id", "run_id", "group_id", "episode_id"),
        Index("ix_episodes_policy_version", "run_id", "policy_version_max", "episode_id"),
        Index("ix_episodes_task", "run_id", "task_id", "episode_id"),
        Index("ix_episodes_env", "run_id", "env_id", "episode_id"),
        Index("ix_episodes_created", "run_id", "created_at", "episode_id"),
    )

    episode_id: Mapped[str] = mapped_column(_ID, primary_key=True)
    run_id: Mapped[str] = mapped_column(_ID, ForeignKey("runs.run_id", ondelete="CASCADE"))
    iteration: Mapped[int] = mapped_column(Integer)
    """The iteration the episode was stored with, from 1 (0: before training)."""
    position: Mapped[int] = mapped_column(Integer)
    """Index of the episode in its ``add_episodes`` batch (stable listing order)."""
    group_id: Mapped[str] = mapped_column(_ID)
    env_id: Mapped[str] = mapped_column(_ID)
    task_id: Mapped[str] = mapped_column(SafeText)
    seed: Mapped[int] = mapped_column(BigInteger)
    terminated: Mapped[bool] = mapped_column(Boolean)
    truncated: Mapped[bool] = mapped_column(Boolean)
    termination_reason: Mapped[str | None] = mapped_column(String(32))
    prompt_mode: Mapped[str] = mapped_column(String(16), default="full_history")
    success: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    """The environment's verdict on the task (``info["success"]``), NULL when it gave none."""
    """``full_history`` or ``per_step`` (how the turns' prompt ids relate; see agentrl.types)."""
    total_reward: Mapped[float | None] = mapped_column(Double)
    error: Mapped[dict[str, Any] | None] = mapped_column(JSON)
    num_turns: Mapped[int] = mapped_column(Integer)
    num_generated_tokens: Mapped[int] = mapped_column(Integer)
    policy_version_min: Mapped[int | None] = mapped_column(Integer)
    policy_version_max: Mapped[int | None] = mapped_column(Integer)
    advantage_mean: Mapped[float | None] = mapped_column(Double)
    """Mean of the per-turn advantages; NULL when none were given."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    kind: Mapped[str] = mapped_column(String(8), default="train", server_default="train")
    """``train``, ``eval`` or ``profile`` (``EPISODE_KINDS``): evaluation episodes are stored apart from the
    training rollouts of the same run (every episode stored before schema 6 is ``train``)."""
    counters: Mapped[dict[str, float] | None] = mapped_column(JSON(none_as_null=True), nullable=True)
    """``Episode.counters`` (str -> finite float); NULL when the episode has none (and on every
    episode stored before schema 9)."""


class TurnRow(Base):
    """One ``Turn``. ``loss_mask`` is implied: 0 on ``prompt_ids``, 1 on ``completion_ids``."""

    __tablename__ = "turns"

    episode_id: Mapped[str] = mapped_column(
        _ID, ForeignKey("episodes.episode_id", ondelete="CASCADE"), primary_key=True
    )
    turn_index: Mapped[int] = mapped_column(Integer, primary_key=True)
    prompt_ids: Mapped[bytes] = mapped_column(LargeBinary)
    """Packed ``<i4`` ids ``[P]``."""
    completion_ids: Mapped[bytes] = mapped_column(LargeBinary)
    """Packed ``<i4`` ids ``[C]``."""
    behavior_log_probs: Mapped[bytes] = mapped_column(LargeBinary)
    """Packed ``<f8`` nats ``[C]``."""
    temperature: Mapped[float] = mapped_column(Double)
    top_p: Mapped[float] = mapped_column(Double)
    top_k: Mapped[int] = mapped_column(Integer)
    policy_version: Mapped[int] = mapped_column(Integer)
    """The weight version of the turn's first sampled token."""
    policy_versions: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    """Packed ``<i4`` weight version of each completion id ``[C]`` (``Turn.policy_versions``);
    NULL when every token is ``policy_version`` (the turn did not span a weight update, and
    every turn stored before schema version 5)."""
    finish_reason: Mapped[str] = mapped_column(String(16))
    reward: Mapped[float | None] = mapped_column(Double)
    anchor: Mapped[str] = mapped_column(SafeText)
    anchor_kind: Mapped[str] = mapped_column(String(8))
    """``str`` | ``literal`` | ``repr``: see ``encode_anchor``."""
    action_text: Mapped[str] = mapped_column(SafeText)
    observation_text: Mapped[str] = mapped_column(SafeText)
    invalid_action: Mapped[bool] = mapped_column(Boolean)
    advantage: Mapped[float | None] = mapped_column(Double)
    branch: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """``Turn.branch``: the branch of the episode the turn extends (0 on every turn stored
    before schema 9)."""
    tool_calls: Mapped[int] = mapped_column(Integer, default=0, server_default="0")
    """``Turn.tool_calls``: tool calls the turn's action made, as the env reported (0 on
    every turn stored before schema 9)."""
    trainer_log_probs: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    """Packed ``<f8`` nats ``[C]``: the trainer's log-prob of each completion id, computed in
    the update that trained on the turn (at the weights the update started from, with the
    sampling transform of ``behavior_log_probs``); NULL until an update wrote them (and on a
    turn no update trained: dropped by a filter, an errored episode, an eval episode)."""
    entropies: Mapped[bytes | None] = mapped_column(LargeBinary, nullable=True)
    """Packed ``<f8`` nats ``[C]``: the entropy of the trainer's next-token distribution at
    each completion position, from the same forward pass as ``trainer_log_probs``."""


class SandboxEventRow(Base):
    """One ``ExecResult`` of a turn, in order (``seq``)."""

    __tablename__ = "sandbox_events"
    __table_args__ = (
        ForeignKeyConstraint(
            ["episode_id", "turn_index"],
            ["turns.episode_id", "turns.turn_index"],
            ondelete="CASCADE",
        ),
        UniqueConstraint("episode_id", "turn_index", "seq", name="uq_sandbox_events_order"),
    )

    id: Mapped[int] = mapped_column(_AUTO_ID, primary_key=True, autoincrement=True)
    episode_id: Mapped[str] = mapped_column(_ID)
    turn_index: Mapped[int] = mapped_column(Integer)
    seq: Mapped[int] = mapped_column(Integer)
    command: Mapped[str] = mapped_column(SafeText)
    """The shell string, or the argv joined with ``shlex.join`` for display."""
    argv: Mapped[list[str] | None] = mapped_column(JSON)
    """The argv when the command was given as one (exact round trip), else NULL."""
    exit_code: Mapped[int | None] = mapped_column(Integer)
    stdout: Mapped[str] = mapped_column(SafeText)
    stderr: Mapped[str] = mapped_column(SafeText)
    duration_s: Mapped[float] = mapped_column(Double)
    timed_out: Mapped[bool] = mapped_column(Boolean)
    truncated_bytes: Mapped[int] = mapped_column(BigInteger)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    """When the event was recorded (``ExecResult`` carries no timestamp of its own)."""


class RerunRow(Base):
    """One ``agentrl replay rerun`` of an episode: the recorded actions replayed in a fresh
    environment and sandbox with the same task and seed."""

    __tablename__ = "reruns"
    __table_args__ = (Index("ix_reruns_episode", "episode_id", "created_at"),)

    id: Mapped[int] = mapped_column(_AUTO_ID, primary_key=True, autoincrement=True)
    episode_id: Mapped[str] = mapped_column(_ID, ForeignKey("episodes.episode_id", ondelete="CASCADE"))
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
    same: Mapped[bool | None] = mapped_column(Boolean, nullable=True)
    """Every new observation and reward equalled the recorded one; NULL when the rerun could
    not decide (an infrastructure error: the report says which)."""
    first_divergent_turn: Mapped[int | None] = mapped_column(Integer, nullable=True)
    """0-based index of the first turn that differed; NULL when ``same``."""
    report: Mapped[dict[str, Any]] = mapped_column(JSON)
    """The rerun's per-turn report (its shape belongs to ``agentrl replay rerun``)."""


class MetricRow(Base):
    """One scalar metric of one iteration. NULL ``value`` stands for NaN."""

    __tablename__ = "metrics"
    __table_args__ = (Index("ix_metrics_key", "run_id", "key", "iteration", "value"),)
    """One key's series of a run in iteration order, covering (migration ``0007``)."""

    run_id: Mapped[str] = mapped_column(_ID, ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True)
    iteration: Mapped[int] = mapped_column(Integer, primary_key=True)
    key: Mapped[str] = mapped_column(String(200), primary_key=True)
    value: Mapped[float | None] = mapped_column(Double)


class IterationRow(Base):
    """Completion mark of one iteration of a run: present once the checkpoint that covers
    the iteration is written (``ReplayStore.mark_complete``). An iteration with episodes or
    metrics but no row here is in progress, or belongs to an attempt that a resume will
    discard (``ReplayStore.rewind``)."""

    __tablename__ = "iterations"

    run_id: Mapped[str] = mapped_column(_ID, ForeignKey("runs.run_id", ondelete="CASCADE"), primary_key=True)
    iteration: Mapped[int] = mapped_column(Integer, primary_key=True)
    """Numbered from 1 (0: before training), as ``EpisodeRow.iteration`` and ``MetricRow.iteration``."""
    completed_at: Mapped[datetime] = mapped_column(UTCDateTime)
    """When the mark was written (UTC)."""


class JudgementRow(Base):
    """``Episode.judgement`` (``agentrl.types.JudgeRecord``), one column per field; an episode
    without a judgement has no row. Written and replaced with its episode."""

    __tablename__ = "judgements"

    episode_id: Mapped[str] = mapped_column(
        _ID, ForeignKey("episodes.episode_id", ondelete="CASCADE"), primary_key=True
    )
    model: Mapped[str] = mapped_column(SafeText)
    rubric: Mapped[str] = mapped_column(SafeText)
    rubric_digest: Mapped[str] = mapped_column(String(64))
    """Hex sha256 of the rubric (``Rubric.digest``)."""
    mode: Mapped[str] = mapped_column(String(8))
    """``single`` or ``group``."""
    prompt: Mapped[list[dict[str, Any]]] = mapped_column(JSON)
    """The chat messages sent to the judge (OpenAI format)."""
    output: Mapped[str | None] = mapped_column(SafeText, nullable=True)
    scores: Mapped[dict[str, float]] = mapped_column(JSON)
    """Criterion -> score in [0, 1]."""
    reasons: Mapped[dict[str, str]] = mapped_column(JSON)
    score: Mapped[float | None] = mapped_column(Double, nullable=True)
    gate_failed: Mapped[str | None] = mapped_column(SafeText, nullable=True)
    rule_reward: Mapped[float | None] = mapped_column(Double, nullable=True)
    reward: Mapped[float | None] = mapped_column(Double, nullable=True)
    latency_s: Mapped[float] = mapped_column(Double)
    cached: Mapped[bool] = mapped_column(Boolean)
    judged: Mapped[bool] = mapped_column(Boolean)
    calls: Mapped[int] = mapped_column(Integer)
    parse_errors: Mapped[int] = mapped_column(Integer)
    group_position: Mapped[int | None] = mapped_column(Integer, nullable=True)
    error: Mapped[str | None] = mapped_column(SafeText, nullable=True)
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)


class JudgeCacheRow(Base):
    """One cached judge answer (``ReplayStore.judge_cache_put`` / ``judge_cache_get``): the
    first answer stored for a key is kept."""

    __tablename__ = "judge_cache"

    cache_key: Mapped[str] = mapped_column(String(64), primary_key=True)
    """Hex sha256 (64 characters) of what the judge was asked."""
    model: Mapped[str] = mapped_column(SafeText)
    rubric_digest: Mapped[str] = mapped_column(String(64))
    output: Mapped[str] = mapped_column(SafeText)
    """The judge's raw answer."""
    created_at: Mapped[datetime] = mapped_column(UTCDateTime)
