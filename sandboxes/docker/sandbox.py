"""The Docker sandbox backend: one long-lived container per sandbox, one ``exec`` per command.

Container (checked by the contract and abuse suites in tests/integration/sandboxes/):

* ``network_mode`` is ``spec.network`` (``"none"`` unless the spec says ``"host"`` or
  ``"bridge"``: it reaches this host's services on the bridge address and ``0.0.0.0``, so
  the first bridge sandbox of a process logs ``BRIDGE_WARNING``; ``ip_address()`` reaches a
  server in it); ``mem_limit`` (swap equal to it, so no swap), ``pids_limit``, ``nano_cpus``
  from the spec; ``init=True`` (Docker's ``tini`` as pid 1 reaps orphans, so zombies do not
  eat the pids limit); ``cap_drop=ALL`` and ``no-new-privileges``; user ``1000:1000``
  (``sandbox`` in the base image, see ``sandboxes.docker.images``); a read-only root file
  system with tmpfs ``/tmp`` and ``spec.workdir`` (owned by the sandbox user, sized to
  ``memory_mb``), so the only writable places are the working directory and ``/tmp``.
  ``spec.tmpfs_dirs`` are further tmpfs directories of the sandbox user; with
  ``spec.writable_root`` the root file system is the container's own writable layer and the
  working directory is the image's.
* Labels: ``agentrl.run_id``, ``agentrl.sandbox_id``, ``agentrl.owner_pid``,
  ``agentrl.owner_start``, ``agentrl.owner_pidns``, ``agentrl.owner_boot``
  (``sandboxes.docker.reaper.container_labels``): the reaper (``sandboxes.docker.reaper``,
  called by ``sandboxes.reaper.reap_orphans``) removes containers whose owner process is
  gone, judged from the owner's pid namespace only (docs/design.md invariant 8; docs/cases.md, C10). The first
  sandbox of a process reaps once; a finalizer removes the container when the sandbox is
  closed, collected, or at interpreter exit. Constructing a sandbox installs no signal
  handler: a program that wants SIGTERM to remove its containers turns SIGTERM into an
  exception itself (the CLI and the controller do), else the reaper removes them later.

Exec: ``exec_create`` + ``exec_start(socket=True)``; stdin is written to the socket, the
multiplexed stdout/stderr frames are read as they come into ``BoundedOutput`` (capped,
incremental UTF-8; docs/cases.md, C09). The command runs under a small shell wrapper (bash when the
image has it; neither version of its clean-up scan forks, so it still works after a fork
bomb has used up the pids limit):
``timeout -s KILL <timeout_s> <command>`` (the inside limit), and after it returns the
wrapper SIGKILLs every process that still carries this exec's marker variable
(``AGENTRL_EXEC_ID``), so ``setsid`` / ``nohup`` escapees do not outlive their exec. From
outside, if the stream has not ended ``_OUTSIDE_GRACE_S`` after the deadline, a second exec
(as the sandbox's user: root without capabilities may not signal its processes) kills the
marked processes; if even that fails the container is killed and the exec raises
``SandboxError``.

Faults are not the model's: a container that fails to start, is gone, or stops, and a
daemon that does not answer, raise ``SandboxError``.

What both backends share (argument checks, environment, listeners, closed state) is
``sandboxes.front.SandboxFront``.
"""

from __future__ import annotations

import base64
import logging
import math
import os
import posixpath
import socket
import threading
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence

import docker
import docker.errors
import docker.types

from agentrl.errors import ConfigError, SandboxError
from agentrl.types import ExecResult
from sandboxes import front
from sandboxes.base import SandboxSpec
from sandboxes.docker.daemon import client_is_remote, docker_client, infra_errors
from sandboxes.docker.exec_io import KILL_ONLY, RUN_AND_SCAN, launch, pump
from sandboxes.docker.reaper import container_labels, reap_containers, reap_containers_once, remove_container
from sandboxes.front import HOSTNAME, TIMEOUT_EXIT_CODE, SandboxFront
from sandboxes.hostfs import workdir_components
from sandboxes.labels import process_start_ticks
from sandboxes.output import BoundedOutput
from sandboxes.reaper_lock import reaper_lock

logger = logging.getLogger(__name__)

EXEC_ID_ENV = "AGENTRL_EXEC_ID"
SANDBOX_USER = "1000:1000"

_OUTSIDE_GRACE_S = 2.0
_FILE_LIMIT_BYTES = 1 << 30

_INFRA_ERRORS = infra_errors()

BRIDGE_WARNING = (
    "a sandbox on Docker's bridge network started: a Harbor task with network access (or an OpenEnv image "
    "server) can reach services listening on this host's bridge address or on 0.0.0.0 (Docker cannot block "
    "that without the host's firewall); bind this host's services to 127.0.0.1, or firewall the bridge "
    "(docs/sandboxes.md)"
)
"""What the first bridge sandbox of a process logs (a WARNING of this module's logger)."""
_bridge_warning = threading.Lock()  # acquired for good by the first warning


def _finalize(owner_pid: int, client: docker.DockerClient, container_id: str) -> None:
    """Finalizer: force-remove the container (also at interpreter exit). Never from a
    forked child, whose copy of the finalizer is not the owner's."""
    if os.getpid() == owner_pid:
        remove_container(client, container_id)


def _reap_containers_locked(**kwargs: object) -> int:
    """``reap_containers(**kwargs)`` under the reaper lock (``sandboxes.reaper_lock``)."""
    with reaper_lock():
        return reap_containers(**kwargs)


class DockerSandbox:
    """A ``Sandbox`` (``sandboxes.base``) backed by one Docker container; see the module
    docstring for what is isolated and how.

    Args:
        spec: limits and layout; ``spec.image`` must exist locally (``agentrl sandbox
            build-image``).
        client: a ``docker.DockerClient`` to use (default: ``docker_client(host=docker_host)``).
        docker_host: the daemon to use without ``client``: the config's
            ``sandbox.docker_host`` (``None``: ``DOCKER_HOST``, else the default socket).

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

    def __init__(self, spec: SandboxSpec, *, client: docker.DockerClient | None = None,
                 docker_host: str | None = None) -> None:
        self._front: SandboxFront[socket.socket] = SandboxFront(self, spec)
        self.spec = self._front.spec
        self.label = self._front.label
        self._client = client if client is not None else docker_client(host=docker_host)
        self._remote = client_is_remote(self._client)
        if spec.ro_mounts and self._remote:
            raise ConfigError(f"ro_mounts={spec.ro_mounts!r} bind paths of this machine, but the Docker daemon "
                              f"{self._client.api.base_url!r} is remote; run it on this machine's daemon")
        reap_containers_once(_reap_containers_locked, client=self._client)
        t0 = time.monotonic()
        labels = container_labels(self.label)
        tmpfs_mb = max(16, spec.memory_mb)
        tmpfs = {"/tmp": f"rw,nosuid,nodev,size={tmpfs_mb}m,mode=1777"}
        owned = f"rw,nosuid,nodev,exec,size={tmpfs_mb}m,uid=1000,gid=1000,mode=0755"
        if not spec.writable_root:  # else the working directory is the image's own, files kept
            tmpfs[spec.workdir] = owned
        tmpfs.update({path: owned for path in spec.tmpfs_dirs})
        try:
            created = self._client.api.create_container(
                spec.image,
                command=["sleep", "infinity"],
                user=SANDBOX_USER,
                working_dir=spec.workdir,
                hostname=HOSTNAME,
                environment={**self._front.base_env, **spec.env},
                labels=labels,
                host_config=self._client.api.create_host_config(
                    init=True,
                    network_mode=spec.network,
                    mem_limit=f"{spec.memory_mb}m",
                    memswap_limit=f"{spec.memory_mb}m",
                    pids_limit=spec.pids_limit,
                    nano_cpus=int(spec.cpus * 1e9),
                    read_only=not spec.writable_root,
                    mounts=[docker.types.Mount(inside, host, type="bind", read_only=True)
                            for host, inside in spec.ro_mounts],
                    cap_drop=["ALL"],
                    security_opt=["no-new-privileges"],
                    tmpfs=tmpfs,
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
            self._front.close()
            raise SandboxError(f"container of {spec.image!r} did not start: {exc}") from exc
        self.startup_s = time.monotonic() - t0
        logger.debug("created %r in %.0f ms", self, self.startup_s * 1e3)
        if spec.network == "bridge" and _bridge_warning.acquire(blocking=False):
            logger.warning(BRIDGE_WARNING)

    def ip_address(self) -> str:
        """The container's IPv4 address on its ``bridge`` network: where this machine (that of
        the daemon) reaches a server listening in it.

        Raises:
            SandboxError: no address (network ``none`` or ``host``), or the daemon failed.
        """
        try:
            settings = self._client.api.inspect_container(self.container_id).get("NetworkSettings") or {}
        except _INFRA_ERRORS as exc:
            raise SandboxError(f"inspecting the sandbox container {self.container_id[:12]} failed: {exc}") from exc
        for net in (settings.get("Networks") or {}).values():
            if (net or {}).get("IPAddress"):
                return str(net["IPAddress"])
        raise SandboxError(f"the sandbox container {self.container_id[:12]} has no IP address on network "
                           f"{self.spec.network!r}; expected network='bridge'")

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
        args = self._front.exec_args(command, timeout_s, stdin, env, cwd)
        return self._run(
            args.record, args.argv, args.timeout_s, args.stdin, args.env, args.cwd,
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
        self._front.check_open(record)
        exec_id = uuid.uuid4().hex
        environment = self._front.environment(extra_env)  # the run label last: not overridable
        environment[EXEC_ID_ENV] = exec_id
        # `timeout` takes seconds with a fraction; round up to 10 ms.
        t_arg = f"{max(1, math.ceil(timeout * 100)) / 100:.2f}"
        full = launch(RUN_AND_SCAN, exec_id, t_arg, *argv)
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
        self._front.begin(exec_id, raw)  # cancelled at once if closed since the check above
        out, err = BoundedOutput(limit_bytes), BoundedOutput(limit_bytes)
        timed_out = False
        killed_from_outside = False
        try:
            if self._front.cancelled(exec_id):
                raise _Cancelled
            status = pump(raw, stdin_bytes, out, err, start + timeout + _OUTSIDE_GRACE_S)
            if status == "deadline":
                killed_from_outside = True
                self._kill_exec(exec_id)
                status = pump(raw, None, out, err, time.monotonic() + _OUTSIDE_GRACE_S)
                if status == "deadline":
                    self._kill_container()
                    raise SandboxError(
                        f"exec could not be ended {timeout:.1f} s + {2 * _OUTSIDE_GRACE_S:.0f} s "
                        "after its start; the container was killed", command=record,
                    )
        except _Cancelled:
            pass
        except OSError as exc:
            if not self._front.cancelled(exec_id):
                raise self._infra_error(record, exc) from exc
        finally:
            # the SDK's socket wrapper (a SocketIO in a reference cycle with its HTTP response)
            # holds the descriptor open until it is closed too, else until a garbage collection
            for handle in (raw, sock) if sock is not raw else (raw,):
                try:
                    handle.close()
                except OSError:
                    pass
            cancelled = self._front.end(exec_id)
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
            self._front.listeners.notify(result)
        return result

    def _kill_exec(self, exec_id: str) -> None:
        try:
            self._client.api.exec_start(
                self._client.api.exec_create(
                    self.container_id, launch(KILL_ONLY, exec_id), user=SANDBOX_USER,
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
        if running and not self._remote and state.get("Pid"):
            # The daemon may not have noticed yet that the container's init was killed
            # (docker kill / rm -f race): ask the kernel (same machine as a local daemon).
            running = process_start_ticks(int(state["Pid"])) is not None
        if not running:
            raise SandboxError(
                f"the sandbox container {self.container_id[:12]} is not running (status "
                f"{state.get('Status')!r}, OOM killed {state.get('OOMKilled')}); {what}",
                command=record,
            )

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
        self._front.check_open()
        data = front.content_bytes(content)
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
        self._front.check_open()
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
        return base64.b64decode(r.stdout)

    # ------------------------------------------------------------------ listeners, lifetime

    add_listener = front.add_listener
    remove_listener = front.remove_listener
    closed = front.closed
    __enter__ = front.enter
    __exit__ = front.exit_

    def is_healthy(self) -> bool:
        """True while the container runs (one daemon round trip)."""
        if self._front.closed:
            return False
        try:
            return bool(self._client.api.inspect_container(self.container_id)["State"].get("Running"))
        except _INFRA_ERRORS:
            return False

    def close(self) -> None:
        """Kill execs in flight (they raise ``SandboxError``) and remove the container.
        Idempotent."""
        running = self._front.close()
        if running is None:
            return
        for raw in running:
            try:
                raw.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        self._finalizer()

    def __repr__(self) -> str:
        state = "closed" if self._front.closed else "open"
        cid = getattr(self, "container_id", "")[:12]
        return (
            f"DockerSandbox(run_id={self.spec.run_id!r}, id={self.label.sandbox_id!r}, "
            f"container={cid!r}, image={self.spec.image!r}, {state})"
        )


class _Cancelled(Exception):
    pass
