"""Sandboxes: where environments run untrusted commands.

An environment receives a ``Sandbox`` and never imports a backend (design.md). Backends:

* ``"bwrap"``: ``BwrapSandbox``, bubblewrap on the local host (``sandboxes.bwrap``).
* ``"docker"``: ``DockerSandbox``, one container per sandbox (the ``sandboxes.docker``
  package, with its images and container reaping; the ``docker`` SDK is imported only
  when this backend is used).

``make_sandbox(backend, spec)`` picks one by name (``"auto"``: Docker when its daemon
answers, else bubblewrap); ``choose_backend`` says which ``"auto"`` means here and why (a
run asks once and uses that backend for all its sandboxes);
``reap_orphans()`` removes what crashed runs left behind (process trees, working
directories, cgroups and containers); ``SandboxPool`` hands out pre-started sandboxes
(``PooledSandbox``: one lease of it); ``docker_daemon_answers()`` says whether a Docker
daemon is up (``sandboxes.docker.daemon``, without importing the SDK).
"""

from __future__ import annotations

import logging

from agentrl.errors import ConfigError
from sandboxes.base import ExecListener, Sandbox, SandboxSpec
from sandboxes.bwrap import BwrapSandbox
from sandboxes.docker.daemon import docker_daemon_answers
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
    ``"docker"`` when a Docker daemon answers a ping (2 s), else ``"bwrap"``.

    Raises:
        ConfigError: unknown backend.
    """
    if backend in ("bwrap", "docker"):
        return backend
    if backend == "auto":
        return "docker" if docker_daemon_answers() else "bwrap"
    raise ConfigError(f"sandbox backend={backend!r} is unknown; expected one of {BACKENDS}")


def choose_backend(backend: str, image: str) -> tuple[str, str]:
    """What ``backend`` means on this host now, and why: ``("bwrap" | "docker", reason)``.

    ``"auto"`` is ``"docker"`` when a Docker daemon answers a ping (2 s) and has ``image``,
    else ``"bwrap"``. A run calls this once and hands the answer to ``make_sandbox`` for
    every sandbox, so one run never mixes backends (a daemon that stops mid-run then
    surfaces as an infrastructure error of Docker sandboxes, not as a silent switch).

    Raises:
        ConfigError: unknown backend.
    """
    chosen = resolve_backend(backend)
    if backend != "auto":
        return chosen, "named in the config"
    if chosen == "bwrap":
        return chosen, "no Docker daemon answers"
    from sandboxes.docker.images import image_exists

    if not image_exists(image):
        return "bwrap", (f"a Docker daemon answers but image {image!r} is missing; build it "
                         "with `agentrl sandbox build-image` to use Docker")
    return "docker", "a Docker daemon answers and has the image"


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
        logger.info("sandbox backend 'auto' chose %r (%s)", chosen, why)
    if chosen == "docker":
        from sandboxes.docker.sandbox import DockerSandbox

        return DockerSandbox(spec)
    return BwrapSandbox(spec)
