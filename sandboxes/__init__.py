"""Sandboxes: where environments run untrusted commands.

An environment receives a ``Sandbox`` and never imports a backend (docs/design.md). Backends:

* ``"bwrap"``: ``BwrapSandbox``, bubblewrap on the local host (``sandboxes.bwrap``).
* ``"docker"``: ``DockerSandbox``, one container per sandbox (the ``sandboxes.docker``
  package, with its images and container reaping; the ``docker`` SDK is imported only
  when this backend is used).

``make_sandbox(backend, spec)`` picks one by name (``"auto"``: Docker when a daemon of
ours answers, i.e. the one ``sandbox.docker_host`` or ``DOCKER_HOST`` names, else the one
agentrl's own scripts started; else bubblewrap); ``choose_sandboxes`` (``choose_backend``) says which ``"auto"``
means here, on which daemon and why (a run asks once and uses that backend for all its sandboxes);
``reap_orphans()`` removes what crashed runs left behind (process trees, working
directories, cgroups and containers); ``SandboxPool`` hands out pre-started sandboxes
(``PooledSandbox``: one lease of it); ``docker_daemon_answers()`` says whether a Docker
daemon is up (``sandboxes.docker.daemon``, without importing the SDK).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from agentrl.errors import ConfigError, SandboxError
from sandboxes.base import ExecListener, Sandbox, SandboxSpec
from sandboxes.bwrap import BwrapSandbox
from sandboxes.docker.daemon import daemon_address, docker_client, docker_daemon_answers, named_daemon, which_daemon
from sandboxes.docker.images import image_exists
from sandboxes.pool import PooledSandbox, PoolStats, SandboxPool
from sandboxes.reaper import reap_orphans

__all__ = [
    "BACKENDS",
    "BwrapSandbox",
    "DockerSandbox",
    "ExecListener",
    "Sandbox",
    "SandboxSpec",
    "PooledSandbox",
    "PoolStats",
    "SandboxPool",
    "SandboxChoice",
    "choose_backend",
    "choose_sandboxes",
    "docker_daemon_answers",
    "make_sandbox",
    "reap_orphans",
    "resolve_backend",
]

logger = logging.getLogger(__name__)


def __getattr__(name: str):
    # The Docker backend is imported on first use only (it imports the docker SDK).
    if name == "DockerSandbox":
        from sandboxes.docker.sandbox import DockerSandbox  # heavy: docker

        return DockerSandbox
    raise AttributeError(f"module 'sandboxes' has no attribute {name!r}")

BACKENDS = ("auto", "bwrap", "docker")
"""Names ``make_sandbox`` accepts."""


def resolve_backend(backend: str, docker_host: str | None = None) -> str:
    """``"bwrap"`` or ``"docker"``: the backend ``backend`` names, ``"auto"`` resolved to
    ``"docker"`` when a Docker daemon of ours answers (``which_daemon`` with ``docker_host``,
    the config's ``sandbox.docker_host``), else ``"bwrap"``.

    Raises:
        ConfigError: unknown backend.
        SandboxError: ``"auto"`` with a named daemon (``sandbox.docker_host`` /
            ``DOCKER_HOST``) that does not answer.
    """
    if backend in ("bwrap", "docker"):
        return backend
    if backend == "auto":
        return "docker" if which_daemon(docker_host)[0] is not None else "bwrap"
    raise ConfigError(f"sandbox backend={backend!r} is unknown; expected one of {BACKENDS}")


@dataclass(frozen=True)
class SandboxChoice:
    """What ``sandbox.backend`` means on this host now (``choose_sandboxes``).

    Attributes:
        backend: ``"bwrap"`` or ``"docker"``.
        why: the reason, as a run announces it after ``"sandboxes: "``.
        docker_host: the daemon's address for ``"docker"`` (pass it to ``make_sandbox``),
            e.g. ``"unix:///var/run/docker.sock"``; None for ``"bwrap"``.
    """

    backend: str
    why: str
    docker_host: str | None = None


def choose_backend(backend: str, image: str, docker_host: str | None = None) -> tuple[str, str]:
    """``(choice.backend, choice.why)`` of ``choose_sandboxes(backend, image, docker_host)``."""
    choice = choose_sandboxes(backend, image, docker_host)
    return choice.backend, choice.why


def choose_sandboxes(backend: str, image: str, docker_host: str | None = None) -> SandboxChoice:
    """What ``backend`` means on this host now, and why (``SandboxChoice``);
    a run announces ``"sandboxes: " + why`` in its first lines, e.g. ``"docker at
    tcp://10.0.0.5:2375 (sandbox.docker_host)"``, ``"docker at unix:///var/run/docker.sock
    (started by agentrl)"`` or ``"bwrap: a Docker daemon answers at ... but was neither
    named ... nor started by agentrl; set sandbox.docker_host: ... to use it"``.

    ``docker_host`` is the config's ``sandbox.docker_host`` (it wins over ``DOCKER_HOST``).

    * ``"auto"``: Docker on the daemon ``sandboxes.docker.daemon.which_daemon`` finds (the
      named one, which must answer, else the one agentrl's scripts started) when it has
      ``image``, else bubblewrap. A daemon nobody named and agentrl did not start is never
      used (it may be another job's); the reason says it answers and how to use it.
    * ``"docker"``: the named daemon, else the default socket (the user asked for Docker);
      it must answer.
    * ``"bwrap"``: bubblewrap.

    A run calls this once and hands the answer to ``make_sandbox`` for every sandbox, so
    one run never mixes backends (a daemon that stops mid-run then surfaces as an
    infrastructure error of Docker sandboxes, not as a silent switch).

    Raises:
        ConfigError: unknown backend.
        SandboxError: a named daemon (``"auto"``) or the daemon ``"docker"`` uses does not
            answer, or a named daemon lacks ``image`` (``"auto"``).
    """
    if backend not in BACKENDS:
        raise ConfigError(f"sandbox backend={backend!r} is unknown; expected one of {BACKENDS}")
    if backend == "bwrap":
        return SandboxChoice("bwrap", "bwrap: named in the config (sandbox.backend)")

    if backend == "docker":
        address = daemon_address(docker_host)
        named = named_daemon(docker_host)
        source = named[1] if named else "the default socket"
        if not docker_daemon_answers(2.0, address):
            raise SandboxError(f"sandbox.backend is docker but the Docker daemon at {address} ({source}) does "
                               "not answer; start it, name another with sandbox.docker_host, or set "
                               "sandbox.backend: auto or bwrap")
        return SandboxChoice("docker", f"docker at {address} (sandbox.backend: docker; {source})", address)
    address, label = which_daemon(docker_host)
    if address is None:
        return SandboxChoice("bwrap", f"bwrap: {label}")

    client = docker_client(host=address)
    try:
        has_image = image_exists(image, client)
    finally:
        client.close()
    if not has_image:
        if label != "started by agentrl":
            raise SandboxError(f"the Docker daemon {label}={address!r} names lacks image {image!r}; build it "
                               f"there with `DOCKER_HOST={address} agentrl sandbox build-image`, or set "
                               "sandbox.backend: bwrap")
        return SandboxChoice("bwrap", f"bwrap: docker at {address} ({label}) lacks image {image!r}; build it "
                                      "with `agentrl sandbox build-image` to use Docker")
    return SandboxChoice("docker", f"docker at {address} ({label})", address)


def make_sandbox(backend: str, spec: SandboxSpec, *, docker_host: str | None = None) -> Sandbox:
    """Create a sandbox with the named backend.

    Args:
        backend: ``"bwrap"``, ``"docker"`` or ``"auto"`` (``choose_backend`` for this one
            sandbox; the choice and why are logged at INFO on logger ``sandboxes``; a run
            resolves ``"auto"`` once and passes the answer here).
        spec: limits and layout.
        docker_host: the config's ``sandbox.docker_host`` (``None``: ``DOCKER_HOST``, else
            the default socket): the daemon a Docker sandbox is made on.

    Raises:
        ConfigError: unknown backend, or an invalid spec.
        SandboxError: the backend cannot start a sandbox on this host (for ``"docker"``:
            the daemon does not answer, or ``spec.image`` is missing).
    """
    chosen = backend
    if backend not in ("bwrap", "docker"):
        choice = choose_sandboxes(backend, spec.image, docker_host)
        logger.info("sandboxes: %s", choice.why)
        chosen, docker_host = choice.backend, choice.docker_host
    if chosen == "docker":
        from sandboxes.docker.sandbox import DockerSandbox  # heavy: docker

        return DockerSandbox(spec, docker_host=docker_host)
    return BwrapSandbox(spec)
