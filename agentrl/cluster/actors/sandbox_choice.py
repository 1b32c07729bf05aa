"""Which sandboxes a run uses, said in its first lines on the driver's console.

``announce_sandboxes(cfg)`` resolves ``sandbox.backend`` on the driver when the run starts
(``sandboxes.choose_sandboxes`` with ``sandbox.docker_host``) and logs one line on the
``agentrl.run`` logger, e.g.::

    sandboxes: docker at unix:///var/run/docker.sock (started by agentrl)
    sandboxes: docker at tcp://10.0.0.5:2375 (sandbox.docker_host)
    sandboxes: bwrap: a Docker daemon answers at unix:///var/run/docker.sock but was neither
        named (sandbox.docker_host / DOCKER_HOST) nor started by agentrl; set
        sandbox.docker_host: unix:///var/run/docker.sock to use it

The ``agentrl.run`` logger is at INFO (unless someone set its level), so its lines reach
the console of a command that logs at WARNING (``agentrl.logs.setup_console``); none of
``agentrl.logs.KNOWN_HARMLESS`` hides them. A named daemon that does not answer stops the
run here, before anything starts (``SandboxError``).

Where the sandboxes run in the driver's process or its local Ray instance, the driver's
choice is the run's: each rollout actor resolves the same rule again and logs the same
``sandboxes: ...`` at INFO. On a cluster (``cluster.address``, ``cluster.sandbox_hosts``) each
node decides for itself; the line says so, with this machine's answer, and
``start_sandbox_hosts`` announces each host's choice.
"""

from __future__ import annotations

import logging
from typing import Any

import gymnasium

import environments
import sandboxes
from agentrl.errors import SandboxError

__all__ = ["ANNOUNCE_LOGGER", "announce", "announce_sandboxes", "sandbox_line"]

ANNOUNCE_LOGGER = "agentrl.run"
"""The logger of a run's first lines (INFO, shown on a command's console)."""

_log = logging.getLogger(ANNOUNCE_LOGGER)
if _log.level == logging.NOTSET:
    _log.setLevel(logging.INFO)


def announce(line: str) -> None:
    """Log ``line`` at INFO on ``agentrl.run`` (shown where the command logs at WARNING)."""
    _log.info("%s", line)


def _uses_sandbox(cfg: Any) -> bool:
    """False when ``env.id``'s class says ``uses_sandbox = False``; True otherwise, an env
    that cannot be looked up here included (the run's own checks report that)."""
    try:
        environments.import_env_modules(cfg.env.import_modules)
        entry = gymnasium.spec(cfg.env.id).entry_point
        env_cls = gymnasium.envs.registration.load_env_creator(entry) if isinstance(entry, str) else entry
    except Exception:  # noqa: BLE001 - the run's env checks say what is wrong
        return True
    return bool(getattr(env_cls, "uses_sandbox", True))


def sandbox_line(cfg: Any) -> str:
    """The line a run announces: ``"sandboxes: " + why`` (``sandboxes.SandboxChoice.why``).

    Args:
        cfg: the run's ``agentrl.config.Config`` (``sandbox.backend``,
            ``sandbox.docker_host``, ``cluster.address``, ``cluster.sandbox_hosts``, ``env``).

    Raises:
        SandboxError: the sandboxes run on this machine and the daemon named
            (``sandbox.docker_host`` / ``DOCKER_HOST``) does not answer, or lacks the image.
        ConfigError: unknown backend.
    """
    if not _uses_sandbox(cfg):
        return f"sandboxes: none ({cfg.env.id} runs without a sandbox)"
    backend, image, host = cfg.sandbox.backend, sandboxes.SandboxSpec.image, cfg.sandbox.docker_host
    if cfg.cluster.sandbox_hosts > 0:
        where = "on each sandbox host's node (cluster.sandbox_hosts)"
    elif cfg.cluster.address is not None:
        where = "on each rollout actor's node (cluster.address)"
    else:
        return "sandboxes: " + sandboxes.choose_sandboxes(backend, image, host).why
    try:
        here = sandboxes.choose_sandboxes(backend, image, host).why
    except SandboxError as exc:
        here = str(exc)
    return f"sandboxes: chosen {where}; on this machine: {here}"


def announce_sandboxes(cfg: Any) -> str:
    """``sandbox_line(cfg)``, logged on ``agentrl.run`` (``announce``). Returns the line.

    Raises:
        SandboxError, ConfigError: as ``sandbox_line``.
    """
    line = sandbox_line(cfg)
    announce(line)
    return line
