"""Sandboxes: where environments run untrusted commands.

An environment receives a ``Sandbox`` and never imports a backend (design.md). Backends:

* ``"bwrap"``: ``BwrapSandbox``, bubblewrap on the local host (``sandboxes.bwrap``).
* ``"docker"``: not built yet.

``make_sandbox(backend, spec)`` picks one by name; ``reap_orphans()`` removes what crashed
runs left behind.
"""

from __future__ import annotations

import logging

from agentrl.errors import ConfigError
from sandboxes.base import ExecListener, Sandbox, SandboxSpec
from sandboxes.bwrap import BwrapSandbox
from sandboxes.reaper import reap_orphans

__all__ = [
    "BACKENDS",
    "BwrapSandbox",
    "ExecListener",
    "Sandbox",
    "SandboxSpec",
    "make_sandbox",
    "reap_orphans",
]

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "bwrap", "docker")
"""Names ``make_sandbox`` accepts."""


def make_sandbox(backend: str, spec: SandboxSpec) -> Sandbox:
    """Create a sandbox with the named backend.

    Args:
        backend: ``"bwrap"``, ``"docker"`` or ``"auto"`` (Docker when its backend exists
            and ``dockerd`` is up, else bubblewrap; today always bubblewrap, and it logs
            that choice).
        spec: limits and layout.

    Raises:
        ConfigError: unknown backend, ``"docker"`` (not built yet), or an invalid spec.
        SandboxError: the backend cannot start a sandbox on this host.
    """
    if backend == "bwrap":
        return BwrapSandbox(spec)
    if backend == "auto":
        logger.info("sandbox backend 'auto' chose 'bwrap' (the Docker backend is not built yet)")
        return BwrapSandbox(spec)
    if backend == "docker":
        raise ConfigError(
            "sandbox backend 'docker' is not built yet; use 'bwrap' (or 'auto', which "
            "chooses bwrap for now)"
        )
    raise ConfigError(f"sandbox backend={backend!r} is unknown; expected one of {BACKENDS}")
