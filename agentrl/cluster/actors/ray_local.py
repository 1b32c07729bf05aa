"""The local Ray instances agentrl starts, and what a dead run's instance leaves behind.

A run with ``cluster.address`` unset starts its own Ray instance (``ray_connect.connect``).
When its driver is killed (SIGKILL, the OOM killer), Ray's head processes notice and exit,
but the raylet's agents (``ray::DashboardAgent``, ``ray::RuntimeEnvAgent``) are reparented
to init and stay, ignoring SIGTERM (measured, Ray 2.60). As the sandbox reaper does for
sandboxes (``sandboxes.reaper``), every process of such an instance carries a label naming
its owner, and a reap removes those whose owner is gone:

- ``labelled_start()``: the environment variable
  ``AGENTRL_RAY_OWNER=<pid>-<start_ticks>-<pidns>`` (the driver's pid, start time and pid
  namespace, ``sandboxes.labels.Owner``) is set while Ray starts the instance, so the GCS, the
  raylet, the agents and every worker inherit it (and the driver's own environment is
  restored right after). ``SPT_NOENV=1`` is set with it: Ray's processes set their titles
  (``ray::DashboardAgent``) with setproctitle, which otherwise writes the title over the
  memory ``/proc/<pid>/environ`` reads, and the label would be gone from a titled process.
- ``reap_dead_ray_instances()``: SIGKILLs every process of this user that carries the label
  of a process that no longer runs (pid gone, or reused: the start time differs). Only owners
  it can look up are judged (``sandboxes.labels.OwnerJudge``): the processes of an instance
  started inside ``unshare --pid`` or a container may be visible here while the owner pid in
  their label means another process (or none) here. An older label without the namespace
  (``<pid>-<start_ticks>``) is judged as this namespace's.

Never touched: a cluster started by ``ray start`` or by another program (no label), and the
instance of a run whose driver still runs (its owner is alive).
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import time
from pathlib import Path
from typing import Iterator

from sandboxes.labels import Owner, OwnerJudge

log = logging.getLogger(__name__)

OWNER_VAR = "AGENTRL_RAY_OWNER"
"""The environment variable that labels a local Ray instance's processes with their driver."""

_KEEP_ENVIRON_VAR = "SPT_NOENV"  # setproctitle's switch: do not write titles over the environment
_GONE_WAIT_S = 5.0  # how long a reap waits for the killed processes to disappear


def owner_label(owner: Owner | None = None) -> str:
    """``"<pid>-<start_ticks>-<pidns>"`` of ``owner`` (default: this process)."""
    return (owner or Owner.current()).token()


@contextlib.contextmanager
def labelled_start() -> Iterator[str]:
    """Label the processes Ray starts inside the block with this process as their owner.

    Yields:
        The label (``"<pid>-<start_ticks>-<pidns>"``).
    """
    label = owner_label()
    # SPT_NOENV: setproctitle (Ray's titles) then keeps to argv's memory and leaves the
    # environment, and with it the label, readable in /proc/<pid>/environ.
    settings = {OWNER_VAR: label, _KEEP_ENVIRON_VAR: "1"}
    before = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        yield label
    finally:
        for name, value in before.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


def _label_of(pid: int) -> Owner | None:
    """The owner label in ``pid``'s environment, None without one (or when unreadable)."""
    try:
        raw = Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:  # gone, or another user's process
        return None
    key = OWNER_VAR.encode() + b"="
    for item in raw.split(b"\0"):
        if item.startswith(key):
            return Owner.parse_token(item[len(key):].decode(errors="replace"))
    return None


def labelled_ray_processes() -> dict[int, Owner]:
    """Every process of this machine (readable by this user) carrying the label: pid -> owner.
    This process is never listed."""
    me = os.getpid()
    out: dict[int, Owner] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit() or int(entry.name) == me:
            continue
        owner = _label_of(int(entry.name))
        if owner is not None:
            out[int(entry.name)] = owner
    return out


def reap_dead_ray_instances() -> list[int]:
    """SIGKILL the processes of local Ray instances whose driver no longer runs.

    Returns:
        The pids killed (waited for up to 5 s to disappear; a process still there then is
        logged, not raised).
    """
    targets, judge = [], OwnerJudge()
    for pid, owner in labelled_ray_processes().items():
        gone = judge.is_gone(owner)
        if gone is None:
            log.debug("left process %d of a Ray instance alone: its driver is of pid namespace %s, "
                      "which this process cannot look into", pid, owner.pid_ns)
        elif gone:
            targets.append(pid)
    killed = []
    for pid in targets:
        try:
            os.kill(pid, signal.SIGKILL)  # the agents ignore SIGTERM
            killed.append(pid)
        except ProcessLookupError:
            continue
        except PermissionError as exc:
            log.warning("could not end process %d of a dead run's Ray instance: %s", pid, exc)
    deadline = time.monotonic() + _GONE_WAIT_S
    while time.monotonic() < deadline and any(_running(p) for p in killed):
        time.sleep(0.05)
    stuck = [p for p in killed if _running(p)]
    if stuck:
        log.warning("processes %s of a dead run's Ray instance are still there after SIGKILL", stuck)
    if killed:
        log.info("ended %d process(es) of Ray instances whose driver is gone: %s", len(killed), killed)
    return killed


def _running(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return state[state.rfind(b")") + 2:][:1] != b"Z"  # a zombie no longer runs


__all__ = ["OWNER_VAR", "labelled_ray_processes", "labelled_start", "owner_label", "reap_dead_ray_instances"]
