"""``ReplayStore``: episodes, turns, sandbox events and metrics of training runs, in SQL.

One code path for SQLite (``sqlite:///runs/replay.db``, the embedded default) and PostgreSQL
(``postgresql+psycopg://user@host/db``, for clusters). What is stored and how is described in
``agentrl.replay.models``.

Semantics worth knowing:

* **Idempotent writes (upsert).** ``add_episodes`` replaces an episode whose ``episode_id`` is
  already stored *in the same run*: its row, turns and sandbox events are deleted and written
  again in the same transaction, so writing an episode twice leaves exactly one copy, holding
  the latest data. An ``episode_id`` stored under a *different* run, or given twice in one
  batch, raises ``ContractError`` and nothing is written. ``add_metrics`` likewise replaces
  the value of a ``(run, iteration, key)`` it already holds.
* **Iteration numbers.** Training iterations are numbered from 1, as everywhere a user sees
  them (docs/design.md, "Iteration numbering"): the first iteration's rows carry 1, the
  checkpoint after ``N`` iterations covers iterations ``1 .. N``. Iteration 0 holds what
  precedes training (``agentrl eval``'s rows); a training run stores nothing there.
  Databases written before this numbering are shifted on open (migration ``0008``).
* **Complete iterations.** An iteration's rows are written before the checkpoint that covers
  it (with ``run.checkpoint_every > 1``, several iterations before it). ``mark_complete`` marks
  the iterations a checkpoint covers; until then an iteration is in progress, and a crash
  abandons it. Reads take ``complete_only=True`` to see only marked iterations;
  ``completed_iterations`` lists them and ``EpisodeSummary.complete`` says it per episode. A
  complete iteration is frozen: writing episodes or metrics into it is refused.
* **Resume.** ``start_run`` on a known ``run_id`` keeps its row (and ``created_at``), sets the
  status back to ``running``, stores the new config and counts the resume. The controller then
  calls ``rewind(run_id, iterations_done)`` with the checkpoint's iteration count: every row
  of later iterations (the abandoned attempt) is deleted and the earlier ones are marked
  complete, so after the re-run each iteration is stored exactly once (the re-run's episodes
  also keep their ids: see ``EpisodeRequest.episode_id``).
* **Transactions.** Every public method is one transaction. On SQLite the store issues its
  own ``BEGIN`` (``BEGIN IMMEDIATE`` for writes) instead of the ``sqlite3`` module's implicit
  transactions, so a read sees one snapshot and a second writer waits (30 s busy timeout)
  instead of failing; the database runs in WAL mode with foreign keys on. On PostgreSQL reads
  run at ``REPEATABLE READ`` for the same one-snapshot guarantee. A write that still loses
  to another process (SQLite: locked past the busy timeout; PostgreSQL: a deadlock or
  serialization failure) is tried again, 3 times in all, then raises ``InfraError`` saying
  so (``_retry_writes``).
* **Threads.** A store may be shared between threads: each call checks a connection out of
  the engine's pool for its own duration. Several writing processes (a training run, an
  evaluation, ``agentrl replay rerun``) and any number of readers (the viewer) may share one
  database; four writing processes at once lose nothing (tests/integration/replay/
  test_replay_concurrent_writers.py).
* **Reads.** Every read is one function of ``agentrl.replay.read`` (the viewer, ``agentrl
  diagnose`` and ``agentrl replay rerun`` use the same ones) on this store's engine
  (``ReplayStore.db``); the store's read methods (``agentrl.replay.store_reads``) delegate
  to them and raise ``ContractError`` for an unknown run or episode where the functions give
  ``None``. The writes' row building and their completion marks are in
  ``agentrl.replay.episode_writes`` and ``agentrl.replay.iteration_marks``.
* **Schema.** Opening a database brings it to the newest Alembic revision
  (``agentrl.replay.migrations``; pre-Alembic databases of schema 3-5 included), or with
  ``read_only=True`` only checks that it is there.
* **Kinds, trainer values, reruns.** ``add_episodes(..., kind="eval")`` keeps evaluation
  episodes apart (``list_episodes`` / ``count_episodes`` take ``kind``; ``None`` counts
  every kind). The update's per-token log-probs and entropies go in with
  ``trainer_values=`` (or later, ``set_trainer_values``) and come back with
  ``get_trainer_values``. ``add_rerun`` / ``reruns`` hold ``agentrl replay rerun`` results.
* **Judge.** ``Episode.judgement`` is written with its episode (table ``judgements``) and
  read back by ``get_episode``. ``judge_cache_put`` / ``judge_cache_get`` hold the judge's raw
  answers by key (the first answer for a key is kept).
* **PostgreSQL** needs a driver: ``pip install "psycopg[binary]"`` for ``postgresql+psycopg``.
  Two writers replacing the same episode at once are serialized by row locks (a deadlock is
  retried, above); opening a new database takes an advisory lock while the schema is made.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

from sqlalchemy import delete
from sqlalchemy.dialects.postgresql import insert as pg_insert
from sqlalchemy.dialects.sqlite import insert as sqlite_insert
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, IntegrityError, ProgrammingError
from sqlalchemy.orm import Session

from agentrl.errors import ContractError, InfraError
from agentrl.replay import migrations
from agentrl.replay.codec import (
    as_int,
    check_id,
    check_iteration,
    chunks,
    finite_trainer_values,
    json_object,
    judge_cache_rows,
    rerun_row,
)
from agentrl.replay.episode_writes import (
    batch_rows,
    replace_episodes,
    write_trainer_values,
)
from agentrl.replay.iteration_marks import delete_from, mark_done, refuse_complete
from agentrl.replay.models import Base, EpisodeRow, JudgeCacheRow, MetricRow, RerunRow, RunRow, utcnow
from agentrl.replay.read import EpisodeSummary, ReplayDB, RerunInfo, RunInfo, RunStatus
from agentrl.replay.read.db import SQLITE_BUSY_TIMEOUT_S, WRITE, open_engine
from agentrl.replay.read.episodes import episode_in
from agentrl.replay.read.runs import run_info
from agentrl.replay.retry import retry_writes as _retry_writes
from agentrl.replay.store_reads import StoreReads
from agentrl.types import Episode

__all__ = ["EpisodeSummary", "ReplayStore", "RerunInfo", "RunInfo", "RunStatus"]


class ReplayStore(StoreReads):
    """Stores and reads back training runs (the read methods: ``StoreReads``).

    Args:
        url: SQLAlchemy database URL, e.g. ``sqlite:///runs/replay.db`` (the parent folder is
            created; read_only: the file must exist and is opened ``mode=ro``) or ``postgresql+psycopg://user@host/dbname``.
        read_only: never write (the viewer): the schema is checked, not created or
            upgraded, and every write method raises ``ContractError``.
        busy_timeout_s: SQLite: how long one write waits for another process's write lock
            before the attempt fails (each write is tried ``WRITE_ATTEMPTS`` times).

    Raises:
        ConfigError: the URL cannot be parsed or names a driver that is not installed, or
            (``read_only``) a SQLite file that does not exist.
        InfraError: the database cannot be reached or opened (server down, unwritable file).
        ContractError: the database is at a schema revision newer than this agentrl, or
            of a pre-Alembic ``schema_version`` it cannot upgrade, or (``read_only``) not
            at the head revision (the messages name both versions); or it holds replay
            tables without a version (not made by this store).
    """

    def __init__(self, url: str, *, read_only: bool = False,
                 busy_timeout_s: float = SQLITE_BUSY_TIMEOUT_S) -> None:
        self._read_only = bool(read_only)
        self._busy_timeout_s = float(busy_timeout_s)
        self._engine, self._url_text, self._is_sqlite = open_engine(
            url, read_only=self._read_only, busy_timeout_s=self._busy_timeout_s)
        try:
            self._open_schema()
            self._db = ReplayDB(self._engine, self._url_text, self._is_sqlite, url)
        except BaseException:
            self._engine.dispose()
            raise

    # -- lifecycle ----------------------------------------------------------------------

    @property
    def engine(self) -> Engine:
        """The SQLAlchemy engine (for tests)."""
        return self._engine

    @property
    def db(self) -> ReplayDB:
        """This store's database for the read functions of ``agentrl.replay.read``."""
        return self._db

    @property
    def url(self) -> str:
        """The database URL, password hidden."""
        return self._url_text

    def close(self) -> None:
        """Close every pooled connection. The store must not be used afterwards."""
        self._engine.dispose()

    def __enter__(self) -> "ReplayStore":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"ReplayStore({self._url_text!r})"

    def _open_schema(self) -> None:
        """Bring the database to the head revision (``agentrl.replay.migrations.upgrade``:
        an empty one gets every table, a pre-Alembic one of schema 3-5 is upgraded in place),
        or, read-only, check that it is there. Runs as one write transaction (on SQLite under
        the write lock, on PostgreSQL under an advisory lock), so processes opening a new
        database at once do not both create it."""
        for attempt in (1, 2):
            try:
                if self._read_only:
                    with self._engine.connect() as conn, conn.begin():
                        migrations.check_current(conn, self._url_text)
                    return
                with self._write() as s:
                    migrations.upgrade(s.connection(), self._url_text, set(Base.metadata.tables))
                return
            except (IntegrityError, ProgrammingError) as exc:
                # A concurrent opener created the tables first ("already exists"); the
                # second attempt finds them.
                if attempt == 2:
                    raise InfraError(
                        f"cannot set up the replay database {self._url_text}: {exc.orig}"
                    ) from exc
            except DBAPIError as exc:
                raise InfraError(
                    f"cannot open the replay database {self._url_text}: {exc.orig}"
                ) from exc

    @contextmanager
    def _write(self) -> Iterator[Session]:
        if self._read_only:
            raise ContractError(f"replay store {self._url_text} was opened read_only=True; writing is refused")
        with self._engine.connect() as conn:
            conn.execution_options(**{WRITE: True})
            with Session(bind=conn, expire_on_commit=False) as session, session.begin():
                yield session

    # -- runs ---------------------------------------------------------------------------

    @_retry_writes
    def start_run(self, run_id: str, config: Mapping[str, Any]) -> RunInfo:
        """Create run ``run_id``, or resume it (same row, status back to ``running``).

        Args:
            config: the run's configuration, JSON-serializable (no NaN/inf).

        Raises:
            ContractError: empty ``run_id`` or a config that is not JSON-serializable.
        """
        check_id("run_id", run_id)
        config = json_object("config", config)
        now = utcnow()
        with self._write() as s:
            row = s.get(RunRow, run_id)
            if row is None:
                row = RunRow(run_id=run_id, created_at=now, finished_at=None, config=config,
                             status=RunStatus.RUNNING.value, resume_count=0)
                s.add(row)
            else:
                row.config = config
                row.status = RunStatus.RUNNING.value
                row.finished_at = None
                row.resume_count += 1
            s.flush()
            return run_info(row)

    @_retry_writes
    def finish_run(self, run_id: str, status: RunStatus | str) -> None:
        """Set the final status of a run (``finished``, ``failed`` or ``interrupted``).

        Raises:
            ContractError: unknown ``run_id``, or a status that is not a ``RunStatus``.
        """
        try:
            st = RunStatus(status)
        except ValueError:
            raise ContractError(
                f"status={status!r}; expected one of {[s.value for s in RunStatus]}"
            ) from None
        with self._write() as s:
            row = self._run_row(s, run_id)
            row.status = st.value
            row.finished_at = None if st is RunStatus.RUNNING else utcnow()

    def _run_row(self, s: Session, run_id: str) -> RunRow:
        row = s.get(RunRow, run_id)
        if row is None:
            raise ContractError(f"run_id={run_id!r} is not in {self._url_text}; call start_run first")
        return row

    # -- writing episodes and metrics ---------------------------------------------------

    @_retry_writes
    def add_episodes(
        self,
        run_id: str,
        iteration: int,
        episodes: Sequence[Episode],
        advantages: Mapping[str, Sequence[float]] | None = None,
        *,
        kind: str = "train",
        trainer_values: Mapping[str, Sequence[tuple[Sequence[float], Sequence[float]] | None]] | None = None,
    ) -> int:
        """Store a batch of episodes with their turns and sandbox events, in one transaction.

        Args:
            run_id: a run created with ``start_run``.
            iteration: the iteration the episodes belong to (from 1; 0 before training).
            episodes: valid episodes (``Episode.validate`` is applied), errored ones included.
            advantages: optional ``{episode_id: [one float per turn]}``; finite values, or
                ``None`` for a turn left out of the loss (overlong filtering). Stored per
                turn, with the mean of the non-None ones on the episode (NULL when none).
                Episodes absent here get NULL.
            kind: ``"train"`` (rollouts of the training loop), ``"eval"`` or ``"profile"``
                (a run's difficulty profile, ``agentrl.commands.profile``).
            trainer_values: optional ``{episode_id: [per turn: (log_probs [C], entropies [C])
                or None]}`` from the update that trained on them (see ``set_trainer_values``).
                A turn whose values hold a non-finite number (a diverging update) is stored
                as NULL rather than refused: diagnostic values never block the episodes
                (``codec.finite_trainer_values``; the training loop counts them in
                ``replay/trainer_values_nonfinite_turns``).

        Returns:
            How many of the episodes replaced ones already stored (0 for a fresh iteration).

        Raises:
            ContractError: unknown run, negative iteration, an iteration already marked
                complete, an invalid episode, a token id outside int32, a non-finite reward
                or advantage, advantages for an episode not in the batch or of the wrong
                length, an ``episode_id`` repeated in the batch or stored under another run.
                Nothing is written then.
        """
        iteration = check_iteration(iteration)
        batch = batch_rows(run_id, iteration, episodes, dict(advantages or {}), kind, utcnow())
        with self._write() as s:
            self._run_row(s, run_id)
            refuse_complete(s, run_id, iteration)
            replaced = replace_episodes(s, run_id, batch, self._url_text)
            if trainer_values:
                write_trainer_values(s, {e.episode_id: e for e in episodes}, finite_trainer_values(trainer_values)[0])
        return replaced

    @_retry_writes
    def set_trainer_values(
        self, run_id: str,
        values: Mapping[str, Sequence[tuple[Sequence[float], Sequence[float]] | None]],
    ) -> int:
        """Store the trainer-side log-prob and entropy of each sampled token of stored turns
        (computed in the update that trained on them; ``agentrl.replay.trainer_values``
        builds ``values`` from the update's batch), in one transaction.

        Args:
            run_id: the run the episodes are stored under.
            values: ``{episode_id: [per turn: (log_probs [C], entropies [C]) or None]}``:
                nats, one per completion id of the turn (``C``), finite; ``None`` leaves a
                turn's values as they are (NULL: a turn no update trained on).

        Returns:
            How many turns were written.

        Raises:
            ContractError: unknown run or episode (or one of another run), an iteration
                already marked complete, a list of the wrong length or a non-finite value.
                Nothing is written then.
        """
        with self._write() as s:
            self._run_row(s, run_id)
            eps: dict[str, Episode] = {}
            for eid in values:
                row = s.get(EpisodeRow, eid)
                if row is None or row.run_id != run_id:
                    raise ContractError(f"episode_id={eid!r} is not stored under run {run_id!r}")
                refuse_complete(s, run_id, row.iteration)
                eps[eid] = episode_in(s, row)
            return write_trainer_values(s, eps, values)

    # -- reruns -------------------------------------------------------------------------

    @_retry_writes
    def add_rerun(self, episode_id: str, *, same: bool | None, first_divergent_turn: int | None,
                  report: Mapping[str, Any]) -> int:
        """Record one ``agentrl replay rerun`` of a stored episode.

        Args:
            same: every replayed observation and reward equalled the recorded one; ``None``:
                the rerun could not decide (an infrastructure error, described in ``report``).
            first_divergent_turn: 0-based turn of the first difference; given exactly when
                ``same is False``.
            report: the per-turn report, JSON-serializable (no NaN/inf).

        Returns:
            The rerun's id.

        Raises:
            ContractError: unknown episode, ``same`` and ``first_divergent_turn`` that
                disagree, a turn outside the episode, a report that is not JSON.
        """
        with self._write() as s:
            row = s.get(EpisodeRow, episode_id)
            if row is None:
                raise ContractError(f"episode_id={episode_id!r} is not in {self._url_text}")
            values = rerun_row(row, same, first_divergent_turn, report, utcnow())
            return int(s.execute(RerunRow.__table__.insert().returning(RerunRow.id), [values]).scalar_one())

    @_retry_writes
    def add_metrics(self, run_id: str, iteration: int, metrics: Mapping[str, float]) -> None:
        """Store scalar metrics of one iteration; a key already stored is overwritten.

        Values are converted with ``float()`` (numpy and 0-d torch scalars work). NaN is
        stored as NULL and read back as NaN; ±inf is kept.

        Raises:
            ContractError: unknown run, negative iteration, an iteration already marked
                complete, an empty or non-``str`` key, or a value ``float()`` rejects.
        """
        iteration = check_iteration(iteration)
        rows = []
        for key, value in metrics.items():
            if not isinstance(key, str) or not key:
                raise ContractError(f"metric key {key!r} must be a non-empty str")
            try:
                v = float(value)
            except (TypeError, ValueError):
                raise ContractError(f"metric {key!r}={value!r} is not a real number") from None
            rows.append({"run_id": run_id, "iteration": iteration, "key": key,
                         "value": None if math.isnan(v) else v})
        with self._write() as s:
            self._run_row(s, run_id)
            refuse_complete(s, run_id, iteration)
            for chunk in chunks(sorted(metrics)):
                s.execute(delete(MetricRow).where(
                    MetricRow.run_id == run_id, MetricRow.iteration == iteration, MetricRow.key.in_(chunk)
                ))
            if rows:
                s.execute(MetricRow.__table__.insert(), rows)

    # -- judge cache -------------------------------------------------------------------

    @_retry_writes
    def judge_cache_put(self, entries: Sequence[tuple[str, str, str, str]]) -> None:
        """Store judge answers ``(cache_key, model, rubric_digest, output)`` in one
        transaction: ``cache_key`` is a hex sha256 (64 lowercase hex characters) of what the
        judge was asked, ``output`` its raw answer. Idempotent: a key already stored (or
        repeated in ``entries``) keeps its first answer (``INSERT ... ON CONFLICT DO
        NOTHING``, so two processes storing one key at once do not fail). Read back with
        ``judge_cache_get``.

        Raises:
            ContractError: a key that is not a hex sha256, a model or output that is not a
                ``str``, a rubric digest longer than 64 characters; nothing is written then.
        """
        rows = judge_cache_rows(entries, utcnow())
        if not rows:
            return
        insert = sqlite_insert if self._is_sqlite else pg_insert
        stmt = insert(JudgeCacheRow.__table__).on_conflict_do_nothing(index_elements=["cache_key"])
        with self._write() as s:
            s.execute(stmt, rows)

    # -- complete iterations and resume -------------------------------------------------

    @_retry_writes
    def mark_complete(self, run_id: str, iterations_done: int) -> list[int]:
        """Mark iterations ``1 .. iterations_done`` of the run complete, and iteration 0 when
        it holds rows (episodes or metrics): call it once the checkpoint taken after
        ``iterations_done`` iterations is written (``agentrl eval``, whose rows are iteration
        0: with 0). Marks already present are kept (with their time).

        Returns:
            The iterations newly marked, ascending.

        Raises:
            ContractError: unknown run, or ``iterations_done`` not an int >= 0.
        """
        n = as_int("iterations_done", iterations_done, 0, 2**31 - 1)
        with self._write() as s:
            self._run_row(s, run_id)
            return mark_done(s, run_id, n)

    @_retry_writes
    def rewind(self, run_id: str, iterations_done: int) -> int:
        """Prepare a resume from the checkpoint taken after ``iterations_done`` iterations,
        in one transaction: delete every episode (with its turns and sandbox events), metric
        and completion mark of iterations ``> iterations_done`` (the attempt the crash
        abandoned, about to be re-run), and of iteration 0 too when ``iterations_done`` is 0
        (no checkpoint covers anything: the run starts over); then mark the iterations the
        checkpoint covers complete as ``mark_complete`` does (this repairs a crash between
        writing the checkpoint and ``mark_complete``).

        Returns:
            How many episodes were deleted.

        Raises:
            ContractError: unknown run, or ``iterations_done`` not an int >= 0.
        """
        n = as_int("iterations_done", iterations_done, 0, 2**31 - 1)
        first = n + 1 if n > 0 else 0  # the first iteration the checkpoint does not cover
        with self._write() as s:
            self._run_row(s, run_id)
            dropped = delete_from(s, run_id, first)
            mark_done(s, run_id, n)
            return dropped
