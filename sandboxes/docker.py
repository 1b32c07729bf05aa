"""The Docker sandbox backend: one long-lived container per sandbox, one ``exec`` per command.

Container (checked by the contract and abuse suites in tests/integration/sandboxes/):

* ``network_mode="none"`` unless ``spec.network == "host"``; ``mem_limit`` (swap equal to
  it, so no swap), ``pids_limit``, ``nano_cpus`` from the spec; ``init=True`` (Docker's
  ``tini`` as pid 1 reaps orphans, so zombies do not eat the pids limit); ``cap_drop=ALL``
  and ``no-new-privileges``; user ``1000:1000`` (``sandbox`` in the base image, see
  ``sandboxes.images``); a read-only root file system with tmpfs ``/tmp`` and
  ``spec.workdir`` (owned by the sandbox user, sized to ``memory_mb``), so the only
  writable places are the working directory and ``/tmp``.
* Labels: ``agentrl.run_id``, ``agentrl.sandbox_id``, ``agentrl.owner_pid``,
  ``agentrl.owner_start``, ``agentrl.owner_boot`` (``LABEL_*``): the reaper
  (``reap_containers``, called by ``sandboxes.reaper.reap_orphans``) removes containers whose
  owner process is gone (design.md invariant 8, case C10).

Exec: ``exec_create`` + ``exec_start(socket=True)``; stdin is written to the socket, the
multiplexed stdout/stderr frames are read as they come into ``BoundedOutput`` (capped,
incremental UTF-8, case C09). The command runs under a small shell wrapper (bash when the
image has it, so that its clean-up scan never forks and still works after a fork bomb has
used up the pids limit):
``timeout -s KILL <timeout_s> <command>`` (the inside limit), and after it returns the
wrapper SIGKILLs every process that still carries this exec's marker variable
(``AGENTRL_EXEC_ID``), so ``setsid`` / ``nohup`` escapees do not outlive their exec. From
outside, if the stream has not ended ``_OUTSIDE_GRACE_S`` after the deadline, a root exec
kills the marked processes; if even that fails the container is killed and the exec raises
``SandboxError``.

Faults are not the model's: a container that fails to start, is gone, or stops, and a
daemon that does not answer, raise ``SandboxError``.
"""

from __future__ import annotations

import logging
import math
import os
import posixpath
import select
import signal
import socket
import struct
import threading
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence

import docker
import docker.errors
import requests.exceptions

from agentrl.errors import ConfigError, SandboxError
from agentrl.types import ExecResult
from sandboxes.base import ExecListener, ExecListeners, SandboxSpec
from sandboxes.hostfs import workdir_components
from sandboxes.labels import Owner, SandboxLabel
from sandboxes.output import BoundedOutput
from sandboxes.validation import normalize_command, validate_env, validate_spec, validate_timeout

logger = logging.getLogger(__name__)

LABEL_RUN_ID = "agentrl.run_id"
LABEL_SANDBOX_ID = "agentrl.sandbox_id"
LABEL_OWNER_PID = "agentrl.owner_pid"
LABEL_OWNER_START = "agentrl.owner_start"
LABEL_OWNER_BOOT = "agentrl.owner_boot"
"""``/proc/sys/kernel/random/boot_id`` of the owner's machine: the owner's liveness is only
judged on that machine (and boot)."""
EXEC_ID_ENV = "AGENTRL_EXEC_ID"
SANDBOX_USER = "1000:1000"
SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
HOSTNAME = "agentrl-sandbox"
TIMEOUT_EXIT_CODE = 137
"""``exit_code`` of a command killed at its timeout (128 + SIGKILL)."""

_OUTSIDE_GRACE_S = 2.0
_DAEMON_TIMEOUT_S = 30
_MAX_POOL = 128
"""HTTP connections kept to the daemon (concurrent execs each hold one while they start)."""
_READ_CHUNK = 1 << 16
_FILE_LIMIT_BYTES = 1 << 30

# $1 = exec id, $2 = timeout (s), rest = the command. The command's stderr is its own; the
# wrapper's messages go nowhere. After the command (or its timeout), every process still
# carrying this exec's marker dies: setsid/nohup escapees do not outlive their exec. The scan
# repeats until a pass finds none (a process forked during a pass is seen by the next one).
# A process that scrubs the marker from its own environment is not found; it lives until the
# sandbox is closed (or its pool reset), which is where the bubblewrap backend, with a pid
# namespace per exec, is stricter.
#
# The scan must not fork: after a fork bomb has used up the container's pids limit, every
# `grep` the scan started failed, the pass "found" nothing and the bomb outlived its exec.
# With bash the scan reads each /proc/<pid>/environ with builtins only (read -d ''). Images
# without bash fall back to the POSIX version, which needs one grep per process.
_SCAN_BASH = (
    'scan() { f=; for p in /proc/[0-9]*; do [ "${p#/proc/}" = "$$" ] && continue; '
    'while IFS= read -r -d "" kv; do [ "$kv" = "AGENTRL_EXEC_ID=$1" ] && '
    '{ kill -9 "${p#/proc/}" && f=1; break; }; done < "$p/environ"; done; }; '
)
_SCAN_SH = (
    'scan() { f=; for p in /proc/[0-9]*; do [ "${p#/proc/}" = "$$" ] && continue; '
    'grep -qsxz "AGENTRL_EXEC_ID=$1" "$p/environ" && kill -9 "${p#/proc/}" && f=1; done; }; '
)
_RUN_AND_SCAN = (
    'id=$1; t=$2; shift 2; exec 3>&2 2>/dev/null; '
    '(exec 2>&3 3>&- timeout -s KILL "$t" /bin/sh -c \'exec "$@"\' sh "$@"); rc=$?; '
    'n=0; while [ $n -lt 100 ]; do n=$((n+1)); scan "$id"; [ -z "$f" ] && break; done; '
    'exit $rc'
)
# Run as root from outside: kill every process of one exec (wrapper included).
_KILL_ONLY = 'exec 2>/dev/null; scan "$1"; exit 0'
# Starts bash with the fork-free scan when the image has it, else sh with the grep scan.
_LAUNCH = 'b=$1; s=$2; shift 2; [ -x /bin/bash ] && exec /bin/bash -c "$b" sh "$@"; exec /bin/sh -c "$s" sh "$@"'


def _launch(body: str, *args: str) -> list[str]:
    """argv running ``body`` (after ``scan``'s definition) with ``args`` as ``$1...``."""
    return ["/bin/sh", "-c", _LAUNCH, "sh", _SCAN_BASH + body, _SCAN_SH + body, *args]


def _boot_id() -> str:
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip()
    except OSError:
        return "unknown"


_INFRA_ERRORS = (docker.errors.DockerException, requests.exceptions.RequestException, OSError)


def docker_client(timeout_s: float = _DAEMON_TIMEOUT_S) -> docker.DockerClient:
    """A client of the daemon named by the environment (``DOCKER_HOST``, default socket)
    that answered a ping.

    Raises:
        SandboxError: the daemon does not answer.
    """
    try:
        client = docker.from_env(timeout=int(max(1, timeout_s)), max_pool_size=_MAX_POOL)
        client.ping()
    except _INFRA_ERRORS as exc:
        raise SandboxError(f"the Docker daemon does not answer: {exc}") from exc
    return client


def _daemon_is_remote() -> bool:
    host = os.environ.get("DOCKER_HOST", "")
    return bool(host) and not host.startswith("unix://")


def docker_available(timeout_s: float = 2.0) -> bool:
    """True when a Docker daemon answers a ping within ``timeout_s``."""
    host = os.environ.get("DOCKER_HOST", "")
    if not host and not os.path.exists("/var/run/docker.sock"):
        return False
    try:
        client = docker_client(timeout_s)
    except SandboxError:
        return False
    client.close()
    return True


def _pid_alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rfind(b")") + 2:][:1] not in (b"Z", b"X")


def image_exists(image: str, client: docker.DockerClient | None = None) -> bool:
    """True when ``image`` is on the daemon.

    Raises:
        SandboxError: the daemon does not answer.
    """
    client = client if client is not None else docker_client()
    try:
        client.api.inspect_image(image)
    except docker.errors.ImageNotFound:
        return False
    except _INFRA_ERRORS as exc:
        raise SandboxError(f"the Docker daemon does not answer: {exc}") from exc
    return True


def _remove_container(client: docker.DockerClient, container_id: str) -> None:
    """Finalizer: force-remove the container (also at interpreter exit). Never from a
    forked child."""
    try:
        client.api.remove_container(container_id, force=True)
    except docker.errors.NotFound:
        pass
    except _INFRA_ERRORS as exc:
        logger.warning("could not remove sandbox container %s: %s", container_id[:12], exc)


def _finalize(owner_pid: int, client: docker.DockerClient, container_id: str) -> None:
    if os.getpid() == owner_pid:
        _remove_container(client, container_id)


_SIGTERM_LOCK = threading.Lock()
_SIGTERM_INSTALLED = False


def _exit_on_sigterm() -> None:
    """Turn SIGTERM into ``SystemExit(143)`` so finalizers remove containers (only when
    SIGTERM still has its default action and we are on the main thread)."""
    global _SIGTERM_INSTALLED
    with _SIGTERM_LOCK:
        if _SIGTERM_INSTALLED or threading.current_thread() is not threading.main_thread():
            return
        _SIGTERM_INSTALLED = True
        if signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
            return

        def handler(signum, frame):  # noqa: ARG001
            raise SystemExit(128 + signum)

        signal.signal(signal.SIGTERM, handler)


class DockerSandbox:
    """A ``Sandbox`` (``sandboxes.base``) backed by one Docker container; see the module
    docstring for what is isolated and how.

    Args:
        spec: limits and layout; ``spec.image`` must exist locally (``agentrl sandbox
            build-image``).
        client: a ``docker.DockerClient`` to use (default: ``docker_client()``).

    Attributes:
        spec: as given.
        label: run label (also on the container as ``agentrl.*`` labels).
        container_id: the container.
        startup_s: seconds from create to a started, answering container.

    Raises:
        ConfigError: an invalid ``spec`` field.
        SandboxError: the daemon does not answer, the image is missing, or the container
            does not start.

    Thread safety: ``exec`` / ``read_file`` / ``write_file`` may run concurrently; each
    exec has its own connection.
    """

    def __init__(self, spec: SandboxSpec, *, client: docker.DockerClient | None = None) -> None:
        self.spec = validate_spec(spec)
        self._client = client if client is not None else docker_client()
        _reap_containers_once(self._client)
        _exit_on_sigterm()
        self.label = SandboxLabel(spec.run_id, Owner.current(), uuid.uuid4().hex[:12])
        self._lock = threading.Lock()
        self._listeners = ExecListeners()
        self._closed = False
        self._running: dict[str, socket.socket] = {}
        self._cancelled: set[str] = set()
        self._base_env = {"PATH": SANDBOX_PATH, "HOME": spec.workdir, "LANG": "C.UTF-8", "TMPDIR": "/tmp"}
        t0 = time.monotonic()
        labels = {
            LABEL_RUN_ID: spec.run_id,
            LABEL_SANDBOX_ID: self.label.sandbox_id,
            LABEL_OWNER_PID: str(self.label.owner.pid),
            LABEL_OWNER_START: str(self.label.owner.start_ticks),
            LABEL_OWNER_BOOT: _boot_id(),
        }
        tmpfs_mb = max(16, spec.memory_mb)
        try:
            created = self._client.api.create_container(
                spec.image,
                command=["sleep", "infinity"],
                user=SANDBOX_USER,
                working_dir=spec.workdir,
                hostname=HOSTNAME,
                environment={**self._base_env, **spec.env},
                labels=labels,
                host_config=self._client.api.create_host_config(
                    init=True,
                    network_mode="none" if spec.network == "none" else "host",
                    mem_limit=f"{spec.memory_mb}m",
                    memswap_limit=f"{spec.memory_mb}m",
                    pids_limit=spec.pids_limit,
                    nano_cpus=int(spec.cpus * 1e9),
                    read_only=True,
                    cap_drop=["ALL"],
                    security_opt=["no-new-privileges"],
                    tmpfs={
                        "/tmp": f"rw,nosuid,nodev,size={tmpfs_mb}m,mode=1777",
                        spec.workdir: f"rw,nosuid,nodev,exec,size={tmpfs_mb}m,uid=1000,gid=1000,mode=0755",
                    },
                ),
            )
        except docker.errors.ImageNotFound as exc:
            raise SandboxError(
                f"image={spec.image!r} is not on this Docker daemon; build it with "
                "`agentrl sandbox build-image` (there is no registry to pull from)"
            ) from exc
        except _INFRA_ERRORS as exc:
            raise SandboxError(f"could not create a container of {spec.image!r}: {exc}") from exc
        self.container_id: str = created["Id"]
        self._finalizer = weakref.finalize(self, _finalize, os.getpid(), self._client, self.container_id)
        try:
            self._client.api.start(self.container_id)
        except _INFRA_ERRORS as exc:
            self._finalizer()
            self._closed = True
            raise SandboxError(f"container of {spec.image!r} did not start: {exc}") from exc
        self.startup_s = time.monotonic() - t0
        logger.debug("created %r in %.0f ms", self, self.startup_s * 1e3)

    # ------------------------------------------------------------------ exec

    def exec(
        self,
        command: str | Sequence[str],
        *,
        timeout_s: float | None = None,
        stdin: bytes | str | None = None,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
    ) -> ExecResult:
        """Run ``command`` in the container.

        Args:
            command: a shell string (run by ``/bin/sh -c``) or an argv sequence.
            timeout_s: wall-clock limit in seconds (default ``spec.default_timeout_s``); at
                the limit every process of the exec is killed, ``timed_out`` is set and
                ``exit_code`` is 137.
            stdin: bytes (or str, encoded as UTF-8) fed to the command, then EOF.
            env: variables added over ``spec.env`` and the defaults.
            cwd: directory inside the sandbox (relative: under ``spec.workdir``).

        Returns:
            ``ExecResult``; output decoded (U+FFFD for invalid UTF-8) and capped at
            ``spec.output_limit_bytes`` per stream.

        Raises:
            ConfigError: invalid ``command``, ``timeout_s``, ``env``, ``stdin`` or ``cwd``.
            SandboxError: the sandbox is closed (or closed during the exec), the container
                is gone or stopped, the daemon does not answer, or the exec could not be
                ended from outside.
        """
        record, argv = normalize_command(command)
        timeout = validate_timeout(
            self.spec.default_timeout_s if timeout_s is None else timeout_s, "timeout_s"
        )
        stdin_bytes = _stdin_bytes(stdin)
        extra = validate_env(env, "env") if env is not None else {}
        workdir_cwd = self._resolve_cwd(cwd)
        return self._run(
            record, argv, timeout, stdin_bytes, extra, workdir_cwd,
            self.spec.output_limit_bytes, notify=True,
        )

    def _run(
        self,
        record: str | tuple[str, ...],
        argv: list[str],
        timeout: float,
        stdin_bytes: bytes | None,
        extra_env: dict[str, str],
        cwd: str,
        limit_bytes: int,
        *,
        notify: bool,
    ) -> ExecResult:
        self._check_open(record)
        exec_id = uuid.uuid4().hex
        environment = {**self._base_env, **self.spec.env, **extra_env}
        environment.update(self.label.environ())
        environment[EXEC_ID_ENV] = exec_id
        # `timeout` takes seconds with a fraction; round up to 10 ms.
        t_arg = f"{max(1, math.ceil(timeout * 100)) / 100:.2f}"
        full = _launch(_RUN_AND_SCAN, exec_id, t_arg, *argv)
        start = time.monotonic()
        api = self._client.api
        try:
            exec_ref = api.exec_create(
                self.container_id, full, stdin=stdin_bytes is not None, stdout=True,
                stderr=True, environment=environment, workdir=cwd, user=SANDBOX_USER,
            )
            sock = api.exec_start(exec_ref["Id"], socket=True)
        except docker.errors.NotFound as exc:
            raise SandboxError(f"the sandbox container {self.container_id[:12]} is gone: {exc}", command=record) from exc
        except _INFRA_ERRORS as exc:
            raise self._infra_error(record, exc) from exc
        raw = getattr(sock, "_sock", sock)
        with self._lock:
            self._running[exec_id] = raw
            if self._closed:
                self._cancelled.add(exec_id)
        out, err = BoundedOutput(limit_bytes), BoundedOutput(limit_bytes)
        timed_out = False
        killed_from_outside = False
        try:
            if exec_id in self._cancelled:
                raise _Cancelled
            status = self._pump(raw, stdin_bytes, out, err, start + timeout + _OUTSIDE_GRACE_S)
            if status == "deadline":
                killed_from_outside = True
                self._kill_exec(exec_id)
                status = self._pump(raw, None, out, err, time.monotonic() + _OUTSIDE_GRACE_S)
                if status == "deadline":
                    self._kill_container()
                    raise SandboxError(
                        f"exec could not be ended {timeout:.1f} s + {2 * _OUTSIDE_GRACE_S:.0f} s "
                        "after its start; the container was killed", command=record,
                    )
        except _Cancelled:
            pass
        except OSError as exc:
            if exec_id not in self._cancelled:
                raise self._infra_error(record, exc) from exc
        finally:
            try:
                raw.close()
            except OSError:
                pass
            with self._lock:
                self._running.pop(exec_id, None)
                cancelled = exec_id in self._cancelled
                self._cancelled.discard(exec_id)
        duration = time.monotonic() - start
        stdout, out_dropped = out.finish()
        stderr, err_dropped = err.finish()
        if cancelled:
            raise SandboxError(
                "the sandbox was closed while the command was running", command=record,
                output=stdout + stderr,
            )
        try:
            info = api.exec_inspect(exec_ref["Id"])
        except _INFRA_ERRORS as exc:
            raise self._infra_error(record, exc) from exc
        exit_code = info.get("ExitCode")
        if info.get("Running") or exit_code is None:
            raise self._infra_error(record, RuntimeError(f"exec still running after its stream ended: {info}"))
        if exit_code == 126:
            # 126 is the runtime's "could not exec" (the container stopping or gone under a
            # starting exec: "cannot exec in a stopped state") as well as a command's "not
            # executable". The first is the sandbox's fault, never the command's.
            said = stdout + stderr
            if "OCI runtime exec failed" in said or "cannot exec in a stopped state" in said:
                raise SandboxError(f"the exec did not start: {said.strip()[-2000:]}", command=record)
            self._raise_unless_running(record, "exec ended with exit code 126")
        if exit_code >= 128 and not killed_from_outside:
            # Killed by a signal: the command's doing (or the OOM killer's), unless the
            # container itself stopped or went away under it.
            self._raise_unless_running(record, f"exec ended with exit code {exit_code}")
        # `timeout -s KILL` exits 137 when it killed the command; so does a command that was
        # SIGKILLed for another reason before its time was up (e.g. the OOM killer).
        if exit_code == TIMEOUT_EXIT_CODE and (killed_from_outside or duration >= timeout - 0.05):
            timed_out = True
        if killed_from_outside:
            timed_out, exit_code = True, TIMEOUT_EXIT_CODE
        result = ExecResult(
            command=record, exit_code=exit_code, stdout=stdout, stderr=stderr,
            duration_s=duration, timed_out=timed_out, truncated_bytes=out_dropped + err_dropped,
        )
        if notify:
            self._notify(result)
        return result

    @staticmethod
    def _pump(
        raw: socket.socket, stdin_bytes: bytes | None, out: BoundedOutput, err: BoundedOutput,
        deadline: float,
    ) -> str:
        """Feed stdin and read multiplexed frames until EOF (``"eof"``) or ``deadline``
        (``"deadline"``)."""
        raw.setblocking(False)
        pending = memoryview(stdin_bytes) if stdin_bytes else None
        if stdin_bytes is not None and not stdin_bytes:
            raw.shutdown(socket.SHUT_WR)
        buf = bytearray()
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return "deadline"
            wlist = [raw] if pending is not None else []
            readable, writable, _ = select.select([raw], wlist, [], remaining)
            if writable:
                try:
                    n = raw.send(pending[:_READ_CHUNK])
                except BlockingIOError:
                    n = 0
                except (BrokenPipeError, ConnectionResetError):
                    pending = None
                    n = 0
                if pending is not None:
                    pending = pending[n:]
                    if len(pending) == 0:
                        pending = None
                        raw.shutdown(socket.SHUT_WR)
            if readable:
                try:
                    data = raw.recv(_READ_CHUNK * 4)
                except BlockingIOError:
                    continue
                if not data:
                    return "eof"
                buf += data
                # Frames: 1 byte stream, 3 zero bytes, 4 bytes big-endian length, payload.
                pos = 0
                while len(buf) - pos >= 8:
                    kind, size = struct.unpack_from(">BxxxL", buf, pos)
                    if len(buf) - pos - 8 < size:
                        break
                    payload = bytes(buf[pos + 8:pos + 8 + size])
                    (err if kind == 2 else out).feed(payload)
                    pos += 8 + size
                if pos:
                    del buf[:pos]

    def _kill_exec(self, exec_id: str) -> None:
        try:
            self._client.api.exec_start(
                self._client.api.exec_create(
                    self.container_id, _launch(_KILL_ONLY, exec_id), user="0:0",
                )["Id"]
            )
        except _INFRA_ERRORS as exc:
            logger.warning("could not kill exec %s in %s from outside: %s", exec_id, self.container_id[:12], exc)

    def _kill_container(self) -> None:
        try:
            self._client.api.kill(self.container_id)
        except _INFRA_ERRORS as exc:
            logger.warning("could not kill container %s: %s", self.container_id[:12], exc)

    def _infra_error(self, record: object, exc: BaseException) -> SandboxError:
        """Say what failed: the daemon, or the container (gone, stopped)."""
        try:
            state = self._client.api.inspect_container(self.container_id)["State"]
        except docker.errors.NotFound:
            return SandboxError(f"the sandbox container {self.container_id[:12]} is gone ({exc})", command=record)
        except _INFRA_ERRORS as exc2:
            return SandboxError(f"the Docker daemon does not answer ({exc2}); exec failed: {exc}", command=record)
        if not state.get("Running"):
            return SandboxError(
                f"the sandbox container {self.container_id[:12]} is not running "
                f"(status {state.get('Status')!r}, exit code {state.get('ExitCode')}, "
                f"OOM killed {state.get('OOMKilled')}): {exc}",
                command=record,
            )
        return SandboxError(f"exec in sandbox container {self.container_id[:12]} failed: {exc}", command=record)

    def _raise_unless_running(self, record: object, what: str) -> None:
        try:
            state = self._client.api.inspect_container(self.container_id)["State"]
        except docker.errors.NotFound:
            raise SandboxError(f"the sandbox container {self.container_id[:12]} is gone ({what})", command=record) from None
        except _INFRA_ERRORS as exc:
            raise SandboxError(f"the Docker daemon does not answer ({exc}); {what}", command=record) from exc
        running = bool(state.get("Running")) and state.get("Status") not in ("removing", "exited", "dead")
        if running and not _daemon_is_remote() and state.get("Pid"):
            # The daemon may not have noticed yet that the container's init was killed
            # (docker kill / rm -f race): ask the kernel (same machine as a local daemon).
            running = _pid_alive(int(state["Pid"]))
        if not running:
            raise SandboxError(
                f"the sandbox container {self.container_id[:12]} is not running (status "
                f"{state.get('Status')!r}, OOM killed {state.get('OOMKilled')}); {what}",
                command=record,
            )

    def _resolve_cwd(self, cwd: str | None) -> str:
        if cwd is None:
            return self.spec.workdir
        if not isinstance(cwd, str) or not cwd or "\0" in cwd:
            raise ConfigError(f"cwd={cwd!r} must be a non-empty path without NUL bytes")
        return posixpath.normpath(posixpath.join(self.spec.workdir, cwd))

    def _check_open(self, command: object = None) -> None:
        if self._closed:
            raise SandboxError(f"{self!r} is closed", command=command)

    def _notify(self, result: ExecResult) -> None:
        self._listeners.notify(result)

    # ------------------------------------------------------------------ files

    def _file_path(self, path: str) -> str:
        components = workdir_components(path, self.spec.workdir)
        return posixpath.join(self.spec.workdir, *components)

    def write_file(self, path: str, content: bytes | str) -> None:
        """Create or replace a file under ``spec.workdir`` (parents created).

        Raises:
            SandboxError: the path leaves the working directory, a symlink is on the way,
                the write failed, or the sandbox is closed or failed.
            ConfigError: ``content`` is not bytes or str.
        """
        self._check_open()
        if isinstance(content, str):
            data = content.encode("utf-8")
        elif isinstance(content, (bytes, bytearray, memoryview)):
            data = bytes(content)
        else:
            raise ConfigError(f"content of type {type(content).__name__} must be bytes or str")
        target = self._file_path(path)
        script = (
            'set -e; w=$1; t=$2; d=$(dirname -- "$t"); '
            'case "$(realpath -m -- "$d")/" in "$w"/*) ;; *) echo "symlink on the way leaves the working directory" >&2; exit 3;; esac; '
            '[ -L "$t" ] && { echo "refusing to write through a symlink" >&2; exit 3; }; '
            'mkdir -p -- "$d"; cat > "$t"'
        )
        r = self._run(
            "write_file", ["/bin/sh", "-c", script, "sh", self.spec.workdir, target], 60.0, data,
            {}, self.spec.workdir, 4096, notify=False,
        )
        if r.exit_code != 0:
            raise SandboxError(f"write_file({path!r}) failed: {r.stderr.strip()}", command="write_file")

    def read_file(self, path: str) -> bytes:
        """Read a regular file under ``spec.workdir`` (at most 1 GiB).

        Raises:
            SandboxError: missing file (``No such file`` in the message), the path leaves
                the working directory, a symlink on the way, the sandbox is closed or failed.
        """
        self._check_open()
        target = self._file_path(path)
        script = (
            'w=$1; t=$2; '
            'case "$(realpath -m -- "$t")" in "$w"/*) ;; *) echo "symlink on the way leaves the working directory" >&2; exit 3;; esac; '
            '[ -L "$t" ] && { echo "refusing to read through a symlink" >&2; exit 3; }; '
            '[ -e "$t" ] || { echo "No such file or directory" >&2; exit 2; }; '
            'exec base64 -w0 -- "$t"'
        )
        r = self._run(
            "read_file", ["/bin/sh", "-c", script, "sh", self.spec.workdir, target], 60.0, None,
            {}, self.spec.workdir, _FILE_LIMIT_BYTES * 2, notify=False,
        )
        if r.exit_code != 0:
            raise SandboxError(f"read_file({path!r}) failed: {r.stderr.strip()}", command="read_file")
        import base64

        return base64.b64decode(r.stdout)

    # ------------------------------------------------------------------ listeners

    def add_listener(self, listener: ExecListener) -> None:
        """Call ``listener(result)`` after every exec; a listener that raises is logged
        and skipped, the exec still returns. Raises ConfigError: not callable."""
        self._listeners.add(listener)

    def remove_listener(self, listener: ExecListener) -> None:
        """Stop calling ``listener``; no-op if it was not added."""
        self._listeners.remove(listener)

    # ------------------------------------------------------------------ lifetime

    @property
    def closed(self) -> bool:
        return self._closed

    def is_healthy(self) -> bool:
        """True while the container runs (one daemon round trip)."""
        if self._closed:
            return False
        try:
            return bool(self._client.api.inspect_container(self.container_id)["State"].get("Running"))
        except _INFRA_ERRORS:
            return False

    def close(self) -> None:
        """Kill execs in flight (they raise ``SandboxError``) and remove the container.
        Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            running = dict(self._running)
            self._cancelled.update(running)
        for raw in running.values():
            try:
                raw.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._finalizer()

    def __enter__(self) -> DockerSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        cid = getattr(self, "container_id", "")[:12]
        return (
            f"DockerSandbox(run_id={self.spec.run_id!r}, id={self.label.sandbox_id!r}, "
            f"container={cid!r}, image={self.spec.image!r}, {state})"
        )


class _Cancelled(Exception):
    pass


def _stdin_bytes(stdin: bytes | str | None) -> bytes | None:
    if stdin is None or isinstance(stdin, bytes):
        return stdin
    if isinstance(stdin, str):
        return stdin.encode("utf-8")
    if isinstance(stdin, (bytearray, memoryview)):
        return bytes(stdin)
    raise ConfigError(f"stdin of type {type(stdin).__name__} must be bytes, str or None")


# ---------------------------------------------------------------------- reaping

_REAP_LOCK = threading.Lock()
_REAPED_AT_START = False


def _reap_containers_once(client: docker.DockerClient) -> None:
    global _REAPED_AT_START
    with _REAP_LOCK:
        if _REAPED_AT_START:
            return
        _REAPED_AT_START = True
    try:
        reap_containers(client=client)
    except Exception:  # a reaper failure must not stop new sandboxes
        logger.exception("reaping orphaned sandbox containers failed")


def reap_containers(
    run_id: str | None = None,
    *,
    include_live_owners: bool = False,
    client: docker.DockerClient | None = None,
) -> int:
    """Force-remove sandbox containers (label ``agentrl.run_id``) whose owner is gone.

    The owner is gone when its boot id is this machine's and its pid / start time no
    longer runs; containers of owners on other machines are only removed with
    ``include_live_owners`` (and a ``run_id``).

    Returns:
        Number of containers removed.

    Raises:
        SandboxError: the daemon does not answer.
    """
    client = client if client is not None else docker_client()
    label_filter = f"{LABEL_RUN_ID}={run_id}" if run_id is not None else LABEL_RUN_ID
    try:
        containers = client.api.containers(all=True, filters={"label": label_filter})
    except _INFRA_ERRORS as exc:
        raise SandboxError(f"the Docker daemon does not answer: {exc}") from exc
    boot = _boot_id()
    removed = 0
    for c in containers:
        labels = c.get("Labels") or {}
        if not include_live_owners:
            if labels.get(LABEL_OWNER_BOOT) != boot:
                # Another boot of this machine (owner surely gone) when the daemon is
                # local; another machine's (unknown) when it is remote.
                if _daemon_is_remote():
                    continue
            else:
                try:
                    owner = Owner(int(labels.get(LABEL_OWNER_PID, "0")), int(labels.get(LABEL_OWNER_START, "-1")))
                except ValueError:
                    owner = Owner(0, -1)
                if owner.is_alive():
                    continue
        _remove_container(client, c["Id"])
        removed += 1
    if removed:
        logger.info("removed %d orphaned sandbox containers%s", removed, f" of run {run_id!r}" if run_id else "")
    return removed
