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
  ``AGENTRL_SANDBOX_ID``, ``AGENTRL_OWNER_PID``, ``AGENTRL_OWNER_START``,
  ``AGENTRL_OWNER_PIDNS``; see ``sandboxes.labels``), which the outer ``bwrap`` process
  carries too.

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

Code: this module builds the command line and holds the sandbox's state; one running
``bwrap`` (pipes, status, pidfd kill) is ``sandboxes.bwrap_process.BwrapRun``; what both
backends share (argument checks, environment, listeners, closed state) is
``sandboxes.front.SandboxFront``.
"""

from __future__ import annotations

import glob
import logging
import os
import secrets
import subprocess
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from pathlib import Path

from agentrl.errors import ConfigError, SandboxError
from agentrl.types import ExecResult
from sandboxes import front
from sandboxes.base import SandboxSpec
from sandboxes.bwrap_process import KILL_GRACE_S, LAUNCH_PATH, BwrapRun, find_bwrap
from sandboxes.front import HOSTNAME, TIMEOUT_EXIT_CODE, OncePerProcess, SandboxFront
from sandboxes.hostfs import force_rmtree, read_beneath, workdir_components, write_beneath
from sandboxes.labels import sandbox_root
from sandboxes.limits import MIB, LimitGroup, LimitsMode, create_limits
from sandboxes.reaper import reap_orphans

logger = logging.getLogger(__name__)

SYSTEM_PYTHON = "/usr/bin/python3"
SANDBOX_UID_BASE = 1_000_000_000
SANDBOX_UID_SPAN = 1 << 24
"""When the caller is root, each sandbox runs as its own host uid (= gid) drawn from
``[SANDBOX_UID_BASE, SANDBOX_UID_BASE + SANDBOX_UID_SPAN)``; otherwise as the caller."""
INSIDE_UID = 1000
"""The uid (and gid) the command sees, named ``sandbox`` in the generated ``/etc/passwd``."""

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


_PROBED_LOCK = threading.Lock()
_PROBED: set[tuple[str, str, str]] = set()
_reap_orphans_once = OncePerProcess("reaping orphaned sandboxes")
"""The first sandbox of a process removes what crashed processes left, so no sandbox
outlives its run later than the next start of the program (docs/cases.md, C10). Only
sandboxes whose owner is dead are touched (an owner of another pid namespace is never judged dead)."""


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
        self._front: SandboxFront[BwrapRun] = SandboxFront(self, spec)
        self.spec = self._front.spec
        self.label = self._front.label
        if spec.network == "bridge" or spec.writable_root or spec.tmpfs_dirs:
            raise ConfigError(f"network={spec.network!r}, writable_root={spec.writable_root!r}, "
                              f"tmpfs_dirs={spec.tmpfs_dirs!r}: a bridge network, a writable root and tmpfs_dirs "
                              "are Docker only; use the Docker backend (or network 'none'/'host', no writable_root, "
                              "no tmpfs_dirs)")
        self._bwrap = find_bwrap(bwrap_path)
        if require_python and not (os.path.isfile(python_path) and os.access(python_path, os.X_OK)):
            raise SandboxError(
                f"{python_path} not found: the bubblewrap sandbox runs the host's system "
                "python3 (apt-get install python3), or pass require_python=False"
            )
        _reap_orphans_once(reap_orphans)
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
        self._launch_env = {"PATH": LAUNCH_PATH, **self._front.label_env}
        self._static_args = self._mount_args()
        try:
            self._probe(python_path if require_python else None)
        except BaseException:
            self.close()
            raise
        logger.debug("created %r (host uid %d, workdir %s)", self, self._uid, self.host_workdir)

    # ------------------------------------------------------------------ setup

    def _make_dirs(self) -> Path:
        """``<root>/<run_id>/<pid>-<start>-<pidns>-<id>/{work,etc}``. The directories above ``work``
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
            d = run_dir / self.label.dir_name
            # A closing sandbox of this run removes run_dir once it is empty (_cleanup); that can
            # happen between creating run_dir and d, so retry. Once d exists, run_dir stays.
            for attempt in range(5):
                try:
                    run_dir.mkdir(mode=0o711, exist_ok=True)
                    for p in (root, run_dir):
                        os.chmod(p, 0o711)
                    d.mkdir(mode=0o711)
                    break
                except FileNotFoundError:
                    if attempt == 4:
                        raise
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
        for host, inside in spec.ro_mounts:
            args += ["--ro-bind", host, inside]
        args += ["--bind", str(self._dir / "work"), spec.workdir, "--remount-ro", "/", "--clearenv"]
        return args

    def _probe(self, python_path: str | None) -> None:
        """Start one sandbox per (bwrap, limits, network) and process, so a host where
        bubblewrap cannot work fails here, not in the middle of a run."""
        key = (self._bwrap.path, self.limits, self.spec.network)
        with _PROBED_LOCK:
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
        with _PROBED_LOCK:
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
        args = self._front.exec_args(command, timeout_s, stdin, env, cwd)
        record, stdin_bytes = args.record, args.stdin
        environment = self._front.environment(args.env)  # the run label last: not overridable
        setenv = [x for k, v in environment.items() for x in ("--setenv", k, v)]
        self._front.check_open(record)

        status_r, status_w = os.pipe()
        full_argv = [
            *self._limits.launcher, self._bwrap.path, *self._static_args,
            "--chdir", args.cwd, *setenv, "--json-status-fd", str(status_w), "--",
            "/bin/sh", "-c", _INIT_SCRIPT, "sh", *args.argv,
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
        run = BwrapRun(proc, status_r)
        self._front.begin(run, run)  # cancelled at once if closed since the check above
        try:
            if self._front.cancelled(run):
                run.kill()
            out, err, timed_out = run.pump(stdin_bytes, start + args.timeout_s, self.spec.output_limit_bytes)
        finally:
            run.finish()
            cancelled = self._front.end(run)
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
        self._front.listeners.notify(result)
        return result

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
        self._front.check_open()
        data = front.content_bytes(content)
        components = workdir_components(path, self.spec.workdir)
        write_beneath(self.host_workdir, components, path, data, owner=(self._uid, self._gid))

    def read_file(self, path: str) -> bytes:
        """Read a regular file under ``spec.workdir`` (relative or absolute path).

        Raises:
            SandboxError: missing file (``FileNotFoundError``'s message in it), path leaving
                the working directory, a symlink or special file on the way, sandbox closed.
        """
        self._front.check_open()
        components = workdir_components(path, self.spec.workdir)
        return read_beneath(self.host_workdir, components, path)

    # ------------------------------------------------------------------ listeners, lifetime

    add_listener = front.add_listener
    remove_listener = front.remove_listener
    closed = front.closed
    __enter__ = front.enter
    __exit__ = front.exit_

    def limit_counters(self) -> dict[str, int]:
        """Kernel counters of the sandbox's limits (cgroup mode; empty otherwise), e.g.
        ``pids_limit_hits`` and ``memory_max_usage_bytes``."""
        return self._limits.counters()

    def close(self) -> None:
        """Kill every exec in flight (they raise ``SandboxError``), remove the cgroups and
        delete the working directory. Idempotent."""
        running = self._front.close()
        if running is None:
            return
        for run in running:
            run.kill()
        for run in running:
            try:
                run.proc.wait(timeout=KILL_GRACE_S)
            except subprocess.TimeoutExpired:
                logger.error("bubblewrap pid %d survived SIGKILL for %.0fs", run.proc.pid, KILL_GRACE_S)
        self._finalizer()

    def __repr__(self) -> str:
        state = "closed" if self._front.closed else "open"
        return (
            f"BwrapSandbox(run_id={self.spec.run_id!r}, id={self.label.sandbox_id!r}, "
            f"limits={self.limits!r}, workdir={self.spec.workdir!r}, {state})"
        )
