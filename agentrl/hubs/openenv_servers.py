"""The OpenEnv servers the adapter talks to: one named by address, or one it starts (a local
process, or a Docker image run in agentrl's Docker sandbox backend), and who shares which.

``ServerSpec.parse(server)`` reads the env's ``server`` argument:

* ``"http://host:port"`` or ``{"base_url": ...}``: a server someone else runs; never started
  or stopped here.
* ``{"command": [argv...], "cwd": ..., "env": {...}}``: a local process, started with
  ``{port}`` in the argv replaced by a free port of 127.0.0.1 (and a leading ``~/`` expanded),
  in a session of its own. Its
  environment carries agentrl's sandbox run label (``sandboxes.labels``: run id, owner pid,
  start time and pid namespace), so ``sandboxes.reap_orphans`` (what ``agentrl train`` and
  ``agentrl sandbox gc`` run first) kills it, and everything it started, once its owner
  process is gone, SIGKILL included.
* ``{"image": "name:tag", "command": [argv...]}``: the image, already on the Docker daemon
  (nothing is pulled), as a ``DockerSandbox`` (``sandboxes``: labelled container, removed on
  close, reaped once its owner is gone) on Docker's ``bridge`` network: a network namespace
  of its own, so the code the policy drives in the server does not share this host's
  loopback or interfaces (it still reaches the internet, and this host's services that
  listen on the bridge address or on ``0.0.0.0``: ``sandboxes.base.SandboxSpec.network``).
  The command (default ``DEFAULT_IMAGE_COMMAND``, openenv's own Dockerfile command) is run
  in it with ``{port}`` replaced, as the sandbox's user (1000) on a read-only root with a
  writable ``/tmp``; it must listen on ``0.0.0.0`` (the container's interfaces), and the
  adapter talks to it at the container's address (``DockerSandbox.ip_address``), so the
  Docker daemon must run on this machine.

``concurrent_sessions`` (``"auto"``, true, false) says whether one started server serves the
episodes of this process at once (one shared server, stopped ``idle_s`` after its last episode
ended, and at exit) or serves one episode only (one server per episode, stopped when the
episode ends). ``"auto"`` asks the first server started: it opens two ``/ws`` sessions, and a
server that refuses the second (openenv's default ``max_concurrent_envs=1``) gets one server per
episode; the answer is kept for the process. A server named by address is always shared; a
session it refuses for capacity is tried again until ``session_wait_s``.

Nothing here installs anything or reaches beyond this machine (a named address aside).
"""

from __future__ import annotations

import atexit
import logging
import os
import signal
import socket
import subprocess
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field, replace
from typing import Any, Mapping

import sandboxes
from agentrl.errors import ConfigError
from agentrl.hubs.openenv_wire import OpenEnvError, accepts_concurrent_sessions, server_healthy
from sandboxes.base import SandboxSpec
from sandboxes.labels import Owner, SandboxLabel, validate_run_id

__all__ = ["ServerSpec", "ServerLease", "lease_server", "stop_servers", "DEFAULT_IMAGE_COMMAND", "SERVER_KEYS"]

log = logging.getLogger(__name__)

DEFAULT_IMAGE_COMMAND = ("sh", "-c", "cd /app/env && exec uvicorn server.app:app --host 0.0.0.0 --port {port}")
"""What an image runs without ``command``: the server of openenv's Dockerfile template, on
``{port}`` of the container's own interfaces."""
SERVER_KEYS = ("base_url", "command", "image", "cwd", "env", "concurrent_sessions", "startup_timeout_s", "idle_s",
               "run_id", "memory_mb", "cpus", "pids_limit", "docker_host")
_LOG_TAIL_BYTES = 4000


@dataclass(frozen=True)
class ServerSpec:
    """Where the adapter finds its OpenEnv server (see the module docstring).

    Attributes:
        base_url: a running server's address; None for a started one.
        command: the argv of a local process or of the image's server (``{port}`` replaced).
        image: a Docker image on the daemon; None for a local process or an address.
        cwd: the local process's working directory (None: this process's).
        env: variables added to the server's environment.
        concurrent_sessions: ``"auto"``, True or False (module docstring).
        startup_timeout_s: the longest wait for a started server's ``/health``.
        idle_s: how long a shared started server outlives its last episode.
        run_id: the sandbox run label's run id (``sandboxes.labels``).
        memory_mb, cpus, pids_limit: the Docker sandbox's limits.
        docker_host: the Docker daemon (None: ``DOCKER_HOST``, else the default socket).
    """

    base_url: str | None = None
    command: tuple[str, ...] = ()
    image: str | None = None
    cwd: str | None = None
    env: tuple[tuple[str, str], ...] = ()
    concurrent_sessions: Any = "auto"
    startup_timeout_s: float = 120.0
    idle_s: float = 60.0
    run_id: str = "openenv"
    memory_mb: int = 2048
    cpus: float = 1.0
    pids_limit: int = 512
    docker_host: str | None = None

    @property
    def kind(self) -> str:
        """``"url"``, ``"process"`` or ``"docker"``."""
        return "url" if self.base_url else "docker" if self.image else "process"

    @classmethod
    def parse(cls, server: Any) -> "ServerSpec":
        """Read the env's ``server`` argument.

        Raises:
            ConfigError: ``server`` is not an ``http(s)://`` address or a dict with exactly one
                of ``base_url``, ``command`` (a list of str) or ``image``; an unknown key; a
                value of the wrong type.
        """
        if isinstance(server, ServerSpec):
            return server
        if isinstance(server, str):
            server = {"base_url": server}
        if not isinstance(server, Mapping):
            raise ConfigError(f"server={server!r} must be an http(s):// address or a dict with 'base_url', "
                              "'command' or 'image'")
        unknown = sorted(set(server) - set(SERVER_KEYS))
        if unknown:
            raise ConfigError(f"server has unknown keys {unknown}; expected some of {list(SERVER_KEYS)}")
        kinds = [k for k in ("base_url", "image") if server.get(k)]
        if not kinds and not server.get("command"):
            raise ConfigError(f"server={dict(server)!r} names no server: give 'base_url', 'command' or 'image'")
        if len(kinds) > 1 or (server.get("base_url") and server.get("command")):
            raise ConfigError(f"server={dict(server)!r} names more than one server; give one of 'base_url', "
                              "'command' (a local process) or 'image' (with an optional 'command')")
        base_url = server.get("base_url")
        if base_url is not None and not (isinstance(base_url, str) and base_url.startswith(("http://", "https://"))):
            raise ConfigError(f"server.base_url={base_url!r} must start with http:// or https://")
        command = server.get("command") or (DEFAULT_IMAGE_COMMAND if server.get("image") else ())
        if isinstance(command, str) or not all(isinstance(a, str) for a in command):
            raise ConfigError(f"server.command={command!r} must be a list of str (an argv)")
        env = server.get("env") or {}
        if not isinstance(env, Mapping) or not all(isinstance(k, str) and isinstance(v, str) for k, v in env.items()):
            raise ConfigError(f"server.env={env!r} must be a dict of str to str")
        conc = server.get("concurrent_sessions", "auto")
        if conc not in ("auto", True, False):
            raise ConfigError(f"server.concurrent_sessions={conc!r}; expected 'auto', true or false")
        spec = cls(base_url=base_url.rstrip("/") if base_url else None, command=tuple(command),
                   image=server.get("image"), cwd=server.get("cwd"), env=tuple(sorted(env.items())),
                   concurrent_sessions=True if base_url else conc)
        for key in ("startup_timeout_s", "idle_s", "memory_mb", "cpus", "pids_limit"):
            if key in server:
                value = server[key]
                if isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0:
                    raise ConfigError(f"server.{key}={value!r} must be a number >= 0")
                spec = replace(spec, **{key: value})
        for key in ("run_id", "docker_host", "image", "cwd"):
            if server.get(key) is not None and not isinstance(server[key], str):
                raise ConfigError(f"server.{key}={server[key]!r} must be a str")
        if "run_id" in server:
            spec = replace(spec, run_id=validate_run_id(server["run_id"]))
        if server.get("docker_host"):
            spec = replace(spec, docker_host=server["docker_host"])
        return spec


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _argv(command: tuple[str, ...], port: int, local: bool = True) -> list[str]:
    """The argv with ``{port}`` filled in (and, for a local process, a leading ``~/`` expanded)."""
    argv = [a.replace("{port}", str(port)) for a in command]
    return [os.path.expanduser(a) if local and a.startswith("~/") else a for a in argv]


class _Started:
    """A server this process started (a local process or a Docker sandbox); ``stop()`` ends it."""

    def __init__(self, spec: ServerSpec) -> None:
        self.spec = spec
        self.port = _free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.label = SandboxLabel(spec.run_id, Owner.current(), uuid.uuid4().hex[:12])
        self._stopped = False
        self._proc: subprocess.Popen | None = None
        self._log = tempfile.TemporaryFile()
        self._sandbox: Any = None
        self._exec_error: list[str] = []
        try:
            if spec.kind == "docker":
                self._start_docker()
            else:
                self._start_process()
            self._wait_ready()
        except BaseException:
            self.stop()
            raise
        _LIVE.add(self)

    def _start_process(self) -> None:
        env = {**os.environ, **dict(self.spec.env), "PYTHONUNBUFFERED": "1", **self.label.environ()}
        argv = _argv(self.spec.command, self.port)
        try:
            self._proc = subprocess.Popen(argv, cwd=self.spec.cwd, env=env, stdin=subprocess.DEVNULL,
                                          stdout=self._log, stderr=subprocess.STDOUT, start_new_session=True)
        except OSError as exc:
            raise OpenEnvError(f"could not start the OpenEnv server {argv}: {exc}") from exc

    def _start_docker(self) -> None:
        spec = SandboxSpec(image=self.spec.image or "", network="bridge", memory_mb=int(self.spec.memory_mb),
                           cpus=float(self.spec.cpus), pids_limit=int(self.spec.pids_limit), run_id=self.spec.run_id,
                           env=dict(self.spec.env), default_timeout_s=30.0)
        self._sandbox = sandboxes.make_sandbox("docker", spec, docker_host=self.spec.docker_host)
        self.base_url = f"http://{self._sandbox.ip_address()}:{self.port}"
        argv = _argv(self.spec.command, self.port, local=False)

        def serve() -> None:  # runs until the sandbox closes (or a day passes)
            try:
                res = self._sandbox.exec(argv, timeout_s=86_400.0)
                self._exec_error.append(f"exited {res.exit_code}: {(res.stdout + res.stderr)[-_LOG_TAIL_BYTES:]}")
            except Exception as exc:  # noqa: BLE001 - the sandbox closed under it, or died
                self._exec_error.append(f"{type(exc).__name__}: {exc}")

        threading.Thread(target=serve, name=f"openenv-server-{self.port}", daemon=True).start()

    def exit_reason(self) -> str | None:
        """Why the server is gone (its exit and the tail of its output), or None while it runs."""
        if self._proc is not None and self._proc.poll() is not None:
            return f"exited with code {self._proc.returncode}; its output ends: {self._output_tail()!r}"
        if self._sandbox is not None and self._exec_error:
            return self._exec_error[0]
        return None

    def _output_tail(self) -> str:
        try:
            self._log.seek(0, os.SEEK_END)
            size = self._log.tell()
            self._log.seek(max(0, size - _LOG_TAIL_BYTES))
            return self._log.read().decode("utf-8", "replace")
        except (OSError, ValueError):
            return ""

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + self.spec.startup_timeout_s
        what = self.spec.image or " ".join(self.spec.command)
        while not server_healthy(self.base_url, timeout_s=1.0):
            reason = self.exit_reason()
            if reason is not None:
                raise OpenEnvError(f"the OpenEnv server {what!r} on port {self.port} {reason}", base_url=self.base_url)
            if time.monotonic() > deadline:
                raise OpenEnvError(f"the OpenEnv server {what!r} did not answer {self.base_url}/health within "
                                   f"{self.spec.startup_timeout_s} s; its output ends: {self._output_tail()!r}",
                                   base_url=self.base_url)
            time.sleep(0.1)

    def stop(self) -> None:
        """End the server (SIGTERM to its process group, SIGKILL after 5 s; or close the
        sandbox). Idempotent; never raises."""
        if self._stopped:
            return
        self._stopped = True
        _LIVE.discard(self)
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            for sig, wait_s in ((signal.SIGTERM, 5.0), (signal.SIGKILL, 5.0)):
                try:
                    os.killpg(proc.pid, sig)
                except (ProcessLookupError, PermissionError):
                    break
                try:
                    proc.wait(timeout=wait_s)
                    break
                except subprocess.TimeoutExpired:
                    continue
        if proc is not None:
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # what it started and left behind
            except (ProcessLookupError, PermissionError):
                pass
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            try:
                sandbox.close()
            except Exception:  # noqa: BLE001
                log.exception("closing the OpenEnv server's sandbox failed")
        try:
            self._log.close()
        except OSError:
            pass

    @property
    def pid(self) -> int | None:
        """The local process's pid (None for a Docker server or once stopped)."""
        return self._proc.pid if self._proc is not None else None


_LIVE: set[_Started] = set()
"""The servers this process started and has not stopped (``stop_servers`` ends them at exit)."""


@dataclass
class _Shared:
    """The process's shared server of one spec, and the episodes holding it."""

    server: _Started | None = None
    leases: int = 0
    timer: threading.Timer | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)


class _Pool:
    """Process-wide: the concurrency verdict and the shared server of each spec."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.verdicts: dict[ServerSpec, bool] = {}
        self.shared: dict[ServerSpec, _Shared] = {}

    def shared_of(self, spec: ServerSpec) -> _Shared:
        with self.lock:
            return self.shared.setdefault(spec, _Shared())


_POOL = _Pool()


@dataclass
class ServerLease:
    """One episode's hold on a server: ``base_url`` to talk to, ``release()`` when the episode
    ends (stops a server of its own; lets a shared one go idle). ``pid`` is the local server
    process's pid, when there is one."""

    base_url: str
    shared: bool
    _release: Any = None
    pid: int | None = None
    _released: bool = False

    def release(self) -> None:
        """Idempotent; never raises."""
        if self._released:
            return
        self._released = True
        if self._release is not None:
            try:
                self._release()
            except Exception:  # noqa: BLE001
                log.exception("releasing the OpenEnv server %s failed", self.base_url)


def lease_server(spec: ServerSpec) -> ServerLease:
    """A server for one episode (module docstring): the address, the shared server of
    ``spec`` (started if none runs), or a server of its own.

    Raises:
        OpenEnvError: a server could not be started or asked (an ``InfraError``).
        SandboxError: the Docker sandbox could not be made (an ``InfraError``).
    """
    if spec.kind == "url":
        return ServerLease(spec.base_url or "", shared=True)
    verdict = spec.concurrent_sessions if spec.concurrent_sessions != "auto" else _POOL.verdicts.get(spec)
    if verdict is False:
        return _own(spec)
    if verdict is True:
        return _lease_shared(spec)
    server = _Started(spec)  # "auto", first time: ask it
    try:
        concurrent = accepts_concurrent_sessions(server.base_url, timeout_s=spec.startup_timeout_s)
    except BaseException:
        server.stop()
        raise
    with _POOL.lock:
        _POOL.verdicts.setdefault(spec, concurrent)
    log.info("OpenEnv server %s %s concurrent sessions: %s", spec.image or " ".join(spec.command),
             "serves" if concurrent else "refuses", "one shared server" if concurrent else "one server per episode")
    if not concurrent:
        return ServerLease(server.base_url, shared=False, _release=server.stop, pid=server.pid)
    shared = _POOL.shared_of(spec)
    with shared.lock:
        if shared.server is None:
            shared.server = server
            server = None  # type: ignore[assignment]
    if server is not None:  # another thread's shared server won
        server.stop()
    return _lease_shared(spec)


def _own(spec: ServerSpec) -> ServerLease:
    server = _Started(spec)
    return ServerLease(server.base_url, shared=False, _release=server.stop, pid=server.pid)


def _lease_shared(spec: ServerSpec) -> ServerLease:
    shared = _POOL.shared_of(spec)
    with shared.lock:
        if shared.timer is not None:
            shared.timer.cancel()
            shared.timer = None
        if shared.server is not None and shared.server.exit_reason() is not None:
            log.warning("the shared OpenEnv server %s is gone (%s); starting another", shared.server.base_url,
                        shared.server.exit_reason())
            shared.server.stop()
            shared.server = None
        if shared.server is None:
            shared.server = _Started(spec)
        shared.leases += 1
        server = shared.server
    return ServerLease(server.base_url, shared=True, _release=lambda: _release_shared(spec, server), pid=server.pid)


def _release_shared(spec: ServerSpec, server: _Started) -> None:
    shared = _POOL.shared_of(spec)
    with shared.lock:
        shared.leases = max(0, shared.leases - 1)
        if shared.leases or shared.server is not server:
            return
        if spec.idle_s <= 0:
            shared.server = None
            server.stop()
            return
        timer = threading.Timer(spec.idle_s, _stop_idle, args=(spec, server))
        timer.daemon = True
        shared.timer = timer
        timer.start()


def _stop_idle(spec: ServerSpec, server: _Started) -> None:
    shared = _POOL.shared_of(spec)
    with shared.lock:
        if shared.leases or shared.server is not server:
            return
        shared.server, shared.timer = None, None
    server.stop()


def stop_servers() -> int:
    """Stop every server this process started (also run at exit). Returns how many ran."""
    live = list(_LIVE)
    with _POOL.lock:
        for shared in _POOL.shared.values():
            if shared.timer is not None:
                shared.timer.cancel()
            shared.server, shared.timer, shared.leases = None, None, 0
    for server in live:
        server.stop()
    return len(live)


atexit.register(stop_servers)
