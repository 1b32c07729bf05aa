"""Connections to a replay database: one engine set-up for the store and the readers, and
``ReplayDB``, the handle every read of ``agentrl.replay.read`` takes.

``open_engine(url, read_only=...)`` parses the URL and makes the SQLAlchemy engine:

* SQLite: a file (never in-memory; WAL needs one). Writable, the parent folder is created,
  the database runs in WAL mode with foreign keys on, and transactions are begun by us
  (``BEGIN``, or ``BEGIN IMMEDIATE`` for a connection carrying the ``WRITE`` execution
  option), so a read sees one snapshot and a second writer waits in the busy timeout.
  Read-only, the file must exist and is opened through a ``mode=ro`` URI
  (sqlite.org/uri.html) with ``PRAGMA query_only``; no pragma that writes runs, so its
  journal mode and bytes stay as found.
* PostgreSQL: read-only sessions start with ``default_transaction_read_only=on``, so a
  write fails in the server. Reads run at ``REPEATABLE READ`` (one snapshot).

``ReplayDB`` wraps an engine with its schema as found (tables, optional columns and indexes
of newer schemas, found by reflection when it is made) and ``read()``, one read transaction.
``ReadOnlyDB(url)`` is a ``ReplayDB`` that opens its own read-only engine and refuses a
database that is not a replay store it can read (``agentrl view``, ``agentrl diagnose``).
"""

from __future__ import annotations

import logging
import os
import sqlite3
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from sqlalchemy import Column, Table, event, inspect, literal, null
from sqlalchemy.engine import Connection, Engine, create_engine, make_url
from sqlalchemy.exc import ArgumentError, DBAPIError, NoSuchModuleError
from sqlalchemy.orm import Session

from agentrl.errors import ConfigError, ContractError, InfraError
from agentrl.replay.migrations import HEAD, current_revision, known_revisions
from agentrl.replay.models import SCHEMA_VERSION, Base, TurnRow

log = logging.getLogger(__name__)

WRITE = "agentrl_replay_write"
"""Connection execution option: the transaction begins with ``BEGIN IMMEDIATE`` (SQLite)."""
SQLITE_BUSY_TIMEOUT_S = 30.0
MIN_SCHEMA_VERSION = 5
"""Oldest ``schema_version`` ``ReadOnlyDB`` reads (per-token policy versions). Older databases,
and revisions newer than this agentrl's (``agentrl.replay.migrations``), are refused; a
database of schema 5 (before Alembic) is read as it is, without the columns 6 added; one of
schema 5-7 holds its iterations numbered from 0 (``ReplayDB.zero_based``), as stored: only a
write access (``ReplayStore``, migration ``0008``) renumbers them from 1."""
REQUIRED_TABLES = ("runs", "episodes", "turns", "sandbox_events", "metrics")

_T = TurnRow.__table__


def open_engine(url: str, *, read_only: bool, busy_timeout_s: float = SQLITE_BUSY_TIMEOUT_S
                ) -> tuple[Engine, str, bool]:
    """The engine of the replay database ``url`` (see the module docstring).

    Returns:
        ``(engine, url with the password hidden, whether it is SQLite)``.

    Raises:
        ConfigError: not a database URL, an in-memory SQLite database, a driver that is not
            installed, or (``read_only``) a SQLite file that does not exist.
    """
    try:
        parsed = make_url(url)
    except ArgumentError as exc:
        raise ConfigError(
            f"replay store url={url!r} is not a database URL; expected e.g. "
            "'sqlite:///runs/replay.db' or 'postgresql+psycopg://user@host/db'"
        ) from exc
    shown = parsed.render_as_string(hide_password=True)
    is_sqlite = parsed.get_backend_name() == "sqlite"
    kwargs: dict[str, Any] = {}
    if is_sqlite:
        if parsed.database in (None, "", ":memory:") or parsed.query.get("mode") == "memory":
            raise ConfigError(
                f"replay store url={shown!r} is an in-memory SQLite database; "
                "expected a file, e.g. 'sqlite:///runs/replay.db' (WAL needs a file)"
            )
        path = os.path.abspath(parsed.database)
        if read_only:
            if not os.path.isfile(path):
                raise ConfigError(f"replay store url={shown!r}: SQLite database {path!r} does not exist; "
                                  "expected the replay.db of a run (read_only creates nothing)")
            parsed = parsed.set(database=f"file:{path}?mode=ro", query={"uri": "true"})
        else:
            os.makedirs(os.path.dirname(path), exist_ok=True)
        kwargs["connect_args"] = {"timeout": float(busy_timeout_s)}
    elif read_only and parsed.get_backend_name() == "postgresql":
        kwargs["connect_args"] = {"options": "-c default_transaction_read_only=on"}
    try:
        engine = create_engine(parsed, **kwargs)
    except (NoSuchModuleError, ModuleNotFoundError, ImportError) as exc:
        raise ConfigError(
            f"replay store url={shown!r}: database driver not available ({exc}); "
            "install it, e.g. `pip install psycopg[binary]` for postgresql+psycopg"
        ) from exc
    if is_sqlite:
        event.listen(engine, "connect", _sqlite_ro_on_connect if read_only else _sqlite_on_connect)
        event.listen(engine, "begin", _sqlite_on_begin)
    return engine, shown, is_sqlite


class ReplayDB:
    """A replay database to read: its engine, its schema as found, and read transactions.

    Args:
        engine: the engine (``open_engine``); the caller owns it unless ``owns_engine``.
        url: the URL with the password hidden (for messages).
        is_sqlite: the engine is SQLite.
        source_url: the URL as given (password included: never shown).
        owns_engine: ``close()`` disposes the engine.

    Raises:
        ContractError: replay tables are missing, or the schema is older than
            ``MIN_SCHEMA_VERSION`` or newer than this agentrl.
        InfraError: the database cannot be read.
    """

    def __init__(self, engine: Engine, url: str, is_sqlite: bool, source_url: str | None = None, *,
                 owns_engine: bool = False) -> None:
        self.engine = engine
        self.url = url
        self.source_url = url if source_url is None else source_url
        self.is_sqlite = is_sqlite
        self._owns_engine = owns_engine
        self._inspect()

    def _inspect(self) -> None:
        try:
            with self.engine.connect() as conn:
                ins = inspect(conn)
                tables = set(ins.get_table_names())
                missing = [t for t in REQUIRED_TABLES if t not in tables]
                if missing:
                    raise ContractError(f"{self.url} is not a replay store: tables {missing} are missing "
                                        f"(found {sorted(tables)[:8]}); expected the replay.db of an agentrl run")
                version = None
                if "schema_version" in tables:
                    version = conn.exec_driver_sql("SELECT version FROM schema_version WHERE id = 1").scalar()
                    if version is not None and int(version) < MIN_SCHEMA_VERSION:
                        raise ContractError(
                            f"{self.url} has replay schema_version {version}; the viewer reads "
                            f"{MIN_SCHEMA_VERSION} and newer: open it once with this agentrl's ReplayStore "
                            "(e.g. `agentrl train --resume`) to upgrade it")
                    if version is not None and int(version) > SCHEMA_VERSION:
                        raise ContractError(f"{self.url} has replay schema_version {version}, newer than this "
                                            f"agentrl's {SCHEMA_VERSION}; view it with a newer agentrl")
                rev = current_revision(conn)
                if rev is not None and rev not in known_revisions():
                    raise ContractError(f"{self.url} is at replay schema revision {rev!r}, newer than this "
                                        f"agentrl's {HEAD!r}; view it with a newer agentrl")
                self.index_prefixes = {t: {tuple(ix["column_names"][:2]) for ix in ins.get_indexes(t)}
                                       for t in ("episodes", "metrics")}
                self.turn_columns = {c["name"] for c in ins.get_columns("turns")}
                self.episode_columns = {c["name"] for c in ins.get_columns("episodes")}
                self.tables = tables
                self.zero_based = version is not None and int(version) < 8
                """The database predates iterations numbered from 1 (schema 8) and is read as stored."""
                if self.zero_based:
                    log.warning("%s has replay schema_version %s: its iterations are shown numbered from 0, as "
                                "stored; open it once with write access (ReplayStore, e.g. `agentrl train --resume`) "
                                "to renumber them from 1", self.url, version)
        except DBAPIError as exc:
            raise InfraError(f"cannot read {self.url}: {exc.orig}") from None

    @property
    def has_fts(self) -> bool:
        """The database has the full-text index of ``agentrl.replay.search_index`` (schema 6)."""
        return "turns_fts" in self.tables if self.is_sqlite else "search_tsv" in self.turn_columns

    def has_index(self, table: str, column: str) -> bool:
        """The database has an index on ``table`` whose columns start with (run_id, column)."""
        return ("run_id", column) in self.index_prefixes.get(table, set())

    @property
    def has_kind(self) -> bool:
        """Episodes carry a ``kind`` (schema 6)."""
        return "kind" in self.episode_columns

    def columns_as_found(self, table: Table) -> list[Any]:
        """Every column of the models' ``table`` for a select on this database, in the models'
        order: a column of ``episodes`` or ``turns`` that this database lacks (added by a later
        revision; a read-only open upgrades nothing) is read as its default, under its name
        (the column's scalar ``default``: ``kind`` ``"train"``, ``branch`` and ``tool_calls``
        0; NULL for the others: ``counters``, ``trainer_log_probs``, ``entropies``)."""
        found = {"episodes": self.episode_columns, "turns": self.turn_columns}.get(table.name)
        if found is None:
            return list(table.c)
        return [c if c.name in found else _default_of(c) for c in table.c]

    def table(self, name: str) -> Table | None:
        """The ORM table ``name`` if both the models and this database have it."""
        return Base.metadata.tables.get(name) if name in self.tables else None

    def turn_col(self, name: str):
        """Column ``turns.name`` when this database and the models have it, else None."""
        return _T.c[name] if name in self.turn_columns and name in _T.c else None

    @contextmanager
    def read(self) -> Iterator[Connection]:
        """One read transaction (one snapshot); errors of the database become ``InfraError``."""
        try:
            with self.engine.connect() as conn:
                if not self.is_sqlite:
                    conn = conn.execution_options(isolation_level="REPEATABLE READ")
                with conn.begin():
                    yield conn
        except DBAPIError as exc:
            raise InfraError(f"reading {self.url} failed: {exc.orig}") from None

    @contextmanager
    def session(self) -> Iterator[Session]:
        """``read()`` as an ORM session (for reads that load mapped rows)."""
        with self.read() as conn, Session(bind=conn, expire_on_commit=False) as s:
            yield s

    def close(self) -> None:
        """Dispose of the engine if this handle opened it (``ReadOnlyDB``)."""
        if self._owns_engine:
            self.engine.dispose()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.url!r})"


def _default_of(column: Column) -> Any:
    """``column``'s scalar default (or NULL) as a select-list expression labelled with its name."""
    default = column.default
    if default is None or not getattr(default, "is_scalar", False) or default.arg is None:
        return null().label(column.name)
    return literal(default.arg, type_=column.type).label(column.name)


class ReadOnlyDB(ReplayDB):
    """A replay database opened for reading only (``open_engine(url, read_only=True)``).

    Args:
        url: SQLAlchemy URL: ``sqlite:////abs/path/replay.db`` or
            ``postgresql+psycopg://user@host/db``.

    Raises:
        ConfigError: not a database URL, a missing SQLite file, or a driver not installed.
        InfraError: the server cannot be reached or the file is not a database.
        ContractError: the database is not a replay store of a schema this agentrl reads
            (missing tables, or a ``schema_version`` older than ``MIN_SCHEMA_VERSION``).
    """

    def __init__(self, url: str) -> None:
        engine, shown, is_sqlite = open_engine(url, read_only=True)
        try:
            super().__init__(engine, shown, is_sqlite, url, owns_engine=True)
        except BaseException:
            engine.dispose()
            raise


# ---------------------------------------------------------------------------------------
# SQLite connection set-up
# ---------------------------------------------------------------------------------------


def _sqlite_on_connect(dbapi_conn: Any, _record: Any) -> None:
    # Take transaction control away from the sqlite3 module: it would not BEGIN before a
    # SELECT (no read snapshot) and cannot BEGIN IMMEDIATE. See SQLAlchemy's SQLite docs,
    # "Serializable isolation / Savepoints / Transactional DDL".
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    try:
        _set_wal_mode(cur)
        cur.execute("PRAGMA foreign_keys=ON")
        cur.execute("PRAGMA synchronous=NORMAL")  # durable at checkpoints; safe in WAL mode
    finally:
        cur.close()


def _set_wal_mode(cur: Any) -> None:
    """Switch the database to WAL mode (a setting kept in the file) unless it is in it already.

    The switch needs the exclusive lock. Processes opening a new database at once each hold
    a shared lock while asking for it, and SQLite answers "database is locked" at once
    rather than wait in the busy handler (it would deadlock), so the switch is retried until
    the connection's busy timeout has passed.
    """
    if str(cur.execute("PRAGMA journal_mode").fetchone()[0]).lower() == "wal":
        return
    busy_timeout_s = float(cur.execute("PRAGMA busy_timeout").fetchone()[0]) / 1000.0
    deadline = time.monotonic() + busy_timeout_s
    pause_s = 0.01
    while True:
        try:
            cur.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() + pause_s > deadline:
                raise
        time.sleep(pause_s)
        pause_s = min(pause_s * 2, 0.5)


def _sqlite_ro_on_connect(dbapi_conn: Any, _record: Any) -> None:
    # read-only: our own BEGIN as above, and query_only so that no statement writes; no
    # journal_mode / synchronous pragma (journal_mode=WAL would rewrite the file's header).
    dbapi_conn.isolation_level = None
    cur = dbapi_conn.cursor()
    try:
        cur.execute("PRAGMA query_only=ON")
    finally:
        cur.close()


def _sqlite_on_begin(conn: Connection) -> None:
    conn.exec_driver_sql("BEGIN IMMEDIATE" if conn.get_execution_options().get(WRITE) else "BEGIN")
