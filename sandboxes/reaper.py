"""Remove sandbox process trees, cgroups and working directories left by dead owners.

Bubblewrap sandboxes die with their owner in the normal case (``--die-with-parent``), but
a crash can still leave things behind: working directories and cgroups after SIGKILL, or a
process tree if the owner died in the instant before bubblewrap armed its parent-death
signal. ``reap_orphans`` finds them by their run label (``sandboxes.labels``) and removes
them; the first ``BwrapSandbox`` of every process calls it, and the CLI may call it at start
(docs/design.md invariant 8; docs/cases.md, C10). When a Docker daemon answers, it also removes the
containers of dead owners (``sandboxes.docker.reaper``).

Only owners the reaper can look up are judged (``sandboxes.labels.OwnerJudge``): those of
its own pid namespace, and from the initial namespace (as root) those of the namespaces below
it. A reaper in a container or under ``unshare --pid`` that shares the cgroup file system or
the sandbox root with the host cannot look up the host's owners, so their sandboxes are left
alone (logged at debug level), however dead their owner pid looks there.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import signal
import threading
import time
from pathlib import Path
from typing import Iterator

from agentrl.errors import ConfigError
from sandboxes.docker.daemon import docker_daemon_answers
from sandboxes.hostfs import force_rmtree
from sandboxes.labels import OwnerJudge, SandboxLabel, pid_namespace, read_environ, sandbox_root, validate_run_id
from sandboxes.limits import iter_cgroup_v1_sandboxes

logger = logging.getLogger(__name__)


def labelled_processes(run_id: str | None = None) -> dict[int, SandboxLabel]:
    """Processes (pid -> label) carrying a sandbox run label, of ``run_id`` or of any run.

    Only processes whose environment this user may read are seen (all of them for root).
    Zombies have no environment left and are not listed (they no longer run).
    """
    me = os.getpid()
    out: dict[int, SandboxLabel] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == me:
            continue
        env = read_environ(int(entry))
        if not env:
            continue
        label = SandboxLabel.from_environ(env)
        if label is not None and (run_id is None or label.run_id == run_id):
            out[int(entry)] = label
    return out


REAPER_LOCK_WAIT_S = 60.0
"""Seconds a reaper waits for another process's reaper (or an inspection) to finish before it
goes on without the lock (logged)."""
_LOCK = threading.Lock()
_HELD: dict = {"pid": None, "depth": 0, "fd": None, "taken": False}


@contextlib.contextmanager
def reaper_lock(root: Path | None = None, wait_s: float = REAPER_LOCK_WAIT_S) -> Iterator[bool]:
    """Hold the reaper lock of the sandboxes under ``root`` (an ``flock`` on
    ``<root>/.reaper.lock``; default root ``sandbox_root()``): the reapers of concurrent
    processes (every process's first bubblewrap sandbox, a run's start, ``agentrl sandbox
    gc``) take turns, and what a crash left can be looked at before any reaper removes it
    (tests of the reaper do). Held by the process: re-entrant, from any of its threads, and
    released when the last holder lets go. Yields whether the lock is held: False when the
    lock file cannot be made, or after ``wait_s`` seconds of waiting (logged as a WARNING;
    the caller goes on without it).
    """
    base = root if root is not None else sandbox_root()
    with _LOCK:
        if _HELD["pid"] != os.getpid():  # none yet, or a forked child: its parent's hold is not its own
            if _HELD["fd"] is not None:
                os.close(_HELD["fd"])  # the child's copy (the lock stays the parent's until it lets go)
            _HELD.update(pid=os.getpid(), depth=0, fd=None, taken=False)
        if _HELD["depth"] == 0:
            fd = _take_lock(base, wait_s)  # the process's other threads wait here meanwhile
            _HELD.update(fd=fd, taken=fd is not None)
        _HELD["depth"] += 1
        taken = _HELD["taken"]
    try:
        yield taken
    finally:
        with _LOCK:
            _HELD["depth"] -= 1
            if _HELD["depth"] == 0 and _HELD["fd"] is not None:
                os.close(_HELD["fd"])  # releases the flock
                _HELD["fd"] = None


def _take_lock(base: Path, wait_s: float) -> int | None:
    try:
        base.mkdir(mode=0o711, parents=True, exist_ok=True)  # as BwrapSandbox makes the sandbox root
        st = base.lstat()
        if base.is_symlink() or not base.is_dir() or st.st_uid != os.getuid():
            logger.debug("no reaper lock: %s is not a directory owned by uid %d; reaping without it", base, os.getuid())
            return None
        fd = os.open(base / ".reaper.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        logger.debug("no reaper lock under %s (%s): reaping without it", base, exc)
        return None
    deadline = time.monotonic() + wait_s
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except BlockingIOError:
            if time.monotonic() >= deadline:
                os.close(fd)
                logger.warning("the reaper lock %s was held for %.0f s by another process; reaping without it",
                               base / ".reaper.lock", wait_s)
                return None
            time.sleep(0.05)
        except OSError as exc:
            os.close(fd)
            logger.debug("cannot lock %s (%s): reaping without it", base / ".reaper.lock", exc)
            return None


def reap_orphans(
    run_id: str | None = None,
    *,
    include_live_owners: bool = False,
    root: Path | None = None,
    docker_host: str | None = None,
) -> int:
    """Kill orphaned sandbox processes and delete their cgroups and working directories.

    A sandbox is orphaned when the process that created it (pid, start time and pid
    namespace in its label) no longer runs. Sandboxes whose owner cannot be looked up from
    this process (another pid namespace than this one or one below it, ``OwnerJudge``) are
    never judged and only removed with ``include_live_owners``; older labels without a
    namespace are judged as this namespace's (``sandboxes.labels``).

    Args:
        run_id: only sandboxes of this run; ``None``: every run.
        include_live_owners: with ``run_id``, also remove sandboxes whose owner still runs
            or is of another pid namespace (every sandbox of that run, the caller's own
            included); for cleaning up after a run known to be over.
        root: the sandboxes' host directory (default ``sandboxes.labels.sandbox_root()``).
        docker_host: the Docker daemon whose containers are reaped: the run's
            ``sandbox.docker_host`` (``None``: ``DOCKER_HOST``, else the default socket).

    Returns:
        Number of processes killed (labelled processes and members of orphaned cgroups)
        plus the number of sandbox containers removed.

    Raises:
        ConfigError: invalid ``run_id``, or ``include_live_owners`` without ``run_id``.
    """
    if run_id is not None:
        validate_run_id(run_id)
    if include_live_owners and run_id is None:
        raise ConfigError("include_live_owners=True needs a run_id (it removes live sandboxes)")
    with reaper_lock(root):
        return _reap(run_id, include_live_owners, root, docker_host)


def _reap(run_id: str | None, include_live_owners: bool, root: Path | None, docker_host: str | None) -> int:
    foreign: set[tuple[str, str, int | None]] = set()
    judge = OwnerJudge()

    def wanted(label: SandboxLabel) -> bool:
        if run_id is not None and label.run_id != run_id:
            return False
        if include_live_owners:
            return True
        gone = judge.is_gone(label.owner)
        if gone is None:
            foreign.add((label.run_id, label.sandbox_id, label.owner.pid_ns))
        return bool(gone)

    killed: set[int] = set()
    my_pgid = os.getpgrp()
    targets = {pid: lab for pid, lab in labelled_processes(run_id).items() if wanted(lab)}
    for pid, label in targets.items():
        try:
            pgid = os.getpgid(pid)
        except ProcessLookupError:
            continue
        leader = targets.get(pgid)
        # The outer bwrap leads its own process group; kill the group only when its leader
        # is a process of the same sandbox, never a group we belong to.
        if pgid != my_pgid and leader is not None and leader.sandbox_id == label.sandbox_id:
            try:
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        try:
            os.kill(pid, signal.SIGKILL)
            killed.add(pid)
        except ProcessLookupError:
            pass

    removed_cgroups = 0
    for label, group in iter_cgroup_v1_sandboxes():
        if wanted(label):
            killed.update(group.kill_all())
            removed_cgroups += group.remove()

    removed_dirs = 0
    base = root if root is not None else sandbox_root()
    run_dirs = [base / run_id] if run_id is not None else _subdirs(base)
    for run_dir in run_dirs:
        for d in _subdirs(run_dir):
            label = SandboxLabel.from_dir(run_dir.name, d.name)
            if label is not None and wanted(label):
                removed_dirs += force_rmtree(d)
        try:
            run_dir.rmdir()
        except OSError:
            pass
    removed_containers = 0
    if docker_daemon_answers(host=docker_host):
        try:
            from sandboxes.docker.reaper import reap_containers  # heavy: docker

            removed_containers = reap_containers(run_id, include_live_owners=include_live_owners,
                                                 docker_host=docker_host)
        except Exception:  # noqa: BLE001 - a daemon hiccup must not stop the process reaper
            logger.exception("reaping sandbox containers failed")
    if foreign:
        shown = sorted(foreign, key=str)[:10]
        logger.debug(
            "left alone %d sandboxes whose owner is of a pid namespace this one (%s) cannot look "
            "into: %s%s", len(foreign), pid_namespace(),
            ", ".join(f"{r}/{sid} (pid ns {ns})" for r, sid, ns in shown), " ..." if len(foreign) > len(shown) else "",
        )
    if killed or removed_cgroups or removed_dirs:
        logger.info(
            "reaped orphaned sandboxes%s: %d processes killed, %d cgroups and %d working "
            "directories removed",
            f" of run {run_id!r}" if run_id else "", len(killed), removed_cgroups, removed_dirs,
        )
    return len(killed) + removed_containers


def _subdirs(path: Path) -> list[Path]:
    try:
        return [p for p in path.iterdir() if p.is_dir() and not p.is_symlink()]
    except OSError:
        return []
