"""The sandbox interface every backend implements (bubblewrap, Docker, ...).

An environment receives a ``Sandbox`` (``HumanEvalEnv(sandbox=...)``) and never imports a
backend. Backends import only ``agentrl.types`` and ``agentrl.errors`` of ours
(docs/design.md); ``docker`` is imported only by the Docker backend.

Contract (each backend's tests check it):

* ``exec`` never raises for what the *command* did (non-zero exit, timeout, huge or
  non-UTF-8 output): that is reported in the ``ExecResult``. It raises ``SandboxError``
  (an ``InfraError``) only when the sandbox itself failed (did not start, died, backend
  gone).
* No process started by ``exec`` outlives its ``timeout_s`` (the whole process tree is
  killed, ``setsid`` escapees included), nor the sandbox's ``close()``.
* Output is decoded as UTF-8 with U+FFFD for invalid bytes, incrementally, so a multi-byte
  character split across reads arrives intact; it is capped at ``output_limit_bytes``
  per stream, keeping a head and a tail with a marker saying how many bytes were dropped,
  and memory stays bounded whatever the command prints.
* Every exec result is passed to each listener added with ``add_listener`` (the rollout
  records them into the current turn, and the replay store persists them).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from typing import Callable, Literal, Mapping, Protocol, Sequence, runtime_checkable

from agentrl.errors import ConfigError
from agentrl.types import ExecResult

ExecListener = Callable[[ExecResult], None]
_log = logging.getLogger(__name__)


class ExecListeners:
    """The listeners of one sandbox (what every backend's ``add_listener`` /
    ``remove_listener`` keep): thread-safe; a listener that raises is logged and skipped,
    so the exec still returns its result."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._items: list[ExecListener] = []

    def add(self, listener: ExecListener) -> None:
        """Raises ConfigError: ``listener`` is not callable."""
        if not callable(listener):
            raise ConfigError(f"listener={listener!r} is not callable")
        with self._lock:
            self._items.append(listener)

    def remove(self, listener: ExecListener) -> None:
        """No-op if it was not added."""
        with self._lock:
            try:
                self._items.remove(listener)
            except ValueError:
                pass

    def notify(self, result: ExecResult) -> None:
        with self._lock:
            items = list(self._items)
        for listener in items:
            try:
                listener(result)
            except Exception:
                _log.exception("sandbox exec listener %r raised; ignored", listener)


@dataclass(frozen=True)
class SandboxSpec:
    """Limits and layout of one sandbox.

    Attributes:
        image: container image (Docker backend only; bubblewrap uses the host's read-only
            ``/usr``).
        cpus: CPU share (cores, may be fractional).
        memory_mb: memory limit in MiB for everything running in the sandbox.
        pids_limit: maximum number of processes/threads.
        network: ``"none"`` (default: no network at all), ``"host"``, or ``"bridge"`` (Docker
            only: the daemon's default bridge network, a network namespace of its own with
            the internet through the host's NAT. It is not cut off from the host: a service
            this host listens with on its bridge address or on all interfaces (``0.0.0.0``)
            answers the sandbox, through the bridge gateway; one bound to ``127.0.0.1`` does
            not. The Docker backend logs a warning once per process when a bridge sandbox
            starts; docs/sandboxes.md).
        workdir: the private writable working directory, as seen inside the sandbox.
        output_limit_bytes: cap per stream (stdout, stderr) of one exec.
        default_timeout_s: timeout of an exec that passes none.
        run_id: label put on every container / process tree, so a reaper can remove what
            a crashed run left behind.
        env: variables every exec sees.
        ro_mounts: ``(host path, sandbox path)`` pairs bound read-only into the sandbox
            (absolute paths; the host path must exist on the machine that runs the sandbox,
            so a remote Docker daemon refuses them). The gateway's socket directory is one
            (``agentrl.gateway``: an agent command reaches the gateway through it and no
            network).
        writable_root: Docker only. True: the container's root file system is writable (its
            own layer, removed with the container) and ``workdir`` is the image's own
            directory with its files, not an empty tmpfs: an image that ships a task's files
            in its working directory (Harbor tasks, ``agentrl.hubs.harbor``). Writes still
            need the sandbox user's permissions (uid 1000, no capabilities).
        tmpfs_dirs: Docker only. Further empty writable directories (normalised absolute
            paths, each a tmpfs owned by the sandbox user and sized like ``/tmp``), e.g.
            ``("/logs",)``.
    """

    image: str = "agentrl-base:latest"
    cpus: float = 1.0
    memory_mb: int = 1024
    pids_limit: int = 256
    network: Literal["none", "host", "bridge"] = "none"
    workdir: str = "/work"
    output_limit_bytes: int = 64 * 1024
    default_timeout_s: float = 30.0
    run_id: str = "default"
    env: Mapping[str, str] = field(default_factory=dict)
    ro_mounts: tuple[tuple[str, str], ...] = ()
    writable_root: bool = False
    tmpfs_dirs: tuple[str, ...] = ()


@runtime_checkable
class Sandbox(Protocol):
    """What an environment may do with its sandbox."""

    spec: SandboxSpec

    def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        """Run ``command`` (a shell string run by ``/bin/sh -c``, or an argv list).

        ``cwd`` defaults to ``spec.workdir``; ``timeout_s`` to ``spec.default_timeout_s``.

        Raises:
            SandboxError: the sandbox itself failed (never for the command's own failure).
        """
        ...

    def write_file(self, path: str, content: bytes | str) -> None:
        """Write a file (relative paths are under ``spec.workdir``). Raises SandboxError."""
        ...

    def read_file(self, path: str) -> bytes:
        """Read a file (relative paths are under ``spec.workdir``). Raises SandboxError
        (FileNotFoundError's message in it) when missing."""
        ...

    def add_listener(self, listener: ExecListener) -> None:
        """Call ``listener(result)`` after every exec."""
        ...

    def remove_listener(self, listener: ExecListener) -> None:
        ...

    def close(self) -> None:
        """Kill everything still running and delete the sandbox. Idempotent."""
        ...
