"""The real OpenEnv servers of the adapter's integration tests: the hub venv that
``scripts/hub_venvs.sh`` makes (openenv 0.10.0, apart from .venv), and the game of
``tests/helpers/openenv_guess_server.py`` served from it on a free port of 127.0.0.1.

``tests/helpers/openenv_mcp_server.py``'s MCP environment (``mcp_server``).

``hub_python()`` is the venv's python; without the venv the tests skip, naming the script,
or fail under ``AGENTRL_REQUIRE_HUB_VENVS=1`` (what scripts/test.sh sets after running it).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest

OPENENV_VENV = "openenv-0.10.0"
REQUIRE_VAR = "AGENTRL_REQUIRE_HUB_VENVS"
GUESS_SERVER = str(Path(__file__).resolve().parent / "openenv_guess_server.py")
MCP_SERVER = str(Path(__file__).resolve().parent / "openenv_mcp_server.py")


def hub_venvs_root() -> Path:
    """Where scripts/hub_venvs.sh puts the venvs (``$AGENTRL_HUB_VENVS`` or ~/.cache/agentrl/hub-venvs)."""
    return Path(os.environ.get("AGENTRL_HUB_VENVS") or Path.home() / ".cache" / "agentrl" / "hub-venvs")


MAKER_PID_VAR = "AGENTRL_HUB_VENVS_PID"
"""The pid of a scripts/hub_venvs.sh still making the venvs (scripts/test.sh runs it in the
background): ``hub_python`` waits for it to end first."""
MAKER_WAIT_S = 900.0


def _wait_for_the_maker() -> None:
    pid = os.environ.get(MAKER_PID_VAR, "")
    if not pid.isdigit():
        return
    deadline = time.monotonic() + MAKER_WAIT_S
    while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
        try:  # a zombie (exited, not yet reaped by scripts/test.sh) is done
            if Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0] == "Z":
                return
        except OSError:
            return
        time.sleep(1.0)


def hub_python(name: str = OPENENV_VENV) -> str:
    """The hub venv's python; skips the test (fails under ``AGENTRL_REQUIRE_HUB_VENVS=1``)
    when scripts/hub_venvs.sh has not made it (waiting first, up to 15 min, for one that is
    making it: ``AGENTRL_HUB_VENVS_PID``)."""
    _wait_for_the_maker()
    venv = hub_venvs_root() / name
    py = venv / "bin" / "python"
    if not (py.exists() and (venv / ".agentrl-stamp").exists()):
        why = f"no hub venv {venv} (with openenv): run scripts/hub_venvs.sh (scripts/test.sh does)"
        if os.environ.get(REQUIRE_VAR) == "1":
            pytest.fail(f"{REQUIRE_VAR}=1 but {why}")
        pytest.skip(why)
    return str(py)


def guess_command(max_sessions: int = 1, action: str = "text") -> list[str]:
    """The argv of the guess server, with ``{port}`` for the adapter to fill."""
    return [hub_python(), GUESS_SERVER, "--port", "{port}", "--max-sessions", str(max_sessions), "--action", action]


def open_sessions(base_url: str) -> int:
    """The guess server's live session count (``GET /debug/sessions``)."""
    with urllib.request.urlopen(base_url + "/debug/sessions", timeout=5) as resp:
        return int(json.loads(resp.read())["open"])


def wait_for(check, timeout_s: float = 30.0, what: str = "condition") -> None:
    deadline = time.monotonic() + timeout_s
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.1)


@contextmanager
def guess_server(max_sessions: int = 1, action: str = "text") -> Iterator[tuple[str, subprocess.Popen]]:
    """Serve the guess game on a free port: ``(base_url, process)``, stopped after."""
    with _serve(guess_command(max_sessions, action), "the guess server") as served:
        yield served


def mcp_command(max_sessions: int = 8) -> list[str]:
    """The argv of the MCP vault server, with ``{port}`` for the adapter to fill."""
    return [hub_python(), MCP_SERVER, "--port", "{port}", "--max-sessions", str(max_sessions)]


@contextmanager
def mcp_server(max_sessions: int = 8) -> Iterator[tuple[str, subprocess.Popen]]:
    """Serve the MCP vault environment on a free port: ``(base_url, process)``, stopped after."""
    with _serve(mcp_command(max_sessions), "the MCP vault server") as served:
        yield served


@contextmanager
def _serve(command: list[str], what: str) -> Iterator[tuple[str, subprocess.Popen]]:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    argv = [a.replace("{port}", str(port)) for a in command]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    base_url = f"http://127.0.0.1:{port}"

    def up() -> bool:
        if proc.poll() is not None:
            raise AssertionError(f"{what} exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            with urllib.request.urlopen(base_url + "/health", timeout=1):
                return True
        except OSError:
            return False

    try:
        wait_for(up, 90, f"{what}'s /health")
        yield base_url, proc
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        proc.wait(10)


def pid_alive(pid: int) -> bool:
    """Whether a process with ``pid`` exists (a zombie counts)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
