"""The bubblewrap sandbox backend: each exec runs in a fresh ``bwrap`` with a shared,
persistent working directory.

Isolation (checked by tests/integration/sandboxes/test_contract.py on both backends, and by
test_bwrap_sandbox.py for what only bubblewrap does):

* ``--unshare-all`` (user, pid, ipc, uts, cgroup and, unless ``spec.network == "host"``,
  network namespaces), ``--cap-drop ALL``, ``--new-session`` (no TIOCSTI on the caller's
  terminal), ``--die-with-parent``; bubblewrap sets ``no_new_privs``.
* Identity: the command runs as uid/gid 1000 (``sandbox``) inside, mapped to an
  unprivileged host uid: when the caller is root, a uid of the sandbox's own drawn from
  ``SANDBOX_UID_BASE + [0, 2**24)`` (bubblewrap then runs unprivileged, as it is designed
  to); otherwise the caller's uid. Never host root: a process with host uid 0 passes
  permission checks on root-owned kernel files even without capabilities (it could write
  global ``/proc/sys`` settings or ``chmod`` the host's ``/dev/null`` through the ``/dev``
  bind mounts). The working directory and what ``write_file`` creates belong to that uid.
* Filesystem: a read-only root tmpfs with the host's ``/usr`` bound read-only, ``/bin``,
  ``/lib``... as the host has them (symlinks into ``/usr`` on merged-/usr systems), the few
  ``/etc`` files programs need (dynamic loader cache, alternatives, time zone, CA
  certificates, Python's ``/etc/python3*``) read-only, generated ``/etc/passwd``,
  ``/etc/group`` and ``/etc/hosts``; a fresh ``/proc``, a minimal ``/dev``, private tmpfs
  ``/tmp`` and ``/dev/shm`` (sized to ``memory_mb``; new for every exec), and the
  sandbox's private host directory bound read-write at ``spec.workdir``. Nothing else of
  the host (home directories, ``/root``, ``/work``, the caller's virtualenv) is visible.
* The environment is cleared: ``PATH`` (system directories only, so ``python3`` is the
  system ``/usr/bin/python3``), ``HOME=spec.workdir``, ``LANG=C.UTF-8``, ``TMPDIR=/tmp``,
  then ``spec.env``, then the exec's ``env``, then the run label (``AGENTRL_RUN_ID``,
  ``AGENTRL_SANDBOX_ID``, ``AGENTRL_OWNER_PID``, ``AGENTRL_OWNER_START``; see
  ``sandboxes.labels``), which the outer ``bwrap`` process carries too.

Lifetime: pid 1 of each exec's new pid namespace is a small ``/bin/sh`` init (``bwrap
--as-pid-1``) that runs the command as pid 2 and waits for it. When the command exits, or
when the sandbox is killed (timeout, ``close()``: SIGKILL to that init through a pidfd;
death of the owning process: ``--die-with-parent``), pid 1 dies and the kernel kills and
reaps every process left in the namespace, ``setsid``/daemonised escapees included; the
outer ``bwrap`` reaps pid 1. Background processes therefore never outlive their exec, and
no zombie is handed to the host's pid 1 (bubblewrap's own init would be, and where pid 1
reaps slowly or never, as in a container whose pid 1 is our program, such zombies pile up
and count against ``pids.max``). Files in the working directory persist across execs until
``close()``.

Limits: see ``sandboxes.limits`` (cgroup v1 when writable, else rlimits);
``BwrapSandbox.limits`` says which one a sandbox uses.

Telling the sandbox's failure from the command's: bubblewrap reports the exit status on
``--json-status-fd`` only once its setup finished and it started the init. An exec without
that report (and not killed by us) raises ``SandboxError`` with bubblewrap's message; a
missing program is the command's failure (exit code 127 and ``sh: 1: exec: NAME: not
found``, as in a shell).
"""

from __future__ import annotations

import fcntl
import glob
import json
import logging
import os
import secrets
import selectors
import shutil
import signal
import subprocess
import threading
import time
import uuid
import weakref
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from agentrl.errors import ConfigError, SandboxError
from agentrl.types import ExecResult
from sandboxes.base import ExecListener, ExecListeners, SandboxSpec
from sandboxes.hostfs import force_rmtree, read_beneath, workdir_components, write_beneath
from sandboxes.labels import Owner, SandboxLabel, sandbox_root
from sandboxes.limits import MIB, LimitGroup, LimitsMode, create_limits
from sandboxes.output import BoundedOutput
from sandboxes.reaper import reap_orphans
from sandboxes.validation import normalize_command, validate_env, validate_spec, validate_timeout

logger = logging.getLogger(__name__)

SANDBOX_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
"""``PATH`` inside the sandbox (Debian's default)."""
HOSTNAME = "agentrl-sandbox"
SYSTEM_PYTHON = "/usr/bin/python3"
SANDBOX_UID_BASE = 1_000_000_000
SANDBOX_UID_SPAN = 1 << 24
"""When the caller is root, each sandbox runs as its own host uid (= gid) drawn from
``[SANDBOX_UID_BASE, SANDBOX_UID_BASE + SANDBOX_UID_SPAN)``; otherwise as the caller."""
INSIDE_UID = 1000
"""The uid (and gid) the command sees, named ``sandbox`` in the generated ``/etc/passwd``."""
TIMEOUT_EXIT_CODE = 128 + signal.SIGKILL
"""``exit_code`` of a command killed at its timeout (137, as a shell reports SIGKILL)."""

_READ_CHUNK = 1 << 20
_STDIN_CHUNK = 1 << 16
_PIPE_SIZE = 1 << 20
_KILL_GRACE_S = 5.0
_INIT_KILL_WAIT_S = 1.0
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
_LAUNCH_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"

_TOP_LEVEL_DIRS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_ETC_ALWAYS = (
    "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "localtime", "ssl",
    "ca-certificates", "nsswitch.conf", "services", "protocols", "mime.types",
)
_ETC_HOST_NETWORK = ("resolv.conf", "hosts", "gai.conf", "host.conf")
# pid 1 of every sandbox (bwrap --as-pid-1): runs the command as its child, in the
# foreground (default signal dispositions, stdin kept), reaps orphans while it waits, and
# exits with the command's status (128+N after signal N). Its own stderr is /dev/null so the
# shell's "Killed"-style job messages do not reach the command's output; a missing program
# gives "sh: 1: exec: NAME: not found" and 127, as in a shell.
_INIT_SCRIPT = 'exec 3>&2 2>/dev/null; (exec 2>&3 3>&- "$@"); exit $?'


@dataclass(frozen=True)
class _BwrapInfo:
    path: str
    has_size: bool


_PROCESS_STATE_LOCK = threading.Lock()
_BWRAP_INFO: dict[str, _BwrapInfo] = {}
_PROBED: set[tuple[str, str, str]] = set()
_REAPED_AT_START = False


def _find_bwrap(bwrap_path: str | None) -> _BwrapInfo:
    path = bwrap_path or shutil.which("bwrap") or "/usr/bin/bwrap"
    with _PROCESS_STATE_LOCK:
        if path in _BWRAP_INFO:
            return _BWRAP_INFO[path]
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        raise SandboxError(
            f"bubblewrap not found at {path!r}; install it (apt-get install bubblewrap) or "
            "pass bwrap_path="
        )
    try:
        usage = subprocess.run(
            [path, "--help"], capture_output=True, timeout=10, env={"PATH": _LAUNCH_PATH}
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxError(f"bubblewrap at {path!r} does not run: {exc}") from exc
    text = usage.stdout.decode(errors="replace") + usage.stderr.decode(errors="replace")
    if "--json-status-fd" not in text:
        raise SandboxError(
            f"bubblewrap at {path!r} is too old: --json-status-fd (bubblewrap >= 0.5) is "
            "needed to tell its own failures from the command's"
        )
    info = _BwrapInfo(path, has_size="--size" in text)
    if not info.has_size:
        logger.warning("bubblewrap at %s lacks --size: sandbox /tmp is not size-limited", path)
    with _PROCESS_STATE_LOCK:
        _BWRAP_INFO[path] = info
    return info


def _reap_orphans_once() -> None:
    """The first sandbox of a process removes what crashed processes left (case C10:
    "at the latest after the next start of the program"). Only sandboxes whose owner is
    dead are touched."""
    global _REAPED_AT_START
    with _PROCESS_STATE_LOCK:
        if _REAPED_AT_START:
            return
        _REAPED_AT_START = True
    try:
        reap_orphans()
    except Exception:  # a reaper failure must not stop new sandboxes
        logger.exception("reaping orphaned sandboxes failed")


def _cleanup(owner_pid: int, sandbox_dir: Path, limits: LimitGroup) -> None:
    """Finalizer of a sandbox (also run at interpreter exit). Never touches anything from a
    forked child, whose copy of the finalizer is not the owner's."""
    if os.getpid() != owner_pid:
        return
    limits.remove()
    force_rmtree(sandbox_dir)
    try:
        sandbox_dir.parent.rmdir()  # the run's directory once its last sandbox is gone
    except OSError:
        pass


class _BwrapRun:
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
                    grace_deadline = time.monotonic() + _KILL_GRACE_S
                if now >= grace_deadline:
                    logger.warning("sandbox pipes still open %.0fs after SIGKILL", _KILL_GRACE_S)
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
            self.proc.wait(timeout=_KILL_GRACE_S)
        except subprocess.TimeoutExpired:
            logger.error("bubblewrap pid %d survived SIGKILL for %.0fs", self.proc.pid, _KILL_GRACE_S)
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


class BwrapSandbox:
    """A ``Sandbox`` (``sandboxes.base``) built on bubblewrap; see the module docstring for
    what is isolated and how.

    Args:
        spec: limits and layout. ``spec.image`` is ignored (the host's ``/usr`` is used).
        bwrap_path: the ``bwrap`` binary (default: ``bwrap`` on ``PATH``).
        limits: ``"auto"`` (cgroup v1 when writable, else rlimits), ``"cgroup"`` or
            ``"rlimit"``; see ``sandboxes.limits``.
        python_path: interpreter whose presence is checked when ``require_python``.
        require_python: check at construction that ``python_path`` exists and runs inside
            the sandbox (the code environments need it).

    Attributes:
        spec: as given.
        limits: the limit mechanism in use: ``"cgroup-v1"``, ``"rlimit"`` or ``"none"``.
        label: run label carried by the sandbox's processes and directories.
        host_workdir: host directory bound at ``spec.workdir``.

    Raises:
        ConfigError: an invalid ``spec`` field or ``limits`` value.
        SandboxError: bubblewrap missing, too old or unable to start a sandbox here; the
            system python missing; cgroups requested but not writable.

    Thread safety: ``exec``, ``read_file`` and ``write_file`` may run concurrently from
    several threads (each exec is its own bwrap); ``close`` kills execs in flight, which
    then raise ``SandboxError``.
    """

    def __init__(
        self,
        spec: SandboxSpec,
        *,
        bwrap_path: str | None = None,
        limits: LimitsMode = "auto",
        python_path: str = SYSTEM_PYTHON,
        require_python: bool = True,
    ) -> None:
        self.spec = validate_spec(spec)
        self._bwrap = _find_bwrap(bwrap_path)
        if require_python and not (os.path.isfile(python_path) and os.access(python_path, os.X_OK)):
            raise SandboxError(
                f"{python_path} not found: the bubblewrap sandbox runs the host's system "
                "python3 (apt-get install python3), or pass require_python=False"
            )
        _reap_orphans_once()
        self.label = SandboxLabel(spec.run_id, Owner.current(), uuid.uuid4().hex[:12])
        if os.getuid() == 0:
            # Never run sandboxed code as host root: uid 0 without capabilities still
            # passes permission checks on root-owned kernel files such as /proc/sys/*.
            self._uid = self._gid = SANDBOX_UID_BASE + secrets.randbelow(SANDBOX_UID_SPAN)
            self._popen_identity: dict = {"user": self._uid, "group": self._gid, "extra_groups": []}
        else:
            self._uid, self._gid = os.getuid(), os.getgid()
            self._popen_identity = {}
        self._dir = self._make_dirs()
        self.host_workdir = self._dir / "work"
        try:
            self._limits = create_limits(
                limits, self.label, memory_mb=spec.memory_mb, pids_limit=spec.pids_limit,
                cpus=spec.cpus, uid=self._uid, gid=self._gid,
            )
        except BaseException:
            force_rmtree(self._dir)
            raise
        self.limits = self._limits.kind
        self._finalizer = weakref.finalize(self, _cleanup, os.getpid(), self._dir, self._limits)
        self._lock = threading.Lock()
        self._running: set[_BwrapRun] = set()
        self._cancelled: set[_BwrapRun] = set()
        self._closed = False
        self._listeners = ExecListeners()
        self._base_env = {
            "PATH": SANDBOX_PATH,
            "HOME": spec.workdir,
            "LANG": "C.UTF-8",
            "TMPDIR": "/tmp",
        }
        self._label_env = self.label.environ()
        self._launch_env = {"PATH": _LAUNCH_PATH, **self._label_env}
        self._static_args = self._mount_args()
        try:
            self._probe(python_path if require_python else None)
        except BaseException:
            self.close()
            raise
        logger.debug("created %r (host uid %d, workdir %s)", self, self._uid, self.host_workdir)

    # ------------------------------------------------------------------ setup

    def _make_dirs(self) -> Path:
        """``<root>/<run_id>/<pid>-<start>-<id>/{work,etc}``. The directories above ``work``
        are root's (mode 0711: the sandbox's uid may pass through, not list); ``work`` is
        the sandbox uid's."""
        root = sandbox_root()
        try:
            root.mkdir(mode=0o711, parents=True, exist_ok=True)
            st = root.lstat()
            if not root.is_dir() or root.is_symlink() or st.st_uid != os.getuid():
                raise SandboxError(
                    f"sandbox root {root} is not a directory owned by uid {os.getuid()}; "
                    "remove it or set AGENTRL_SANDBOX_ROOT"
                )
            run_dir = root / self.label.run_id
            run_dir.mkdir(mode=0o711, exist_ok=True)
            for p in (root, run_dir):
                os.chmod(p, 0o711)
            d = run_dir / self.label.dir_name
            d.mkdir(mode=0o711)
        except OSError as exc:
            raise SandboxError(f"could not create the sandbox directory under {root}: {exc}") from exc
        try:
            (d / "work").mkdir(mode=0o755)
            os.chown(d / "work", self._uid, self._gid)
            (d / "etc").mkdir(mode=0o755)
            passwd = [
                "root:x:0:0:root:/root:/usr/sbin/nologin",
                f"sandbox:x:{INSIDE_UID}:{INSIDE_UID}:sandbox:{self.spec.workdir}:/bin/sh",
                "nobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin",
            ]
            group = ["root:x:0:", f"sandbox:x:{INSIDE_UID}:", "nogroup:x:65534:"]
            (d / "etc" / "passwd").write_text("\n".join(passwd) + "\n")
            (d / "etc" / "group").write_text("\n".join(group) + "\n")
            (d / "etc" / "hosts").write_text(
                f"127.0.0.1\tlocalhost\n127.0.1.1\t{HOSTNAME}\n::1\tlocalhost ip6-localhost ip6-loopback\n"
            )
        except OSError as exc:
            force_rmtree(d)
            raise SandboxError(f"could not set up the sandbox directory {d}: {exc}") from exc
        return d

    def _mount_args(self) -> list[str]:
        spec = self.spec
        args = ["--unshare-all", "--unshare-user", "--uid", str(INSIDE_UID), "--gid", str(INSIDE_UID)]
        if spec.network == "host":
            args.append("--share-net")
        args += [
            "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--as-pid-1",
            "--hostname", HOSTNAME,
            "--ro-bind", "/usr", "/usr",
        ]
        for name in _TOP_LEVEL_DIRS:
            host = Path("/") / name
            if host.is_symlink():
                args += ["--symlink", os.readlink(host), f"/{name}"]
            elif host.is_dir():
                args += ["--ro-bind", str(host), f"/{name}"]
        etc = [f"/etc/{n}" for n in _ETC_ALWAYS] + sorted(glob.glob("/etc/python3*"))
        if spec.network == "host":
            etc += [f"/etc/{n}" for n in _ETC_HOST_NETWORK]
        for path in etc:
            if os.path.lexists(path):
                args += ["--ro-bind-try", path, path]
        for name in ("passwd", "group") + (("hosts",) if spec.network == "none" else ()):
            args += ["--ro-bind", str(self._dir / "etc" / name), f"/etc/{name}"]
        args += ["--proc", "/proc", "--dev", "/dev"]
        for mount in ("/tmp", "/dev/shm"):
            if self._bwrap.has_size:
                args += ["--size", str(spec.memory_mb * MIB)]
            args += ["--tmpfs", mount]
        args += ["--bind", str(self._dir / "work"), spec.workdir, "--remount-ro", "/", "--clearenv"]
        return args

    def _probe(self, python_path: str | None) -> None:
        """Start one sandbox per (bwrap, limits, network) and process, so a host where
        bubblewrap cannot work fails here, not in the middle of a run."""
        key = (self._bwrap.path, self.limits, self.spec.network)
        with _PROCESS_STATE_LOCK:
            if key in _PROBED:
                return
        argv = [python_path, "-c", "pass"] if python_path else ["true"]
        result = self.exec(argv, timeout_s=60)
        if result.exit_code != 0:
            raise SandboxError(
                f"bubblewrap started but {' '.join(argv)} failed inside the sandbox "
                f"(exit {result.exit_code}): {result.stderr.strip()[:2000]}",
                command=argv,
                output=result.stderr,
            )
        with _PROCESS_STATE_LOCK:
            _PROBED.add(key)

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
        """Run ``command`` in a fresh bwrap over this sandbox's working directory.

        Args:
            command: a shell string (run by ``/bin/sh -c``) or an argv sequence.
            timeout_s: wall-clock limit in seconds (default ``spec.default_timeout_s``);
                at the limit the whole process tree is killed and ``timed_out`` is set,
                with ``exit_code`` 137.
            stdin: bytes (or str, encoded as UTF-8) fed to the command, then EOF; ``None``
                gives ``/dev/null``.
            env: variables added over ``spec.env`` and the defaults.
            cwd: directory inside the sandbox (relative: under ``spec.workdir``; default
                ``spec.workdir``).

        Returns:
            ``ExecResult``; ``stdout``/``stderr`` decoded (U+FFFD for invalid UTF-8) and
            capped at ``spec.output_limit_bytes`` each (head and tail kept, marker between).

        Raises:
            ConfigError: invalid ``command``, ``timeout_s``, ``env``, ``stdin`` or ``cwd``.
            SandboxError: the sandbox is closed or was closed during the exec, or
                bubblewrap failed before the command started (its message included).
        """
        record, argv = normalize_command(command)
        timeout = validate_timeout(
            self.spec.default_timeout_s if timeout_s is None else timeout_s, "timeout_s"
        )
        stdin_bytes = self._stdin_bytes(stdin)
        merged = {**self._base_env, **self.spec.env}
        if env is not None:
            merged.update(validate_env(env, "env"))
        workdir_cwd = self._resolve_cwd(cwd)
        merged.update(self._label_env)  # last: the run label cannot be overridden
        setenv = [x for k, v in merged.items() for x in ("--setenv", k, v)]
        self._check_open(record)

        status_r, status_w = os.pipe()
        full_argv = [
            *self._limits.launcher, self._bwrap.path, *self._static_args,
            "--chdir", workdir_cwd, *setenv, "--json-status-fd", str(status_w), "--",
            "/bin/sh", "-c", _INIT_SCRIPT, "sh", *argv,
        ]
        start = time.monotonic()
        try:
            proc = subprocess.Popen(
                full_argv,
                stdin=subprocess.PIPE if stdin_bytes is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                pass_fds=(status_w,),
                start_new_session=True,
                env=self._launch_env,
                cwd="/",
                **self._popen_identity,
            )
        except OSError as exc:
            os.close(status_r)
            raise SandboxError(
                f"could not start bubblewrap ({self._bwrap.path}): {exc}", command=record
            ) from exc
        finally:
            os.close(status_w)
        run = _BwrapRun(proc, status_r)
        with self._lock:
            self._running.add(run)
            if self._closed:  # closed between the check above and Popen
                self._cancelled.add(run)
        try:
            if run in self._cancelled:
                run.kill()
            out, err, timed_out = run.pump(stdin_bytes, start + timeout, self.spec.output_limit_bytes)
        finally:
            run.finish()
            with self._lock:
                self._running.discard(run)
                cancelled = run in self._cancelled
                self._cancelled.discard(run)
        duration = time.monotonic() - start
        stdout, out_dropped = out.finish()
        stderr, err_dropped = err.finish()

        if cancelled:
            raise SandboxError(
                "the sandbox was closed while the command was running", command=record,
                output=stdout + stderr,
            )
        if timed_out:
            exit_code = TIMEOUT_EXIT_CODE
        elif run.exit_code is not None:
            exit_code = run.exit_code
        else:
            raise SandboxError(
                f"bubblewrap failed before running the command (exit status "
                f"{proc.returncode}): {stderr.strip()[-2000:]}",
                command=record,
                output=stdout + stderr,
            )
        result = ExecResult(
            command=record,
            exit_code=exit_code,
            stdout=stdout,
            stderr=stderr,
            duration_s=duration,
            timed_out=timed_out,
            truncated_bytes=out_dropped + err_dropped,
        )
        self._notify(result)
        return result

    def _stdin_bytes(self, stdin: bytes | str | None) -> bytes | None:
        if stdin is None or isinstance(stdin, bytes):
            return stdin
        if isinstance(stdin, str):
            return stdin.encode("utf-8")
        if isinstance(stdin, (bytearray, memoryview)):
            return bytes(stdin)
        raise ConfigError(f"stdin of type {type(stdin).__name__} must be bytes, str or None")

    def _resolve_cwd(self, cwd: str | None) -> str:
        if cwd is None:
            return self.spec.workdir
        if not isinstance(cwd, str) or not cwd or "\0" in cwd:
            raise ConfigError(f"cwd={cwd!r} must be a non-empty path without NUL bytes")
        return os.path.normpath(os.path.join(self.spec.workdir, cwd))

    def _check_open(self, command: object = None) -> None:
        if self._closed:
            raise SandboxError(f"{self!r} is closed", command=command)

    def _notify(self, result: ExecResult) -> None:
        self._listeners.notify(result)

    # ------------------------------------------------------------------ files

    def write_file(self, path: str, content: bytes | str) -> None:
        """Create or replace a file under ``spec.workdir`` (missing parents are created).

        ``path`` is relative to ``spec.workdir`` or absolute under it; ``str`` content is
        written as UTF-8.

        Raises:
            SandboxError: the path leaves the working directory (``../../etc/passwd``), a
                symlink or special file is on the way, the sandbox is closed, or an OS
                error.
            ConfigError: ``content`` is not bytes or str.
        """
        self._check_open()
        if isinstance(content, str):
            data = content.encode("utf-8")
        elif isinstance(content, (bytes, bytearray, memoryview)):
            data = bytes(content)
        else:
            raise ConfigError(f"content of type {type(content).__name__} must be bytes or str")
        components = workdir_components(path, self.spec.workdir)
        write_beneath(self.host_workdir, components, path, data, owner=(self._uid, self._gid))

    def read_file(self, path: str) -> bytes:
        """Read a regular file under ``spec.workdir`` (relative or absolute path).

        Raises:
            SandboxError: missing file (``FileNotFoundError``'s message in it), path leaving
                the working directory, a symlink or special file on the way, sandbox closed.
        """
        self._check_open()
        components = workdir_components(path, self.spec.workdir)
        return read_beneath(self.host_workdir, components, path)

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

    def limit_counters(self) -> dict[str, int]:
        """Kernel counters of the sandbox's limits (cgroup mode; empty otherwise), e.g.
        ``pids_limit_hits`` and ``memory_max_usage_bytes``."""
        return self._limits.counters()

    def close(self) -> None:
        """Kill every exec in flight (they raise ``SandboxError``), remove the cgroups and
        delete the working directory. Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
            running = list(self._running)
            self._cancelled.update(running)
        for run in running:
            run.kill()
        for run in running:
            try:
                run.proc.wait(timeout=_KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                logger.error("bubblewrap pid %d survived SIGKILL for %.0fs", run.proc.pid, _KILL_GRACE_S)
        self._finalizer()

    def __enter__(self) -> BwrapSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else "open"
        return (
            f"BwrapSandbox(run_id={self.spec.run_id!r}, id={self.label.sandbox_id!r}, "
            f"limits={self.limits!r}, workdir={self.spec.workdir!r}, {state})"
        )
