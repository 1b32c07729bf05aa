"""The reaper lock: the reapers of concurrent processes take turns.

Every process's first bubblewrap or Docker sandbox, a run's start and ``agentrl sandbox gc``
reap what dead owners left (``sandboxes.reaper``). ``reaper_lock()`` (an ``flock`` on
``<sandbox root>/.reaper.lock``) makes them take turns, and lets a caller look at what a crash
left before any other process's reaper removes it (the reaper's own tests do).
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import threading
import time
from pathlib import Path
from typing import Iterator

from sandboxes.labels import sandbox_root

__all__ = ["REAPER_LOCK_WAIT_S", "reaper_lock"]

logger = logging.getLogger(__name__)

REAPER_LOCK_WAIT_S = 60.0
"""Seconds a reaper waits for another process's reaper (or an inspection) to finish before it
goes on without the lock (logged)."""

_COND = threading.Condition()
_HELD: dict = {"depth": 0, "fd": None, "taken": False, "taking": False}


def _after_fork_in_child() -> None:
    """A child forked without exec holds nothing: its copy of the lock's descriptor is closed
    (the lock stays the parent's until the parent lets go), and a condition another thread
    held at the fork is made anew."""
    global _COND
    _COND = threading.Condition()
    fd = _HELD["fd"]
    if fd is not None:
        try:
            os.close(fd)
        except OSError:
            pass
    _HELD.update(depth=0, fd=None, taken=False, taking=False)


os.register_at_fork(after_in_child=_after_fork_in_child)


@contextlib.contextmanager
def reaper_lock(root: Path | None = None, wait_s: float = REAPER_LOCK_WAIT_S) -> Iterator[bool]:
    """Hold the reaper lock of the sandboxes under ``root`` (default ``sandbox_root()``).

    Held by the process: re-entrant, from any of its threads (one of them waits for the
    ``flock``, the others for it), and released when the last holder lets go; a child forked
    without exec does not inherit it.

    Yields:
        Whether the lock is held: False when the lock file cannot be made in a directory of
        this user, or after ``wait_s`` seconds of waiting (logged as a WARNING): the caller
        goes on without it.
    """
    base = root if root is not None else sandbox_root()
    cond = _COND
    with cond:
        while _HELD["taking"]:
            cond.wait()
        first = _HELD["depth"] == 0
        if first:
            _HELD["taking"] = True
        else:
            _HELD["depth"] += 1
    if first:
        fd = None
        try:
            fd = _take_lock(base, wait_s)
        finally:
            with cond:
                _HELD.update(fd=fd, taken=fd is not None, taking=False, depth=1)
                cond.notify_all()
    taken = _HELD["taken"]
    try:
        yield taken
    finally:
        with cond:
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
