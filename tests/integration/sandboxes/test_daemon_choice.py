"""Which Docker daemon a run uses (``sandboxes.choose_sandboxes``, ``which_daemon``), against
the real daemon scripts/test.sh runs at the default socket.

``sandbox.backend: auto``: the daemon ``sandbox.docker_host`` names (it wins over
``DOCKER_HOST``), else the one ``DOCKER_HOST`` names; a named daemon must answer. Else the
``dockerd`` agentrl's scripts started (their state file records its pid and socket). Else
bubblewrap, saying so when a daemon nobody named answers at the default socket. Whether
the daemon is "ours" is decided by the state file, so "started by someone else" is shown by
pointing ``AGENTRL_TEST_DOCKERD_STATE`` at a record of another pid, with the same real daemon
answering."""

from __future__ import annotations

import json
import logging
import os

import pytest

import sandboxes
from agentrl.errors import SandboxError
from sandboxes import SandboxSpec, choose_backend, choose_sandboxes, make_sandbox, reap_orphans
from sandboxes.bwrap import BwrapSandbox
from sandboxes.docker import daemon
from sandboxes.docker.images import image_exists
from tests.helpers.sandbox_checks import require_docker

pytestmark = pytest.mark.docker

IMAGE = SandboxSpec.image
DEFAULT = "unix:///var/run/docker.sock"
NOT_OURS = (f"bwrap: a Docker daemon answers at {DEFAULT} but was neither named (sandbox.docker_host / "
            f"DOCKER_HOST) nor started by agentrl; set sandbox.docker_host: {DEFAULT} to use it")


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


def _state(tmp_path, monkeypatch, **record) -> None:
    """Point the dockerd state file of agentrl's scripts at a record of our own making."""
    path = tmp_path / "state.json"
    path.write_text(json.dumps(record))
    monkeypatch.setenv(daemon.DOCKERD_STATE_VAR, str(path))


def test_the_daemon_agentrl_started_is_used_when_none_is_named(real_daemon, tmp_path, monkeypatch):
    _state(tmp_path, monkeypatch, pid=real_daemon, argv=["/usr/sbin/dockerd"], host=DEFAULT)
    assert daemon.which_daemon() == (DEFAULT, "started by agentrl")
    choice = choose_sandboxes("auto", IMAGE)
    assert (choice.backend, choice.why, choice.docker_host) == ("docker", f"docker at {DEFAULT} (started by agentrl)",
                                                                DEFAULT)
    _state(tmp_path, monkeypatch, pid=real_daemon)  # a record of the older format: the default socket
    assert daemon.which_daemon() == (DEFAULT, "started by agentrl")


def test_a_daemon_agentrl_did_not_start_is_not_used_and_the_line_says_how_to_use_it(real_daemon, tmp_path,
                                                                                     monkeypatch, caplog):
    # the record names another live process (this one): the daemon answering is someone else's
    _state(tmp_path, monkeypatch, pid=os.getpid(), argv=["/usr/sbin/dockerd"], host=DEFAULT)
    assert daemon.docker_daemon_answers()
    assert choose_backend("auto", IMAGE) == ("bwrap", NOT_OURS)
    with caplog.at_level(logging.INFO, logger="sandboxes"):
        sb = make_sandbox("auto", SandboxSpec(run_id="test-daemon-choice"))
    try:
        assert isinstance(sb, BwrapSandbox)
        assert f"sandboxes: {NOT_OURS}" in caplog.text
    finally:
        sb.close()
    # the recorded pid is the daemon's, but recorded for another socket: not the one it serves here
    _state(tmp_path, monkeypatch, pid=real_daemon, host=f"unix://{tmp_path}/other.sock")
    assert choose_backend("auto", IMAGE) == ("bwrap", NOT_OURS)
    # no record at all
    monkeypatch.setenv(daemon.DOCKERD_STATE_VAR, str(tmp_path / "absent.json"))
    assert choose_backend("auto", IMAGE) == ("bwrap", NOT_OURS)


def test_the_daemon_the_config_names_is_used_and_wins_over_docker_host(real_daemon, tmp_path, monkeypatch,
                                                                      dead_socket):
    _state(tmp_path, monkeypatch, pid=os.getpid())  # not ours: only naming it makes a run use it
    monkeypatch.setenv("DOCKER_HOST", dead_socket)  # the environment names a silent one; the config wins
    choice = choose_sandboxes("auto", IMAGE, DEFAULT)
    assert (choice.backend, choice.why, choice.docker_host) == ("docker", f"docker at {DEFAULT} (sandbox.docker_host)",
                                                                DEFAULT)
    # the sandbox, and the reaper's container pass, go to that daemon, not to DOCKER_HOST's
    sb = make_sandbox(choice.backend, SandboxSpec(run_id="test-daemon-choice-cfg"), docker_host=choice.docker_host)
    try:
        assert type(sb).__name__ == "DockerSandbox"
        assert sb.exec("echo ok").stdout == "ok\n"
    finally:
        sb.close()
    sb = make_sandbox("docker", SandboxSpec(run_id="test-daemon-choice-cfg"), docker_host=DEFAULT)
    container = sb.container_id
    assert reap_orphans("test-daemon-choice-cfg", include_live_owners=True, docker_host=DEFAULT) >= 1
    client = daemon.docker_client(host=DEFAULT)
    assert client.api.containers(all=True, filters={"id": container}) == []
    client.close()
    sb.close()


def test_the_daemon_docker_host_names_is_used_and_announced(real_daemon, tmp_path, monkeypatch, caplog):
    _state(tmp_path, monkeypatch, pid=os.getpid())
    monkeypatch.setenv("DOCKER_HOST", DEFAULT)
    assert choose_backend("auto", IMAGE) == ("docker", f"docker at {DEFAULT} (DOCKER_HOST)")
    with caplog.at_level(logging.INFO, logger="sandboxes"):
        sb = make_sandbox("auto", SandboxSpec(run_id="test-daemon-choice"))
    try:
        assert type(sb).__name__ == "DockerSandbox"
        assert f"sandboxes: docker at {DEFAULT} (DOCKER_HOST)" in caplog.text
    finally:
        sb.close()


def test_a_named_daemon_that_does_not_answer_is_an_error_not_a_fallback(real_daemon, tmp_path, monkeypatch,
                                                                       dead_socket):
    _state(tmp_path, monkeypatch, pid=real_daemon)  # even with agentrl's own daemon up
    for host, env, source in ((dead_socket, None, "sandbox.docker_host"), (None, dead_socket, "DOCKER_HOST"),
                              ("tcp://127.0.0.1:9", None, "sandbox.docker_host")):  # discard port: nothing answers
        if env is None:
            monkeypatch.delenv("DOCKER_HOST", raising=False)
        else:
            monkeypatch.setenv("DOCKER_HOST", env)
        named = host or env
        message = rf"{source}='{named}' names a Docker daemon that does not answer"
        for call in (lambda: choose_backend("auto", IMAGE, host),
                     lambda: make_sandbox("auto", SandboxSpec(run_id="t"), docker_host=host),
                     lambda: sandboxes.resolve_backend("auto", host)):
            with pytest.raises(SandboxError, match=message):
                call()
        # backend: docker asked for Docker: the named daemon it would use does not answer
        with pytest.raises(SandboxError, match=rf"the Docker daemon at {named} \({source}\) does not answer"):
            choose_backend("docker", IMAGE, host)


def test_no_daemon_at_all_is_bubblewrap_and_says_why(tmp_path, monkeypatch, caplog):
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    monkeypatch.setenv(daemon.DOCKERD_STATE_VAR, str(tmp_path / "absent.json"))
    monkeypatch.setattr(daemon, "DOCKER_SOCKET", str(tmp_path / "docker.sock"))
    backend, why = choose_backend("auto", IMAGE)
    assert backend == "bwrap"
    assert why == ("bwrap: no Docker daemon named (sandbox.docker_host / DOCKER_HOST) or started by agentrl, "
                   f"and none answers at unix://{tmp_path}/docker.sock")
    with caplog.at_level(logging.INFO, logger="sandboxes"):
        sb = make_sandbox("auto", SandboxSpec(run_id="test-daemon-choice"))
    try:
        assert isinstance(sb, BwrapSandbox)
        assert "sandboxes: bwrap: no Docker daemon named" in caplog.text
    finally:
        sb.close()


def test_named_backends_say_so(real_daemon):
    assert choose_backend("bwrap", IMAGE) == ("bwrap", "bwrap: named in the config (sandbox.backend)")
    assert choose_backend("docker", IMAGE) == ("docker", f"docker at {DEFAULT} (sandbox.backend: docker; the default socket)")
    assert choose_backend("docker", IMAGE, DEFAULT) == ("docker", f"docker at {DEFAULT} (sandbox.backend: docker; "
                                                                  "sandbox.docker_host)")
