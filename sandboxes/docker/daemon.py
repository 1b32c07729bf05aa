"""Is the Docker daemon up: the one place that asks, and the client of it.

* ``docker_daemon_answers``: asks ``/_ping`` on the local socket over raw HTTP, so asking
  costs no ``docker`` import (``sandbox.backend: auto``, the reaper and scripts/install.sh
  ask); with a remote ``DOCKER_HOST`` it asks the SDK (``docker_available``).
* ``docker_available``: asks through the Docker SDK (``docker_client``'s ping).

This module imports the ``docker`` SDK only inside the functions that use it.
"""

from __future__ import annotations

import os
import socket
from typing import TYPE_CHECKING

from agentrl.errors import SandboxError

if TYPE_CHECKING:
    import docker

DOCKER_SOCKET = "/var/run/docker.sock"
"""The daemon's socket when ``DOCKER_HOST`` is unset."""
DAEMON_TIMEOUT_S = 30
"""Seconds a client waits for one daemon request (``docker_client``'s default)."""
_MAX_POOL = 128
"""HTTP connections kept to the daemon (concurrent execs each hold one while they start)."""


def daemon_is_remote() -> bool:
    """True when ``DOCKER_HOST`` names a daemon that is not a local unix socket (its
    containers' processes are then not this machine's)."""
    host = os.environ.get("DOCKER_HOST", "")
    return bool(host) and not host.startswith("unix://")


def infra_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean the daemon (not a command) failed: the SDK's, the HTTP
    layer's and OS errors."""
    import docker.errors
    import requests.exceptions

    return (docker.errors.DockerException, requests.exceptions.RequestException, OSError)


def docker_client(timeout_s: float = DAEMON_TIMEOUT_S) -> docker.DockerClient:
    """A client of the daemon named by the environment (``DOCKER_HOST``, default socket)
    that answered a ping; ``timeout_s`` (seconds, at least 1) bounds each request.

    Raises:
        SandboxError: the daemon does not answer.
    """
    import docker

    try:
        client = docker.from_env(timeout=int(max(1, timeout_s)), max_pool_size=_MAX_POOL)
        client.ping()
    except infra_errors() as exc:
        raise SandboxError(f"the Docker daemon does not answer: {exc}") from exc
    return client


def docker_available(timeout_s: float = 2.0) -> bool:
    """True when a Docker daemon answers the SDK's ping within ``timeout_s`` seconds."""
    host = os.environ.get("DOCKER_HOST", "")
    if not host and not os.path.exists(DOCKER_SOCKET):
        return False
    try:
        client = docker_client(timeout_s)
    except SandboxError:
        return False
    client.close()
    return True


def docker_daemon_answers(timeout_s: float = 2.0) -> bool:
    """True when a Docker daemon answers ``/_ping`` within ``timeout_s`` seconds.

    The local socket is asked directly (no ``docker`` import); with ``DOCKER_HOST`` set to
    something else the Docker SDK is asked (``docker_available``).
    """
    host = os.environ.get("DOCKER_HOST", "")
    if daemon_is_remote():
        return docker_available(timeout_s)
    path = host[len("unix://"):] if host else DOCKER_SOCKET
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(path)
            s.sendall(b"GET /_ping HTTP/1.0\r\nHost: docker\r\n\r\n")
            reply = b""
            while len(reply) < 4096:
                chunk = s.recv(4096)
                if not chunk:
                    break
                reply += chunk
    except OSError:
        return False
    return reply.startswith(b"HTTP/1.") and b" 200 " in reply.split(b"\r\n", 1)[0] and reply.endswith(b"OK")
