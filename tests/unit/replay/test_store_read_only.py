"""``ReplayStore(read_only=True)`` on SQLite changes nothing: a missing file is a ConfigError
naming it (no folder, no file made), an existing one keeps its journal mode and bytes."""

from __future__ import annotations

import hashlib
import sqlite3
from pathlib import Path

import pytest

from agentrl.errors import ConfigError, ContractError
from agentrl.replay import ReplayStore


def test_read_only_on_a_missing_file_raises_and_creates_nothing(tmp_path: Path) -> None:
    target = tmp_path / "missing" / "dir" / "replay.db"
    with pytest.raises(ConfigError, match="does not exist") as err:
        ReplayStore(f"sqlite:///{target}", read_only=True)
    assert str(target) in str(err.value)
    assert not (tmp_path / "missing").exists()


def test_read_only_keeps_the_journal_mode_and_bytes(tmp_path: Path) -> None:
    path = tmp_path / "replay.db"
    with ReplayStore(f"sqlite:///{path}") as store:
        store.start_run("r", {"a": 1})
        store.add_metrics("r", 0, {"x": 1.0})
    con = sqlite3.connect(path)
    assert con.execute("PRAGMA journal_mode=DELETE").fetchone()[0] == "delete"
    con.close()
    before = hashlib.sha256(path.read_bytes()).hexdigest()
    with ReplayStore(f"sqlite:///{path}", read_only=True) as store:
        assert [r.run_id for r in store.runs()] == ["r"]
        assert store.metrics("r") == {0: {"x": 1.0}}
        with pytest.raises(ContractError, match="read_only"):
            store.add_metrics("r", 1, {"x": 2.0})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["replay.db"]
    assert hashlib.sha256(path.read_bytes()).hexdigest() == before
    con = sqlite3.connect(path)
    try:
        assert con.execute("PRAGMA journal_mode").fetchone()[0] == "delete"
    finally:
        con.close()


def test_read_only_reads_a_wal_file_a_writer_has_open(tmp_path: Path) -> None:
    path = tmp_path / "replay.db"
    with ReplayStore(f"sqlite:///{path}") as writer:
        writer.start_run("r", {})
        with ReplayStore(f"sqlite:///{path}", read_only=True) as reader:
            writer.add_metrics("r", 0, {"x": 3.0})
            assert reader.metrics("r") == {0: {"x": 3.0}}
