"""The bubblewrap process of one exec (``BwrapRun``: its pipes, status reports, and how it is
killed) and finding a usable ``bwrap`` binary (``find_bwrap``). The careful core of the
bubblewrap backend (``sandboxes.bwrap``), which builds the command line.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import selectors
import shutil
import signal
import subprocess
import threading
import time
from dataclasses import dataclass

from agentrl.errors import SandboxError
from sandboxes.output import BoundedOutput

logger = logging.getLogger(__name__)

_READ_CHUNK = 1 << 20
_STDIN_CHUNK = 1 << 16
_PIPE_SIZE = 1 << 20
KILL_GRACE_S = 5.0
"""Seconds a SIGKILLed bubblewrap is given to exit (and its pipes to close)."""
_INIT_KILL_WAIT_S = 1.0
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
LAUNCH_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
"""``PATH`` of the ``bwrap`` process itself (not of the command)."""

_LOCK = threading.Lock()
_BWRAP_INFO: dict[str, BwrapInfo] = {}


@dataclass(frozen=True)
class BwrapInfo:
    """A ``bwrap`` binary that works here, and whether it has ``--size`` (sized tmpfs mounts)."""

    path: str
    has_size: bool


def find_bwrap(bwrap_path: str | None) -> BwrapInfo:
    """The ``bwrap`` at ``bwrap_path`` (default: on ``PATH``), probed once per process.

    Raises:
        SandboxError: missing, not runnable, or older than bubblewrap 0.5
            (no ``--json-status-fd``).
    """
    path = bwrap_path or shutil.which("bwrap") or "/usr/bin/bwrap"
    with _LOCK:
        if path in _BWRAP_INFO:
            return _BWRAP_INFO[path]
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise SandboxError(
            f"bubblewrap not found at {path!r}; install it (apt-get install bubblewrap) or "
            "pass bwrap_path="
        )
    try:
        usage = subprocess.run(
            [path, "--help"], capture_output=True, timeout=10, env={"PATH": LAUNCH_PATH}
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"bubblewrap at {path!r} does not run: {exc}") from exc
    text = usage.stdout.decode(errors="replace") + usage.stderr.decode(errors="replace")
    if "--json-status-fd" not in text:
        raise SandboxError(
            f"bubblewrap at {path!r} is too old: --json-status-fd (bubblewrap >= 0.5) is "
            "needed to tell its own failures from the command's"
        )
    info = BwrapInfo(path, has_size="--size" in text)
    if not info.has_size:
        logger.warning("bubblewrap at %s lacks --size: sandbox /tmp is not size-limited", path)
    with _LOCK:
        _BWRAP_INFO[path] = info
    return info


class BwrapRun:
    """One running ``bwrap``: its pipes, its status reports and how to kill it.

    Killing goes through the sandbox's init (bubblewrap's ``child-pid``, pid 1 of the new
    pid namespace), reached by a pidfd so a reused pid is never hit: the kernel then kills
    and reaps every process of the namespace, and the outer bwrap reaps init and exits.
    Killing the outer bwrap first would work too (init has a parent-death signal) but
    leaves init a zombie for the host's pid 1 to reap, still counted in ``pids.current``.
    """

    def __init__(self, proc: subprocess.Popen, status_fd: int) -> None:
        self.proc = proc
        self.status: list[dict] = []
        self._status_fd = status_fd
        self._status_buf = b""
        self._child_pid: int | None = None
        self._child_pidfd: int | None = None
        self._status_lock = threading.Lock()  # close() may kill from another thread
        os.set_blocking(status_fd, False)

    # -- status (--json-status-fd: one JSON document per line)

    def _on_status(self, data: bytes) -> None:
        self._status_buf += data
        *lines, self._status_buf = self._status_buf.split(b"\n")
        for line in lines:
            if not line.strip():
                continue
            try:
                doc = json.loads(line)
            except json.JSONDecodeError:
                logger.warning("unparseable bubblewrap status line: %r", line)
                continue
            self.status.append(doc)
            if "child-pid" in doc and self._child_pid is None:
                self._child_pid = int(doc["child-pid"])
                try:
                    self._child_pidfd = os.pidfd_open(self._child_pid)
                except (AttributeError, OSError):
                    self._child_pidfd = None  # gone already, or kernel < 5.3

    def _drain_status(self) -> bool:
        """Read what is available; False at EOF (or once closed)."""
        with self._status_lock:
            while self._status_fd >= 0:
                try:
                    data = os.read(self._status_fd, 65536)
                except BlockingIOError:
                    return True
                if not data:
                    return False
                self._on_status(data)
            return False

    @property
    def exit_code(self) -> int | None:
        """The command's exit status as bubblewrap reported it; ``None`` when bubblewrap
        never ran the command (setup failed, execvp failed, or it was killed)."""
        codes = [d["exit-code"] for d in self.status if "exit-code" in d]
        return int(codes[-1]) if codes else None

    # -- killing

    def kill(self) -> None:
        """SIGKILL the whole sandbox of this run (idempotent, thread-safe)."""
        if self.proc.poll() is not None:
            return
        self._drain_status()  # learn the child pid if it is waiting in the pipe
        with self._status_lock:
            pidfd = self._child_pidfd
            if pidfd is not None:
                try:
                    signal.pidfd_send_signal(pidfd, signal.SIGKILL)
                except OSError:
                    pidfd = None  # init already gone
        if pidfd is not None:
            try:
                self.proc.wait(timeout=_INIT_KILL_WAIT_S)
                return
            except subprocess.TimeoutExpired:
                pass
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)  # the outer bwrap leads its own session
        except (ProcessLookupError, PermissionError):
            pass

    # -- I/O

    def pump(
        self, stdin: bytes | None, deadline: float, limit: int
    ) -> tuple[BoundedOutput, BoundedOutput, bool]:
        """Feed stdin and read stdout/stderr/status without blocking until the pipes
        close, killing the sandbox at ``deadline`` (monotonic seconds). Returns ``(stdout,
        stderr, timed_out)``; memory stays bounded by the two ``BoundedOutput``."""
        proc = self.proc
        assert proc.stdout is not None and proc.stderr is not None
        out_fd, err_fd = proc.stdout.fileno(), proc.stderr.fileno()
        outputs = {out_fd: BoundedOutput(limit), err_fd: BoundedOutput(limit)}
        sel = selectors.DefaultSelector()
        try:
            for fd in outputs:
                os.set_blocking(fd, False)
                sel.register(fd, selectors.EVENT_READ)
            sel.register(self._status_fd, selectors.EVENT_READ)
            try:
                fcntl.fcntl(out_fd, _F_SETPIPE_SZ, _PIPE_SIZE)
            except OSError:
                pass  # a larger pipe only saves system calls
            stdin_fd, stdin_view = -1, memoryview(stdin or b"")
            if proc.stdin is not None:
                if stdin_view:
                    stdin_fd = proc.stdin.fileno()
                    os.set_blocking(stdin_fd, False)
                    sel.register(stdin_fd, selectors.EVENT_WRITE)
                else:
                    proc.stdin.close()
            timed_out = False
            grace_deadline = float("inf")
            # Until stdout and stderr close (the status pipe alone does not keep us here).
            while out_fd in sel.get_map() or err_fd in sel.get_map():
                now = time.monotonic()
                if not timed_out and now >= deadline:
                    timed_out = True
                    self.kill()
                    grace_deadline = time.monotonic() + KILL_GRACE_S
                if now >= grace_deadline:
                    logger.warning("sandbox pipes still open %.0fs after SIGKILL", KILL_GRACE_S)
                    break
                wait = (grace_deadline if timed_out else deadline) - now
                for key, _ in sel.select(timeout=max(0.0, wait)):
                    fd = key.fd
                    if fd == self._status_fd:
                        if not self._drain_status():
                            sel.unregister(fd)
                    elif fd == stdin_fd:
                        try:
                            stdin_view = stdin_view[os.write(fd, stdin_view[:_STDIN_CHUNK]):]
                        except BlockingIOError:
                            continue
                        except OSError:  # EPIPE: the command stopped reading
                            stdin_view = memoryview(b"")
                        if not stdin_view:
                            sel.unregister(fd)
                            proc.stdin.close()  # type: ignore[union-attr]
                    else:
                        try:
                            data = os.read(fd, _READ_CHUNK)
                        except BlockingIOError:
                            continue
                        if data:
                            outputs[fd].feed(data)
                        else:
                            sel.unregister(fd)
            if not timed_out:
                try:
                    proc.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    timed_out = True  # it closed its output but kept running
                    self.kill()
            return outputs[out_fd], outputs[err_fd], timed_out
        finally:
            sel.close()

    def finish(self) -> None:
        """Make sure the sandbox is dead and reaped; read the last status; free fds."""
        self.kill()
        try:
            self.proc.wait(timeout=KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            logger.error("bubblewrap pid %d survived SIGKILL for %.0fs", self.proc.pid, KILL_GRACE_S)
        for f in (self.proc.stdin, self.proc.stdout, self.proc.stderr):
            if f is not None:
                f.close()
        self._drain_status()
        with self._status_lock:
            os.close(self._status_fd)
            self._status_fd = -1
            if self._child_pidfd is not None:
                os.close(self._child_pidfd)
                self._child_pidfd = None
