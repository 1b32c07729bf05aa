"""Which Docker daemon, and is it up: the one place that asks, and the client of it.

The daemon a run uses is named by ``sandbox.docker_host`` (the run's config, which wins) or
``DOCKER_HOST``; functions here take that config value as ``host`` (``None``: the
environment's ``DOCKER_HOST``, else the default socket ``/var/run/docker.sock``).

* ``docker_daemon_answers``: asks ``/_ping`` on a local socket over raw HTTP, so asking
  costs no ``docker`` import (``sandbox.backend: auto``, the reaper and scripts/install.sh
  ask); a remote daemon (``tcp://...``) is asked through the SDK (``docker_available``).
* ``docker_available``: asks through the Docker SDK (``docker_client``'s ping).
* ``which_daemon``: which daemon ``sandbox.backend: auto`` uses and why.

This module imports the ``docker`` SDK only inside the functions that use it.
"""

from __future__ import annotations

import json
import os
import socket
import struct
from typing import TYPE_CHECKING

from agentrl.errors import SandboxError

if TYPE_CHECKING:
    import docker

DOCKER_SOCKET = "/var/run/docker.sock"
"""The daemon's socket when no daemon is named (``sandbox.docker_host``, ``DOCKER_HOST``)."""
DOCKERD_STATE_VAR = "AGENTRL_TEST_DOCKERD_STATE"
DOCKERD_STATE_DEFAULT = "/tmp/agentrl-test-dockerd/state.json"
"""Where agentrl's own scripts record a ``dockerd`` they started (``scripts/test.sh`` through
``tests/integration/sandboxes/dockerd_ctl.py``): JSON with its ``pid`` and the ``host`` it
serves (``unix:///var/run/docker.sock`` when absent); the path is ``$AGENTRL_TEST_DOCKERD_STATE``
or this default."""
NAMED_BY = "sandbox.docker_host / DOCKER_HOST"
"""How messages name the two ways to name a daemon."""
DAEMON_TIMEOUT_S = 30
"""Seconds a client waits for one daemon request (``docker_client``'s default)."""
_MAX_POOL = 128
"""HTTP connections kept to the daemon (concurrent execs each hold one while they start)."""


def named_daemon(host: str | None = None) -> tuple[str, str] | None:
    """The daemon the user named and where: ``(host, "sandbox.docker_host")`` when ``host``
    (the config's ``sandbox.docker_host``) is given, which wins over the environment (the
    config is the run's record); else ``($DOCKER_HOST, "DOCKER_HOST")`` when set; else None."""
    if host:
        return host, "sandbox.docker_host"
    env = os.environ.get("DOCKER_HOST", "")
    return (env, "DOCKER_HOST") if env else None


def daemon_address(host: str | None = None) -> str:
    """The address a client of ``host`` connects to: the named daemon (``named_daemon``),
    else ``unix:///var/run/docker.sock``."""
    named = named_daemon(host)
    return named[0] if named else f"unix://{DOCKER_SOCKET}"


def daemon_is_remote(host: str | None = None) -> bool:
    """True when the daemon ``host`` means (``daemon_address``) is not a local unix socket
    (its containers' processes are then not this machine's)."""
    return not daemon_address(host).startswith("unix://")


def client_is_remote(client: docker.DockerClient) -> bool:
    """True when ``client`` talks to a daemon over the network (the SDK's ``base_url`` of a
    unix socket is ``http+docker://...``)."""
    return not str(client.api.base_url).startswith("http+docker://")


def infra_errors() -> tuple[type[BaseException], ...]:
    """The exceptions that mean the daemon (not a command) failed: the SDK's, the HTTP
    layer's and OS errors."""
    import docker.errors
    import requests.exceptions

    return (docker.errors.DockerException, requests.exceptions.RequestException, OSError)


def docker_client(timeout_s: float = DAEMON_TIMEOUT_S, host: str | None = None) -> docker.DockerClient:
    """A client of the daemon ``host`` means (``daemon_address``: ``sandbox.docker_host``,
    else ``DOCKER_HOST``, else the default socket) that answered a ping; ``timeout_s``
    (seconds, at least 1) bounds each request. ``DOCKER_TLS_VERIFY`` / ``DOCKER_CERT_PATH``
    apply as for the ``docker`` CLI.

    Raises:
        SandboxError: the daemon does not answer (the message names its address).
    """
    import docker

    address = daemon_address(host)
    try:
        client = docker.from_env(timeout=int(max(1, timeout_s)), max_pool_size=_MAX_POOL,
                                 environment={**os.environ, "DOCKER_HOST": address})
        client.ping()
    except infra_errors() as exc:
        raise SandboxError(f"the Docker daemon at {address} does not answer: {exc}") from exc
    return client


def docker_available(timeout_s: float = 2.0, host: str | None = None) -> bool:
    """True when the daemon ``host`` means answers the SDK's ping within ``timeout_s`` seconds."""
    address = daemon_address(host)
    if address.startswith("unix://") and not os.path.exists(address[len("unix://"):]):
        return False
    try:
        client = docker_client(timeout_s, host)
    except SandboxError:
        return False
    client.close()
    return True


def docker_daemon_answers(timeout_s: float = 2.0, host: str | None = None) -> bool:
    """True when the daemon ``host`` means (``daemon_address``) answers ``/_ping`` within
    ``timeout_s`` seconds.

    A unix socket is asked directly (no ``docker`` import); a remote daemon through the
    Docker SDK (``docker_available``).
    """
    address = daemon_address(host)
    if not address.startswith("unix://"):
        return docker_available(timeout_s, host)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(timeout_s)
            s.connect(address[len("unix://"):])
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


def daemon_pid(path: str | None = None) -> int | None:
    """The pid of the process serving the unix socket ``path`` (default
    ``/var/run/docker.sock``; ``SO_PEERCRED``), or None when nobody serves it or the pid is
    not visible from here (another pid namespace)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(2.0)
            s.connect(path or DOCKER_SOCKET)
            pid, _, _ = struct.unpack("3i", s.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, 12))
    except OSError:
        return None
    return pid if pid > 0 else None


def agentrl_daemon(timeout_s: float = 2.0) -> tuple[str, int] | None:
    """``(address, pid)`` of the ``dockerd`` agentrl's scripts started and recorded (see
    ``DOCKERD_STATE_DEFAULT``) when it still serves the socket it was recorded with: the
    process behind that socket (``SO_PEERCRED``) is the recorded pid and it answers. None
    otherwise (no record, a stale pid, another daemon on that socket)."""
    path = os.environ.get(DOCKERD_STATE_VAR) or DOCKERD_STATE_DEFAULT
    try:
        with open(path, encoding="utf-8") as fh:
            state = json.load(fh)
        pid = int(state["pid"])
        address = str(state.get("host") or f"unix://{DOCKER_SOCKET}")
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    if not address.startswith("unix://") or daemon_pid(address[len("unix://"):]) != pid:
        return None
    return (address, pid) if docker_daemon_answers(timeout_s, address) else None


def which_daemon(host: str | None = None, timeout_s: float = 2.0) -> tuple[str | None, str]:
    """The Docker daemon ``sandbox.backend: auto`` uses, by this rule:

    1. A named daemon: ``host`` (the config's ``sandbox.docker_host``), else ``DOCKER_HOST``.
       It must answer: a named daemon that does not is an error, never a silent switch.
    2. Else the ``dockerd`` agentrl's own scripts started (``agentrl_daemon``: recorded by
       ``scripts/test.sh``, still serving its socket), when it answers.
    3. Else none, whatever else answers: a daemon at the default socket that nobody named
       and agentrl did not start may be another job's, so it is only reported.

    Returns:
        ``(address, label)``: e.g. ``("tcp://10.0.0.5:2375", "sandbox.docker_host")``,
        ``("unix:///var/run/docker.sock", "DOCKER_HOST")``, ``("unix:///var/run/docker.sock",
        "started by agentrl")``; ``(None, why)`` when none is ours, ``why`` saying whether a
        daemon answers at the default socket and how to use it.

    Raises:
        SandboxError: the named daemon does not answer within ``timeout_s`` seconds.
    """
    named = named_daemon(host)
    if named is not None:
        address, source = named
        if not docker_daemon_answers(timeout_s, address):
            raise SandboxError(
                f"{source}={address!r} names a Docker daemon that does not answer; start that daemon, "
                f"name one that answers, or set sandbox.backend: bwrap"
            )
        return address, source
    ours = agentrl_daemon(timeout_s)
    if ours is not None:
        return ours[0], "started by agentrl"
    default = f"unix://{DOCKER_SOCKET}"
    if docker_daemon_answers(timeout_s, default):
        return None, (f"a Docker daemon answers at {default} but was neither named ({NAMED_BY}) nor "
                      f"started by agentrl; set sandbox.docker_host: {default} to use it")
    return None, f"no Docker daemon named ({NAMED_BY}) or started by agentrl, and none answers at {default}"
