"""Which Docker daemon ``sandbox.backend: auto`` uses, against the real daemon that
scripts/test.sh runs at the default socket (``sandboxes.docker.daemon.which_daemon``): the
one ``DOCKER_HOST`` names (which must answer), else the one at ``/var/run/docker.sock``,
announced as started by agentrl when the state file of scripts/test.sh records its pid; a
socket nobody serves is an error when named, and "no daemon of ours" when it is the
default."""

from __future__ import annotations

import json
import logging
import socket

import pytest

import sandboxes
from agentrl.errors import SandboxError
from sandboxes import SandboxSpec, choose_backend, make_sandbox
from sandboxes.bwrap import BwrapSandbox
from sandboxes.docker import daemon
from sandboxes.docker.images import image_exists
from tests.helpers.sandbox_checks import require_docker

pytestmark = pytest.mark.docker

IMAGE = SandboxSpec.image


@pytest.fixture
def real_daemon(monkeypatch):
    """The daemon at the default socket, with DOCKER_HOST unset; its pid (SO_PEERCRED)."""
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    require_docker()
    if not image_exists(IMAGE):
        pytest.fail(f"the sandbox image {IMAGE!r} is missing (scripts/test.sh builds it)")
    pid = daemon.daemon_pid()
    assert pid is not None and open(f"/proc/{pid}/comm").read().strip() == "dockerd"
    return pid


def test_the_default_socket_daemon_started_by_agentrl_is_announced_as_such(real_daemon, tmp_path, monkeypatch):
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"pid": real_daemon, "argv": ["/usr/sbin/dockerd"]}))
    monkeypatch.setenv(daemon.DOCKERD_STATE_VAR, str(state))
    assert daemon.which_daemon() == ("unix:///var/run/docker.sock", "started by agentrl")
    assert choose_backend("auto", IMAGE) == ("docker", "docker at unix:///var/run/docker.sock (started by agentrl)")


def test_a_default_socket_daemon_that_agentrl_did_not_start_is_the_machines(real_daemon, tmp_path, monkeypatch):
    monkeypatch.setenv(daemon.DOCKERD_STATE_VAR, str(tmp_path / "absent.json"))
    assert choose_backend("auto", IMAGE) == ("docker", "docker at unix:///var/run/docker.sock (the machine's daemon)")
    # a stale record (a pid that is not the daemon's) does not make it ours either
    state = tmp_path / "state.json"
    state.write_text(json.dumps({"pid": 1}))
    monkeypatch.setenv(daemon.DOCKERD_STATE_VAR, str(state))
    assert daemon.which_daemon()[1] == "the machine's daemon"


def test_the_daemon_docker_host_names_is_used_and_announced(real_daemon, monkeypatch, caplog):
    monkeypatch.setenv("DOCKER_HOST", "unix:///var/run/docker.sock")
    assert choose_backend("auto", IMAGE) == ("docker", "docker at unix:///var/run/docker.sock (DOCKER_HOST)")
    with caplog.at_level(logging.INFO, logger="sandboxes"):
        sb = make_sandbox("auto", SandboxSpec(run_id="test-daemon-choice"))
    try:
        assert type(sb).__name__ == "DockerSandbox"
        assert "sandboxes: docker at unix:///var/run/docker.sock (DOCKER_HOST)" in caplog.text
    finally:
        sb.close()


def test_a_docker_host_nobody_serves_is_an_error_not_a_fallback(tmp_path, monkeypatch):
    dead = tmp_path / "nobody.sock"
    # a socket file that nobody accepts on: bound, then closed
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(str(dead))
    s.close()
    monkeypatch.setenv("DOCKER_HOST", f"unix://{dead}")
    for call in (lambda: choose_backend("auto", IMAGE), lambda: make_sandbox("auto", SandboxSpec(run_id="t")),
                 lambda: sandboxes.resolve_backend("auto")):
        with pytest.raises(SandboxError, match=rf"DOCKER_HOST='unix://{dead}' names a Docker daemon that does not answer"):
            call()
    monkeypatch.setenv("DOCKER_HOST", "tcp://127.0.0.1:9")  # discard port: nothing answers
    with pytest.raises(SandboxError, match="tcp://127.0.0.1:9"):
        choose_backend("auto", IMAGE)


def test_no_daemon_at_the_default_socket_is_bubblewrap_and_says_why(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setattr(daemon, "DOCKER_SOCKET", str(tmp_path / "docker.sock"))
    backend, why = choose_backend("auto", IMAGE)
    assert backend == "bwrap"
    assert why == f"bwrap: no docker daemon of ours (DOCKER_HOST is unset and no daemon answers at unix://{tmp_path}/docker.sock)"
    with caplog.at_level(logging.INFO, logger="sandboxes"):
        sb = make_sandbox("auto", SandboxSpec(run_id="test-daemon-choice"))
    try:
        assert isinstance(sb, BwrapSandbox)
        assert "sandboxes: bwrap: no docker daemon of ours" in caplog.text
    finally:
        sb.close()


def test_named_backends_say_so():
    assert choose_backend("bwrap", IMAGE) == ("bwrap", "bwrap: named in the config (sandbox.backend)")
    assert choose_backend("docker", IMAGE)[1].endswith(": named in the config (sandbox.backend)")
