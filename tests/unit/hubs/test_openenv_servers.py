"""Servers the OpenEnv adapter starts as local processes (agentrl/hubs/openenv_servers.py), with
the fake server run as a process (tests/helpers/openenv_fake.py): one server per episode where
the server refuses concurrent sessions, one shared server where it serves them, each stopped
with its episode (or, shared, once idle), and every one carrying the sandbox run label the
reaper reads."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import sandboxes
from agentrl.errors import InfraError
from agentrl.hubs.openenv import OpenEnvEnv
from agentrl.hubs.openenv_servers import ServerSpec, lease_server, stop_servers
from agentrl.types import ExecResult
from sandboxes.labels import OWNER_PID_ENV, RUN_ID_ENV, read_environ
from tests.helpers.openenv_hub import pid_alive

FAKE = str(Path(__file__).resolve().parents[2] / "helpers" / "openenv_fake.py")


def _server(max_sessions: int, **extra) -> dict:
    return {"command": [sys.executable, FAKE, "--port", "{port}", "--max-sessions", str(max_sessions)],
            "startup_timeout_s": 60, **extra}


@pytest.fixture(autouse=True)
def _stop_all():
    yield
    stop_servers()


def _two_episodes_at_once(server: dict) -> list[OpenEnvEnv]:
    envs = [OpenEnvEnv(server=server), OpenEnvEnv(server=server)]
    errors = []

    def reset(env, i):
        try:
            env.reset(options={"task_id": f"openenv/{i}"})
        except Exception as exc:  # surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=reset, args=(env, i)) for i, env in enumerate(envs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert not errors, errors
    return envs


def test_a_server_that_refuses_concurrent_sessions_gets_one_server_per_episode():
    envs = _two_episodes_at_once(_server(1, run_id="oe-unit-single"))
    pids = [env.server_pid for env in envs]
    assert None not in pids and pids[0] != pids[1] and envs[0].base_url != envs[1].base_url
    for pid in pids:
        environ = read_environ(pid)
        assert environ[RUN_ID_ENV] == "oe-unit-single" and environ[OWNER_PID_ENV] == str(os.getpid())
    for _ in range(3):  # the fake's episodes end after 3 steps: the server stops with it
        envs[0].step("go")
    assert not pid_alive(pids[0]) and pid_alive(pids[1]) and envs[0].server_pid is None
    envs[1].close()  # cancelled mid-episode: stopped too
    assert not pid_alive(pids[1])


def test_a_server_that_serves_concurrent_sessions_is_shared_then_stopped_when_idle():
    envs = _two_episodes_at_once(_server(4, idle_s=0))
    assert envs[0].base_url == envs[1].base_url and envs[0].server_pid == envs[1].server_pid
    pid = envs[0].server_pid
    envs[0].close()
    assert pid_alive(pid)  # the other episode still uses it
    envs[1].close()
    assert not pid_alive(pid)


def test_said_not_concurrent_is_not_asked_and_a_shared_server_lives_on_for_idle_s():
    spec = ServerSpec.parse(_server(4, concurrent_sessions=False))
    a, b = lease_server(spec), lease_server(spec)
    assert a.pid != b.pid and not a.shared
    a.release(), b.release()
    assert not pid_alive(a.pid) and not pid_alive(b.pid)
    shared = ServerSpec.parse(_server(4, concurrent_sessions=True, idle_s=60))
    c = lease_server(shared)
    c.release()
    d = lease_server(shared)  # within idle_s: the same server
    assert d.pid == c.pid and pid_alive(c.pid)
    d.release()
    assert stop_servers() == 1 and not pid_alive(c.pid)


def test_a_server_that_exits_at_start_is_an_infrastructure_error_with_its_output():
    env = OpenEnvEnv(server={"command": [sys.executable, "-c", "import sys; print('no such env'); sys.exit(3)"]})
    with pytest.raises(InfraError, match="exited with code 3.*no such env"):
        env.reset(options={"task_id": "openenv/0"})


class _FakeDockerSandbox:
    """Stands in for ``DockerSandbox``: ``exec`` runs the argv as a local process until ``close``."""

    made: list = []

    def __init__(self, spec):
        self.spec = spec
        self.proc = None
        self.closed = False
        _FakeDockerSandbox.made.append(self)

    def exec(self, argv, timeout_s=None):
        self.argv = list(argv)
        self.proc = subprocess.Popen(argv)
        code = self.proc.wait()
        return ExecResult(command=tuple(argv), exit_code=code, stdout="", stderr="", duration_s=0.0, timed_out=False)

    def ip_address(self):
        self.asked_address = True
        return "127.0.0.1"  # the container's address; the stand-in's server runs on this machine

    def close(self):
        self.closed = True
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()


def test_an_image_runs_its_server_in_a_docker_sandbox_on_the_bridge_network_at_its_address(monkeypatch):
    def make_sandbox(backend, spec, *, docker_host=None):
        assert backend == "docker" and docker_host == "unix:///x.sock"
        return _FakeDockerSandbox(spec)

    monkeypatch.setattr(sandboxes, "make_sandbox", make_sandbox)
    env = OpenEnvEnv(server={"image": "guess:1", "command": [sys.executable, FAKE, "--port", "{port}"],
                             "docker_host": "unix:///x.sock", "memory_mb": 512, "run_id": "oe-docker"})
    env.reset(options={"task_id": "openenv/0"})
    (box,) = _FakeDockerSandbox.made
    assert box.spec.image == "guess:1" and box.spec.network == "bridge" and box.spec.memory_mb == 512
    assert box.asked_address and env.base_url.startswith("http://127.0.0.1:")  # at the address ip_address() gave
    assert box.spec.run_id == "oe-docker" and box.argv[-1] == env.base_url.rsplit(":", 1)[1]
    env.close()  # one session only: the server was its episode's, closed with it
    assert box.closed
