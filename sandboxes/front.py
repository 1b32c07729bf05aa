"""The front half every sandbox backend shares, used by composition.

A backend (``BwrapSandbox``, ``DockerSandbox``) holds one ``SandboxFront`` as ``self._front``
and keeps only its own core (how a command is started, pumped and killed). The front owns:

* the validated ``SandboxSpec`` and the run label (``SandboxLabel``) of the sandbox;
* the exec prologue (``exec_args``): command, timeout, stdin, env and cwd checked in that
  order, each bad value a ``ConfigError`` naming it;
* the environment a command sees (``environment``): defaults, ``spec.env``, the exec's own
  variables, and last the run label, which a command cannot override;
* the listeners (``listeners``) and the open/closed state with the execs in flight
  (``begin`` / ``end`` / ``cancelled`` / ``close``), under one lock;
* ``content_bytes`` for ``write_file`` and ``OncePerProcess`` for the reap-at-start guard.

The methods a backend exposes unchanged (``add_listener``, ``remove_listener``, ``closed``,
``__enter__``, ``__exit__``) are defined here once and bound in each backend's class body
(``add_listener = front.add_listener``); they reach the state through ``self._front``.
"""

from __future__ import annotations

import logging
import posixpath
import signal
import threading
import uuid
import weakref
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

from agentrl.errors import ConfigError, SandboxError
from sandboxes.base import ExecListener, ExecListeners, SandboxSpec
from sandboxes.labels import Owner, SandboxLabel
from sandboxes.validation import normalize_command, validate_env, validate_spec, validate_timeout

logger = logging.getLogger(__name__)

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""``PATH`` inside the sandbox (Debian's default), on every backend."""
HOSTNAME = "agentrl-sandbox"
"""Host name a command sees, on every backend."""
TIMEOUT_EXIT_CODE = 128 + signal.SIGKILL
"""``exit_code`` of a command killed at its timeout (137, as a shell reports SIGKILL)."""

H = TypeVar("H")
S = TypeVar("S")


@dataclass(frozen=True)
class ExecArgs:
    """One exec's arguments after the checks of ``SandboxFront.exec_args``.

    Attributes:
        record: the command as ``ExecResult.command`` records it (the shell string, or the
            argv as a tuple).
        argv: what to run (``["/bin/sh", "-c", command]`` for a shell string).
        timeout_s: wall-clock limit in seconds (finite, > 0).
        stdin: bytes to feed, or ``None`` for none (``/dev/null``).
        env: the exec's own variables (validated names and values), without the defaults.
        cwd: normalised absolute directory inside the sandbox.
    """

    record: str | tuple[str, ...]
    argv: list[str]
    timeout_s: float
    stdin: bytes | None
    env: dict[str, str]
    cwd: str


def stdin_bytes(stdin: bytes | str | None) -> bytes | None:
    """``stdin`` as bytes (``str`` encoded as UTF-8), or ``None``.

    Raises:
        ConfigError: ``stdin`` is not bytes, str or None.
    """
    if stdin is None or isinstance(stdin, bytes):
        return stdin
    if isinstance(stdin, str):
        return stdin.encode("utf-8")
    if isinstance(stdin, (bytearray, memoryview)):
        return bytes(stdin)
    raise ConfigError(f"stdin of type {type(stdin).__name__} must be bytes, str or None")


def content_bytes(content: bytes | str) -> bytes:
    """What ``write_file`` writes: ``str`` as UTF-8, bytes-like as bytes.

    Raises:
        ConfigError: ``content`` is not bytes or str.
    """
    if isinstance(content, str):
        return content.encode("utf-8")
    if isinstance(content, (bytes, bytearray, memoryview)):
        return bytes(content)
    raise ConfigError(f"content of type {type(content).__name__} must be bytes or str")


def resolve_cwd(cwd: str | None, workdir: str) -> str:
    """The exec's directory inside the sandbox: ``workdir`` when ``None``, a relative path
    under ``workdir``, an absolute one as given (normalised).

    Raises:
        ConfigError: empty, not a str, or with a NUL byte.
    """
    if cwd is None:
        return workdir
    if not isinstance(cwd, str) or not cwd or "\0" in cwd:
        raise ConfigError(f"cwd={cwd!r} must be a non-empty path without NUL bytes")
    return posixpath.normpath(posixpath.join(workdir, cwd))


class OncePerProcess:
    """Call a function the first time only, in this process; a failure is logged, never
    raised (the reap at start: a reaper failure must not stop new sandboxes)."""

    def __init__(self, what: str) -> None:
        self._what = what
        self._lock = threading.Lock()
        self._done = False

    def __call__(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> None:
        with self._lock:
            if self._done:
                return
            self._done = True
        try:
            fn(*args, **kwargs)
        except Exception:  # noqa: BLE001 - logged; see the class docstring
            logger.exception("%s failed", self._what)


class SandboxFront(Generic[H]):
    """The shared state of one sandbox; see the module docstring.

    Args:
        owner: the backend object (only its ``repr`` is used, in "is closed" errors; it is
            held by a weak reference so the backend's finalizer is not delayed).
        spec: checked with ``validate_spec``.

    Attributes:
        spec: as given, validated.
        label: the run label (run id, owner process, a fresh 12-hex sandbox id).
        label_env: ``label.environ()``, the variables every command carries.
        base_env: ``PATH``, ``HOME`` (the workdir), ``LANG``, ``TMPDIR`` of every command.
        listeners: the sandbox's exec listeners.

    Raises:
        ConfigError: an invalid ``spec`` field.
    """

    def __init__(self, owner: object, spec: SandboxSpec) -> None:
        self.spec = validate_spec(spec)
        self.label = SandboxLabel(spec.run_id, Owner.current(), uuid.uuid4().hex[:12])
        self.label_env = self.label.environ()
        self.base_env = {"PATH": SANDBOX_PATH, "HOME": spec.workdir, "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
        self.listeners = ExecListeners()
        self._owner = weakref.ref(owner)
        self._lock = threading.Lock()
        self._closed = False
        self._running: dict[Hashable, H] = {}
        self._cancelled: set[Hashable] = set()

    # ------------------------------------------------------------------ exec arguments

    def exec_args(
        self,
        command: str | Sequence[str],
        timeout_s: float | None,
        stdin: bytes | str | None,
        env: Mapping[str, str] | None,
        cwd: str | None,
    ) -> ExecArgs:
        """Check an exec's arguments (``timeout_s`` defaults to ``spec.default_timeout_s``,
        ``cwd`` to ``spec.workdir``).

        Raises:
            ConfigError: invalid ``command``, ``timeout_s``, ``stdin``, ``env`` or ``cwd``
                (checked in that order).
        """
        record, argv = normalize_command(command)
        timeout = validate_timeout(
            self.spec.default_timeout_s if timeout_s is None else timeout_s, "timeout_s"
        )
        data = stdin_bytes(stdin)
        extra = validate_env(env, "env") if env is not None else {}
        return ExecArgs(record, argv, timeout, data, extra, resolve_cwd(cwd, self.spec.workdir))

    def environment(self, extra: Mapping[str, str]) -> dict[str, str]:
        """Variables of one command: defaults, then ``spec.env``, then ``extra``, then the
        run label (last, so a command cannot forge it)."""
        return {**self.base_env, **self.spec.env, **extra, **self.label_env}

    # ------------------------------------------------------------------ open / closed

    @property
    def closed(self) -> bool:
        return self._closed

    def check_open(self, command: object = None) -> None:
        """Raises SandboxError (``<sandbox> is closed``, with ``command``) once closed."""
        if self._closed:
            raise SandboxError(f"{self._owner()!r} is closed", command=command)

    def begin(self, key: Hashable, handle: H) -> None:
        """Record an exec in flight (``handle``: what ``close`` hands back to kill it). An
        exec begun after ``close`` is marked cancelled at once."""
        with self._lock:
            self._running[key] = handle
            if self._closed:
                self._cancelled.add(key)

    def cancelled(self, key: Hashable) -> bool:
        """True when ``close`` cancelled the exec ``key`` (it must then end and raise)."""
        return key in self._cancelled

    def end(self, key: Hashable) -> bool:
        """Forget the exec ``key``; True when it was cancelled by ``close``."""
        with self._lock:
            self._running.pop(key, None)
            was_cancelled = key in self._cancelled
            self._cancelled.discard(key)
        return was_cancelled

    def close(self) -> list[H] | None:
        """Mark the sandbox closed and every exec in flight cancelled. Returns their
        handles for the backend to kill, or ``None`` when it was already closed."""
        with self._lock:
            if self._closed:
                return None
            self._closed = True
            self._cancelled.update(self._running)
            return list(self._running.values())


# Methods every backend exposes as they are, bound in its class body. ``self`` is the
# backend; its state is ``self._front``.


def add_listener(self: Any, listener: ExecListener) -> None:
    """Call ``listener(result)`` after every exec; a listener that raises is logged and
    skipped, the exec still returns. Raises ConfigError: not callable."""
    self._front.listeners.add(listener)


def remove_listener(self: Any, listener: ExecListener) -> None:
    """Stop calling ``listener``; no-op if it was not added."""
    self._front.listeners.remove(listener)


def _closed(self: Any) -> bool:
    return self._front.closed


closed = property(_closed, doc="True once ``close()`` was called.")


def enter(self: S) -> S:
    return self


def exit_(self: Any, *exc: object) -> None:
    self.close()
