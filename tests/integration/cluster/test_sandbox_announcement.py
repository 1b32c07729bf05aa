"""A run says which sandboxes it uses, and on which Docker daemon, in its first lines on the
driver's console (``agentrl.cluster.actors.sandbox_choice``), against the real daemon scripts/test.sh
runs at the default socket; the CLI checks run ``agentrl train`` up to its first error."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.cluster.actors.sandbox_choice import ANNOUNCE_LOGGER, sandbox_line
from agentrl.config import load_config
from agentrl.errors import SandboxError
from agentrl.logs import ConsoleLog
from sandboxes.docker import daemon
from tests.helpers.sandbox_checks import require_docker

REPO = Path(__file__).resolve().parents[3]
DEFAULT = "unix:///var/run/docker.sock"


def _cfg(*overrides: str):
    return load_config(None, ["env.id=agentrl/ShellTasks-v0", *overrides])


def _state(tmp_path, monkeypatch, pid: int) -> None:
    path = tmp_path / "state.json"
    path.write_text(json.dumps({"pid": pid, "host": DEFAULT}))
    monkeypatch.setenv(daemon.DOCKERD_STATE_VAR, str(path))


@pytest.mark.docker
def test_the_line_names_the_daemon_and_why(tmp_path, monkeypatch, dead_socket):
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    require_docker()
    _state(tmp_path, monkeypatch, daemon.daemon_pid())
    assert sandbox_line(_cfg()) == f"sandboxes: docker at {DEFAULT} (started by agentrl)"
    _state(tmp_path, monkeypatch, os.getpid())  # the same daemon, recorded as someone else's
    assert sandbox_line(_cfg()) == (
        f"sandboxes: bwrap: a Docker daemon answers at {DEFAULT} but was neither named (sandbox.docker_host / "
        f"DOCKER_HOST) nor started by agentrl; set sandbox.docker_host: {DEFAULT} to use it")
    assert sandbox_line(_cfg(f"sandbox.docker_host={DEFAULT}")) == f"sandboxes: docker at {DEFAULT} (sandbox.docker_host)"
    with pytest.raises(SandboxError, match=f"sandbox.docker_host='{dead_socket}' names a Docker daemon that does not answer"):
        sandbox_line(_cfg(f"sandbox.docker_host={dead_socket}"))
    # sandboxes on other nodes decide there: this machine's answer is only reported
    line = sandbox_line(_cfg(f"sandbox.docker_host={dead_socket}", "cluster.sandbox_hosts=1"))
    assert line.startswith("sandboxes: chosen on each sandbox host's node (cluster.sandbox_hosts); on this machine: "
                           f"sandbox.docker_host='{dead_socket}' names a Docker daemon that does not answer")


def test_an_env_without_sandboxes_says_so_and_asks_no_daemon(dead_socket):
    cfg = load_config(None, ["env.id=agentrl/GuessNumber-v0", f"sandbox.docker_host={dead_socket}"])
    assert sandbox_line(cfg) == "sandboxes: none (agentrl/GuessNumber-v0 runs without a sandbox)"


def test_the_line_is_shown_by_a_console_at_warning():
    import logging

    assert logging.getLogger(ANNOUNCE_LOGGER).getEffectiveLevel() == logging.INFO
    line = f"sandboxes: docker at {DEFAULT} (started by agentrl)"
    assert not ConsoleLog(debug=False).hide_record(line, f"INFO {ANNOUNCE_LOGGER}: ")


def _train(tmp_path, *overrides: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, COLUMNS="200", TERM="dumb")
    return subprocess.run([sys.executable, "-m", "agentrl.cli", "train", f"run.dir={tmp_path / 'run'}", *overrides],
                          cwd=REPO, capture_output=True, text=True, timeout=120, env=env)


def test_agentrl_train_prints_the_choice_first_and_stops_on_a_silent_named_daemon(tmp_path, dead_socket):
    # the run stops at its first check after the announcement (an unknown task id): no Ray, no model
    r = _train(tmp_path, "sandbox.backend=bwrap", "env.task_ids=[no_such_task]")
    assert r.returncode == 2, r.stdout + r.stderr
    lines = [x for x in r.stderr.splitlines() if x.strip()]
    assert lines[0] == "INFO agentrl.run: sandboxes: bwrap: named in the config (sandbox.backend)", r.stderr
    assert lines[-1].startswith("error: env.task_ids: ['no_such_task']"), r.stderr
    r = _train(tmp_path, f"sandbox.docker_host={dead_socket}")
    assert r.returncode == 2, r.stdout + r.stderr
    assert r.stderr.strip() == (f"error: sandbox.docker_host='{dead_socket}' names a Docker daemon that does not "
                                "answer; start that daemon, name one that answers, or set sandbox.backend: bwrap")
    assert not (tmp_path / "run").exists()  # stopped before the run directory was written
