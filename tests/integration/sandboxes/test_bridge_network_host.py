"""``SandboxSpec(network="bridge")`` (a ``public`` Harbor task, an OpenEnv image server) and this
host: the container reaches a host service bound to ``0.0.0.0`` through the bridge gateway
(Docker cannot block that without the host's firewall), not one bound to ``127.0.0.1``; the
first bridge sandbox of a process logs ``BRIDGE_WARNING`` once; ``ip_address()`` is the
container's address, where this machine reaches a server in it."""

from __future__ import annotations

import logging
import socket
import threading
import uuid

import pytest

import sandboxes.docker.sandbox as docker_sandbox
from agentrl.errors import SandboxError
from sandboxes.base import SandboxSpec
from sandboxes.docker.sandbox import BRIDGE_WARNING, DockerSandbox
from tests.helpers.sandbox_checks import require_docker

pytestmark = pytest.mark.docker

_GATEWAY = ("import socket, struct\n"
            "for line in open('/proc/net/route').readlines()[1:]:\n"
            "    f = line.split()\n"
            "    if f[1] == '00000000': print(socket.inet_ntoa(struct.pack('<L', int(f[2], 16))))")


def _listener(host: str) -> tuple[socket.socket, list[bytes]]:
    srv = socket.socket()
    srv.bind((host, 0))
    srv.listen(1)
    got: list[bytes] = []

    def accept() -> None:
        try:
            conn, _ = srv.accept()
        except OSError:
            return
        got.append(conn.recv(100))
        conn.close()

    threading.Thread(target=accept, daemon=True).start()
    return srv, got


def _send(box: DockerSandbox, host: str, port: int):
    return box.exec(["python3", "-c", f"import socket; s=socket.create_connection(({host!r}, {port}), 5); "
                     "s.send(b'hello-host'); s.close()"])


def test_a_bridge_sandbox_reaches_host_services_on_all_interfaces_not_on_loopback(monkeypatch, caplog):
    require_docker()
    monkeypatch.setattr(docker_sandbox, "_bridge_warning", threading.Lock())  # as in a fresh process
    public, got_public = _listener("0.0.0.0")
    loopback, got_loopback = _listener("127.0.0.1")
    run_id = f"test-bridge-{uuid.uuid4().hex[:8]}"
    with caplog.at_level(logging.WARNING, logger=docker_sandbox.__name__):
        box = DockerSandbox(SandboxSpec(network="bridge", run_id=run_id))
        second = DockerSandbox(SandboxSpec(network="bridge", run_id=run_id))
    try:
        gateway = box.exec(["python3", "-c", _GATEWAY]).stdout.strip()
        assert gateway, "no default route in a bridge sandbox"
        assert _send(box, gateway, public.getsockname()[1]).exit_code == 0
        refused = _send(box, gateway, loopback.getsockname()[1])
        assert refused.exit_code != 0 and "Connection refused" in refused.stderr, refused
        address = box.ip_address()
        assert address != gateway and address == box.exec(["hostname", "-i"]).stdout.split()[0]
    finally:
        box.close()
        second.close()
        public.close()
        loopback.close()
    assert got_public == [b"hello-host"] and got_loopback == []
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings.count(BRIDGE_WARNING) == 1  # once per process, not per sandbox
    assert "a Harbor task with network access" in BRIDGE_WARNING and "bridge address" in BRIDGE_WARNING


def test_a_sandbox_without_network_logs_no_warning_and_has_no_address(monkeypatch, caplog):
    require_docker()
    monkeypatch.setattr(docker_sandbox, "_bridge_warning", threading.Lock())
    with caplog.at_level(logging.WARNING, logger=docker_sandbox.__name__):
        box = DockerSandbox(SandboxSpec(run_id=f"test-bridge-{uuid.uuid4().hex[:8]}"))
    try:
        with pytest.raises(SandboxError, match="no IP address on network 'none'"):
            box.ip_address()
    finally:
        box.close()
    assert BRIDGE_WARNING not in [r.getMessage() for r in caplog.records]
