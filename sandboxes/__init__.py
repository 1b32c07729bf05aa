"""Sandboxes: where environments run untrusted commands.

An environment receives a ``Sandbox`` and never imports a backend (design.md). Backends:

* ``"bwrap"``: ``BwrapSandbox``, bubblewrap on the local host (``sandboxes.bwrap``).
* ``"docker"``: ``DockerSandbox``, one container per sandbox (the ``sandboxes.docker``
  package, with its images and container reaping; the ``docker`` SDK is imported only
  when this backend is used).

``make_sandbox(backend, spec)`` picks one by name (``"auto"``: Docker when a daemon of
ours answers, i.e. the one ``DOCKER_HOST`` names or the one at the default socket, else
bubblewrap); ``choose_backend`` says which ``"auto"`` means here and why (a
run asks once and uses that backend for all its sandboxes);
``reap_orphans()`` removes what crashed runs left behind (process trees, working
directories, cgroups and containers); ``SandboxPool`` hands out pre-started sandboxes
(``PooledSandbox``: one lease of it); ``docker_daemon_answers()`` says whether a Docker
daemon is up (``sandboxes.docker.daemon``, without importing the SDK).
"""

from __future__ import annotations

import logging

import os

from agentrl.errors import ConfigError, SandboxError
from sandboxes.base import ExecListener, Sandbox, SandboxSpec
from sandboxes.bwrap import BwrapSandbox
from sandboxes.docker.daemon import DOCKER_SOCKET, docker_daemon_answers
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
    "choose_backend",
    "docker_daemon_answers",
    "make_sandbox",
    "reap_orphans",
    "resolve_backend",
]

logger = logging.getLogger(__name__)


def __getattr__(name: str):
    # The Docker backend is imported on first use only (it imports the docker SDK).
    if name == "DockerSandbox":
        from sandboxes.docker.sandbox import DockerSandbox

        return DockerSandbox
    raise AttributeError(f"module 'sandboxes' has no attribute {name!r}")

BACKENDS = ("auto", "bwrap", "docker")
"""Names ``make_sandbox`` accepts."""


def resolve_backend(backend: str) -> str:
    """``"bwrap"`` or ``"docker"``: the backend ``backend`` names, ``"auto"`` resolved to
    ``"docker"`` when a Docker daemon of ours answers (``which_daemon``), else ``"bwrap"``.

    Raises:
        ConfigError: unknown backend.
        SandboxError: ``"auto"`` with a ``DOCKER_HOST`` whose daemon does not answer.
    """
    if backend in ("bwrap", "docker"):
        return backend
    if backend == "auto":
        from sandboxes.docker.daemon import which_daemon

        return "docker" if which_daemon()[0] is not None else "bwrap"
    raise ConfigError(f"sandbox backend={backend!r} is unknown; expected one of {BACKENDS}")


def choose_backend(backend: str, image: str) -> tuple[str, str]:
    """What ``backend`` means on this host now, and why: ``("bwrap" | "docker", line)``,
    ``line`` being what a run announces in its first lines, e.g. ``"docker at
    unix:///var/run/docker.sock (DOCKER_HOST)"``, ``"docker at unix:///var/run/docker.sock
    (started by agentrl)"`` or ``"bwrap: no docker daemon of ours (...)"``.

    ``"auto"`` uses Docker when a daemon *of ours* answers and has ``image``
    (``sandboxes.docker.daemon.which_daemon``: the one ``DOCKER_HOST`` names, which must
    answer, else the one at the default socket ``/var/run/docker.sock``), else bubblewrap.
    A run calls this once and hands the answer to ``make_sandbox`` for every sandbox, so
    one run never mixes backends (a daemon that stops mid-run then surfaces as an
    infrastructure error of Docker sandboxes, not as a silent switch).

    Raises:
        ConfigError: unknown backend.
        SandboxError: ``backend`` is ``"auto"``, ``DOCKER_HOST`` is set and the daemon it
            names does not answer, or lacks ``image``.
    """
    if backend not in BACKENDS:
        raise ConfigError(f"sandbox backend={backend!r} is unknown; expected one of {BACKENDS}")
    if backend == "bwrap":
        return "bwrap", "bwrap: named in the config (sandbox.backend)"
    if backend == "docker":
        where = os.environ.get("DOCKER_HOST") or f"unix://{DOCKER_SOCKET}"
        return "docker", f"docker at {where}: named in the config (sandbox.backend)"
    from sandboxes.docker.daemon import which_daemon

    address, label = which_daemon()
    if address is None:
        return "bwrap", f"bwrap: no docker daemon of ours ({label})"
    from sandboxes.docker.images import image_exists

    if not image_exists(image):
        if label == "DOCKER_HOST":
            raise SandboxError(f"the Docker daemon DOCKER_HOST={address!r} names lacks image {image!r}; "
                               "build it there with `agentrl sandbox build-image`, or unset DOCKER_HOST")
        return "bwrap", (f"bwrap: docker at {address} ({label}) lacks image {image!r}; build it "
                         "with `agentrl sandbox build-image` to use Docker")
    return "docker", f"docker at {address} ({label})"


def make_sandbox(backend: str, spec: SandboxSpec) -> Sandbox:
    """Create a sandbox with the named backend.

    Args:
        backend: ``"bwrap"``, ``"docker"`` or ``"auto"`` (``choose_backend`` for this one
            sandbox; the choice and why are logged at INFO on logger ``sandboxes``).
        spec: limits and layout.

    Raises:
        ConfigError: unknown backend, or an invalid spec.
        SandboxError: the backend cannot start a sandbox on this host (for ``"docker"``:
            the daemon does not answer, or ``spec.image`` is missing).
    """
    chosen, why = choose_backend(backend, spec.image)
    if backend == "auto":
        logger.info("sandboxes: %s", why)
    if chosen == "docker":
        from sandboxes.docker.sandbox import DockerSandbox

        return DockerSandbox(spec)
    return BwrapSandbox(spec)
