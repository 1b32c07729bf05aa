"""Start, stop and restart the Docker daemon for the test suite (used by scripts/test.sh).

    python tests/integration/sandboxes/dockerd_ctl.py start    # start dockerd unless one answers
    python tests/integration/sandboxes/dockerd_ctl.py stop     # stop it if `start` started it

A daemon started here is *owned* by the test run: its pid, command line and the socket it
serves (``host``) are kept in ``$AGENTRL_TEST_DOCKERD_STATE`` (default
``/tmp/agentrl-test-dockerd/state.json``; ``sandboxes.docker.daemon.agentrl_daemon`` reads the
same path, so ``sandbox.backend: auto`` uses this daemon when no other is named). Only an
owned daemon may be restarted by a test (``restart()``, the daemon-restart abuse case); a
daemon someone else runs is never touched.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from sandboxes.docker.daemon import (  # noqa: E402
    DOCKER_SOCKET,
    DOCKERD_STATE_DEFAULT,
    DOCKERD_STATE_VAR,
    docker_daemon_answers,
)

STATE = Path(os.environ.get(DOCKERD_STATE_VAR) or DOCKERD_STATE_DEFAULT)


def _read_state() -> dict | None:
    try:
        state = json.loads(STATE.read_text())
    except (OSError, ValueError):
        return None
    try:
        os.kill(state["pid"], 0)
    except (OSError, KeyError, TypeError):
        return None
    return state


def owned() -> bool:
    """True when a daemon started by ``start()`` runs now."""
    return _read_state() is not None


def _wait(up: bool, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if docker_daemon_answers(1.0) == up:
            return True
        time.sleep(0.1)
    return docker_daemon_answers(1.0) == up


def start(timeout_s: float = 30.0) -> bool:
    """Start ``dockerd`` unless a daemon answers. Returns True when this call started it.

    Raises:
        RuntimeError: dockerd missing or not answering within ``timeout_s``.
    """
    if docker_daemon_answers(1.0):
        return False
    dockerd = shutil.which("dockerd") or "/usr/sbin/dockerd"
    if not os.path.exists(dockerd):
        raise RuntimeError("dockerd not found; run scripts/install.sh (apt-get install docker.io)")
    STATE.parent.mkdir(parents=True, exist_ok=True)
    log = open(STATE.parent / "dockerd.log", "ab")
    argv = [dockerd]
    proc = subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL, start_new_session=True)
    STATE.write_text(json.dumps({"pid": proc.pid, "argv": argv, "host": f"unix://{DOCKER_SOCKET}"}))
    if not _wait(True, timeout_s):
        raise RuntimeError(f"dockerd (pid {proc.pid}) did not answer within {timeout_s} s; see {STATE.parent / 'dockerd.log'}")
    return True


def stop(timeout_s: float = 30.0) -> bool:
    """Stop the daemon ``start()`` started (SIGTERM, then SIGKILL). Returns True if it did."""
    state = _read_state()
    if state is None:
        return False
    pid = state["pid"]
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except OSError:
            break
        try:
            if os.waitpid(pid, os.WNOHANG)[0] == pid:
                break
        except ChildProcessError:
            pass
        time.sleep(0.1)
    else:
        os.kill(pid, signal.SIGKILL)
    STATE.unlink(missing_ok=True)
    return True


def restart(timeout_s: float = 30.0) -> None:
    """Restart an owned daemon and wait until it answers again.

    Raises:
        RuntimeError: the daemon is not owned by the test run, or does not come back.
    """
    if not owned():
        raise RuntimeError("the Docker daemon was not started by the test run; not restarting it")
    stop(timeout_s)
    _wait(False, timeout_s)
    if not start(timeout_s):
        raise RuntimeError("another Docker daemon answered while ours was stopped")


if __name__ == "__main__":
    cmd = sys.argv[1] if len(sys.argv) > 1 else ""
    if cmd == "start":
        print("started" if start() else "already running")
    elif cmd == "stop":
        print("stopped" if stop() else "not ours; left running")
    else:
        sys.exit(f"usage: {sys.argv[0]} start|stop")
