"""Start and stop a throw-away PostgreSQL server for the test suite (used by scripts/test.sh
and by pytest fixtures), and make a fresh database on it per test module.

    python tests/helpers/postgres_ctl.py start   # prints the server's admin URL
    python tests/helpers/postgres_ctl.py stop    # stops the server `start` started

Debian's PostgreSQL (``/usr/lib/postgresql/<N>/bin``) refuses to run as root, so as root the
server runs as the ``postgres`` user (``runuser``), in a temporary data directory with
``trust`` authentication, listening on 127.0.0.1 and on a Unix socket in that directory
only (platform notes). Its pid, data directory and URL are kept in
``$AGENTRL_TEST_POSTGRES_STATE`` (default ``/tmp/agentrl-test-postgres/state.json``); ``stop``
stops only a server recorded there (``pg_ctl stop -m fast``) and deletes its directory.
"""

from __future__ import annotations

import glob
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path

STATE = Path(os.environ.get("AGENTRL_TEST_POSTGRES_STATE", "/tmp/agentrl-test-postgres/state.json"))
START_TIMEOUT_S = 60.0


def bin_dir() -> Path:
    """The newest ``/usr/lib/postgresql/<N>/bin`` holding ``initdb`` and ``pg_ctl``.

    Raises:
        RuntimeError: no PostgreSQL server binaries (run scripts/install.sh).
    """
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"), key=lambda p: int(re.findall(r"/(\d+)/", p)[0]))
    if found:
        return Path(found[-1]).parent
    on_path = shutil.which("pg_ctl")
    if on_path and shutil.which("initdb"):
        return Path(on_path).parent
    raise RuntimeError("PostgreSQL server binaries (initdb, pg_ctl) not found; run scripts/install.sh "
                       "(apt-get install postgresql)")


def _as_server_user(argv: list[str]) -> list[str]:
    return ["runuser", "-u", "postgres", "--", *argv] if os.geteuid() == 0 else argv


def _run(argv: list[str], timeout_s: float) -> None:
    proc = subprocess.run(_as_server_user(argv), capture_output=True, text=True, timeout=timeout_s,
                          stdin=subprocess.DEVNULL)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} exited {proc.returncode}: {proc.stderr.strip() or proc.stdout.strip()}")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _read_state() -> dict | None:
    try:
        state = json.loads(STATE.read_text())
        os.kill(int(state["pid"]), 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return state


def _answers(port: int, timeout_s: float = 0.5) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=timeout_s):
            return True
    except OSError:
        return False


def start(timeout_s: float = START_TIMEOUT_S) -> str:
    """Start a server unless the one recorded in ``STATE`` runs; returns its admin URL
    (``postgresql+psycopg://postgres@127.0.0.1:PORT/postgres``).

    Raises:
        RuntimeError: binaries missing, ``initdb`` or ``pg_ctl`` failed, or the server did
            not accept connections within ``timeout_s`` (the message holds its log's tail).
    """
    state = _read_state()
    if state is not None:
        return state["url"]
    bins = bin_dir()
    data = Path(tempfile.mkdtemp(prefix="agentrl-pg-"))
    if os.geteuid() == 0:
        shutil.chown(data, "postgres", "postgres")
    os.chmod(data, 0o700)
    _run([str(bins / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8",
          "--no-instructions"], timeout_s)
    port = _free_port()
    opts = (f"-p {port} -k {data} -h 127.0.0.1 -c fsync=off -c synchronous_commit=off "
            "-c full_page_writes=off -c max_connections=100")  # test data: durability not needed
    _run([str(bins / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(data / "log"), "-w",
          "-t", str(int(timeout_s)), "start"], timeout_s + 5)
    pid = int((data / "postmaster.pid").read_text().split()[0])
    url = f"postgresql+psycopg://postgres@127.0.0.1:{port}/postgres"
    STATE.parent.mkdir(parents=True, exist_ok=True)
    STATE.write_text(json.dumps({"pid": pid, "data": str(data), "port": port, "url": url, "bin": str(bins)}))
    deadline = time.monotonic() + timeout_s
    while not _answers(port):
        if time.monotonic() > deadline:
            tail = (data / "log").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"PostgreSQL on port {port} did not accept connections in {timeout_s} s:\n{tail}")
        time.sleep(0.05)
    return url


def stop(timeout_s: float = 30.0) -> bool:
    """Stop the server ``start()`` started and delete its data directory. Returns True if
    there was one."""
    state = _read_state()
    if state is None:
        STATE.unlink(missing_ok=True)
        return False
    data = Path(state["data"])
    try:
        _run([str(Path(state["bin"]) / "pg_ctl"), "-D", str(data), "-m", "fast", "-w",
              "-t", str(int(timeout_s)), "stop"], timeout_s + 5)
    except (RuntimeError, subprocess.TimeoutExpired):
        os.kill(int(state["pid"]), 9)
    shutil.rmtree(data, ignore_errors=True)
    STATE.unlink(missing_ok=True)
    return True


def create_database(admin_url: str, prefix: str = "agentrl_test") -> str:
    """``CREATE DATABASE`` a fresh, uniquely named database on the server of ``admin_url``;
    returns its URL. Drop it with ``drop_database``."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = f"{re.sub(r'[^a-z0-9_]', '_', prefix.lower())[:40]}_{uuid.uuid4().hex[:8]}"
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'CREATE DATABASE "{name}"'))
    finally:
        admin.dispose()
    return make_url(admin_url).set(database=name).render_as_string(hide_password=False)


def drop_database(admin_url: str, url: str) -> None:
    """Drop the database of ``url`` (made by ``create_database``), closing its connections."""
    from sqlalchemy import create_engine, text
    from sqlalchemy.engine import make_url

    name = make_url(url).database
    admin = create_engine(admin_url, isolation_level="AUTOCOMMIT")
    try:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
    finally:
        admin.dispose()


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "start":
        print(start())
    elif cmd == "stop":
        print("stopped" if stop() else "none of ours running")
    else:
        sys.exit(f"usage: {sys.argv[0]} start|stop")
