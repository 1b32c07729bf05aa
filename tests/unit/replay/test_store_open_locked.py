"""Opening a SQLite replay database while another process holds its write lock.

Switching a database into WAL mode needs the exclusive lock; a connection that asks for it
while another holds the write (RESERVED) lock gets "database is locked" at once, without
SQLite's busy wait. Several writers opening a new database at once hit exactly that, so the
store retries the switch within its busy timeout.
"""

from __future__ import annotations

import sqlite3
import threading

import pytest

from agentrl.errors import InfraError
from agentrl.replay.store import ReplayStore


def _hold_write_lock(path, hold_s: float) -> tuple[sqlite3.Connection, threading.Timer]:
    holder = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    holder.execute("BEGIN IMMEDIATE")  # the write lock, as a writer mid-transaction holds it
    holder.execute("CREATE TABLE other_writer (x INTEGER)")
    release = threading.Timer(hold_s, lambda: holder.execute("ROLLBACK"))
    release.start()
    return holder, release


def test_a_store_opened_while_another_connection_holds_the_write_lock_waits_for_it(tmp_path):
    path = tmp_path / "replay.db"
    holder, release = _hold_write_lock(path, hold_s=0.5)
    try:
        with ReplayStore(f"sqlite:///{path}", busy_timeout_s=10) as store:
            assert store.runs() == []
        mode = sqlite3.connect(path).execute("PRAGMA journal_mode").fetchone()[0]
        assert mode == "wal"
    finally:
        release.join()
        holder.close()


def test_a_lock_held_past_the_busy_timeout_is_a_clear_infra_error(tmp_path):
    path = tmp_path / "replay.db"
    holder, release = _hold_write_lock(path, hold_s=3.0)
    try:
        with pytest.raises(InfraError, match=r"cannot open the replay database .*replay\.db: database is locked"):
            ReplayStore(f"sqlite:///{path}", busy_timeout_s=0.5)
    finally:
        release.join()
        holder.close()
