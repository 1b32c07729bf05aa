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

import logging
import os
import signal
from pathlib import Path

from agentrl.errors import ConfigError
from sandboxes.docker.daemon import docker_daemon_answers
from sandboxes.hostfs import force_rmtree
from sandboxes.labels import OwnerJudge, SandboxLabel, pid_namespace, read_environ, sandbox_root, validate_run_id
from sandboxes.limits import iter_cgroup_v1_sandboxes
from sandboxes.reaper_lock import reaper_lock

__all__ = ["labelled_processes", "reap_orphans", "reaper_lock"]

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
