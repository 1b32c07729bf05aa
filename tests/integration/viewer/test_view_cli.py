"""``agentrl view``: bad input gets one clear error line and exit status 2 (no traceback); the
server binds 127.0.0.1 unless told otherwise, and another address prints a warning. The
server tests start the real command (uvicorn) in a subprocess and talk HTTP to it."""

from __future__ import annotations

import socket
import sqlite3
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from agentrl.cli import app
from agentrl.replay import ReplayStore

from tests.integration.viewer.viewer_data import episode

START_TIMEOUT_S = 60.0


@pytest.fixture(scope="module")
def small_db(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("view-cli") / "replay.db"
    store = ReplayStore(f"sqlite:///{path}")
    try:
        store.start_run("run-cli", {"env": {"id": "agentrl/Test-v0"}, "model": {"path": "no-such-model"}})
        store.add_episodes("run-cli", 0, [episode("cli-0", "task-0", "g0", 1.0)])
    finally:
        store.close()
    return path


def _bad_inputs(tmp: Path) -> list[tuple[str, str]]:
    (tmp / "notes.txt").write_text("not a database")
    other = tmp / "other.db"
    with sqlite3.connect(other) as conn:
        conn.execute("CREATE TABLE users (name TEXT)")
    (tmp / "empty_run").mkdir()
    return [
        (str(tmp / "missing"), "does not exist; expected a run directory, a replay.db file or a database URL"),
        (str(tmp / "notes.txt"), "file is not a database"),
        (str(other), "is not a replay store: tables"),
        (str(tmp / "empty_run"), "has no replay.db"),
        ("sqlite:///" + str(tmp / "nope.db"), "does not exist; expected the replay.db of a run"),
    ]


def test_bad_input_is_one_error_line(tmp_path: Path) -> None:
    runner = CliRunner()
    for target, message in _bad_inputs(tmp_path):
        result = runner.invoke(app, ["view", target])
        out = " ".join(result.output.split())  # rich wraps long lines
        assert result.exit_code == 2, (target, result.output)
        assert "error:" in out and message in out, (target, out)
        assert "Traceback" not in out
    assert not (tmp_path / "nope.db").exists()  # read-only: the viewer never creates a database


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _serve(db: Path, *args: str) -> tuple[subprocess.Popen, int]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-m", "agentrl.cli", "view", str(db), "--port", str(port), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"agentrl view exited {proc.returncode}: {proc.stderr.read()}")
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=2) as r:
                assert r.status == 200 and "run-cli" in r.read().decode()
            return proc, port
        except OSError:
            time.sleep(0.1)
    proc.kill()
    raise AssertionError(f"agentrl view did not answer on port {port} within {START_TIMEOUT_S} s")


def _stop(proc: subprocess.Popen) -> str:
    proc.terminate()
    try:
        _, err = proc.communicate(timeout=10)
    except subprocess.TimeoutExpired:
        proc.kill()
        _, err = proc.communicate()
    return err


def _listening(pid: int, port: int) -> set[str]:
    return {c.laddr.ip for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN and c.laddr.port == port}


def test_serves_on_loopback_by_default(small_db: Path) -> None:
    proc, port = _serve(small_db)
    try:
        assert _listening(proc.pid, port) == {"127.0.0.1"}
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/episode?id=cli-0", timeout=60) as r:
            assert "script-src 'self'" in r.headers["Content-Security-Policy"]
    finally:
        err = _stop(proc)
    assert "warning" not in err and f"http://127.0.0.1:{port}/" in " ".join(err.split())


def test_another_address_needs_the_flag_and_warns(small_db: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Beside the real server test above: only what `view` hands to uvicorn, and the warning.
    import agentrl.replay.viewer as viewer

    served: list[str] = []
    monkeypatch.setattr(viewer, "serve", lambda db, host, port, token_text: served.append(host))
    quiet = CliRunner().invoke(app, ["view", str(small_db), "--port", "1"])
    loud = CliRunner().invoke(app, ["view", str(small_db), "--port", "1", "--host", "0.0.0.0"])
    assert quiet.exit_code == loud.exit_code == 0 and served == ["127.0.0.1", "0.0.0.0"]
    assert "warning" not in quiet.output
    assert "warning: --host 0.0.0.0 serves every run's episodes" in " ".join(loud.output.split())


def test_schema_5_file_is_read_as_it_is_and_a_newer_revision_is_refused(tmp_path: Path) -> None:
    from agentrl.errors import ContractError
    from agentrl.replay.read import ReadOnlyDB, episode_page, list_runs, token_page

    schema5 = Path(__file__).parents[1] / "replay" / "data" / "replay_schema5.db"
    copy = tmp_path / "replay_schema5.db"
    copy.write_bytes(schema5.read_bytes())
    db = ReadOnlyDB(f"sqlite:///{copy}")
    try:
        assert [r.run_id for r in list_runs(db)] == ["run-schema5"]
        rows = episode_page(db, "run-schema5", limit=100).rows
        assert rows and not db.has_kind and not db.has_fts
        page = token_page(db, rows[0].episode_id)
        assert page.total > 0 and not page.has["trainer_log_prob"] and not page.has["entropy"]
    finally:
        db.close()
    assert copy.read_bytes() == schema5.read_bytes()  # read-only: not upgraded, not touched

    newer = tmp_path / "newer.db"
    ReplayStore(f"sqlite:///{newer}").close()
    with sqlite3.connect(newer) as conn:
        conn.execute("UPDATE alembic_version SET version_num = '9999'")
    with pytest.raises(ContractError, match="revision '9999', newer than this agentrl"):
        ReadOnlyDB(f"sqlite:///{newer}")
