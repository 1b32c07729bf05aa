"""Is the Docker daemon up: the one place that asks, and the client of it.

* ``docker_daemon_answers``: asks ``/_ping`` on the local socket over raw HTTP, so asking
  costs no ``docker`` import (``sandbox.backend: auto``, the reaper and scripts/install.sh
  ask); with a remote ``DOCKER_HOST`` it asks the SDK (``docker_available``).
* ``docker_available``: asks through the Docker SDK (``docker_client``'s ping).
* ``which_daemon``: which daemon a run would use and why (``sandbox.backend: auto``'s rule).

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
DOCKERD_STATE_VAR = "AGENTRL_TEST_DOCKERD_STATE"
DOCKERD_STATE_DEFAULT = "/tmp/agentrl-test-dockerd/state.json"
"""Where agentrl's own scripts record a ``dockerd`` they started (``scripts/test.sh`` through
``tests/integration/sandboxes/dockerd_ctl.py``): JSON with its ``pid``; the path is
``$AGENTRL_TEST_DOCKERD_STATE`` or this default."""
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


def daemon_pid(path: str = DOCKER_SOCKET) -> int | None:
    """The pid of the process serving the unix socket ``path`` (``SO_PEERCRED``), or None
    when nobody serves it or the pid is not visible from here (another pid namespace)."""
    import struct

    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2.0)
            s.connect(path)
            pid, _, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except OSError:
        return None
    return pid if pid > 0 else None


def agentrl_dockerd_pid() -> int | None:
    """The pid of the ``dockerd`` agentrl's scripts started and recorded (see
    ``DOCKERD_STATE_VAR``), when that process still runs; else None."""
    import json

    path = os.environ.get(DOCKERD_STATE_VAR) or DOCKERD_STATE_DEFAULT
    try:
        with open(path, encoding="utf-8") as fh:
            pid = int(json.load(fh)["pid"])
        os.kill(pid, 0)
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return pid


def which_daemon(timeout_s: float = 2.0) -> tuple[str | None, str]:
    """The Docker daemon ``sandbox.backend: auto`` uses, by this rule:

    1. ``DOCKER_HOST`` set: the daemon it names (the user named it). It must answer: a
       named daemon that does not is an error, never a silent switch to bubblewrap.
    2. Else the daemon at the default socket ``/var/run/docker.sock``, when one answers: the
       machine's own daemon, the one the ``docker`` CLI uses here; labelled ``started by
       agentrl`` when it is the ``dockerd`` that ``scripts/test.sh`` started (its pid is in
       the state file, ``DOCKERD_STATE_VAR``), else ``the machine's daemon``.
    3. Else none. A daemon on any other socket (another job's ``dockerd -H ...``) is never
       used unless ``DOCKER_HOST`` names it.

    Returns:
        ``(address, label)``: e.g. ``("unix:///var/run/docker.sock", "started by
        agentrl")``, ``("tcp://10.0.0.5:2375", "DOCKER_HOST")``; ``(None, why)`` when no
        daemon of ours answers.

    Raises:
        SandboxError: ``DOCKER_HOST`` names a daemon that does not answer within
            ``timeout_s`` seconds.
    """
    host = os.environ.get("DOCKER_HOST", "")
    if host:
        if not docker_daemon_answers(timeout_s):
            raise SandboxError(
                f"DOCKER_HOST={host!r} names a Docker daemon that does not answer; start that daemon, "
                f"or unset DOCKER_HOST (then the daemon at unix://{DOCKER_SOCKET} is used when one "
                "answers, else bubblewrap), or set sandbox.backend: bwrap"
            )
        return host, "DOCKER_HOST"
    if not docker_daemon_answers(timeout_s):
        return None, f"DOCKER_HOST is unset and no daemon answers at unix://{DOCKER_SOCKET}"
    pid = daemon_pid(DOCKER_SOCKET)
    ours = agentrl_dockerd_pid()
    label = "started by agentrl" if pid is not None and pid == ours else "the machine's daemon"
    return f"unix://{DOCKER_SOCKET}", label
