"""Processes launched by one long-lived thread (``launch``), for children that must die with
their parent (``PR_SET_PDEATHSIG``, bubblewrap's ``--die-with-parent``): the kernel ties that
signal to the *thread* that forked the child, and the threads that ask for a launch (rollout
threads, a pool's) come and go. The launcher thread lives while a process it started runs or a
launch is in flight; ``stop_launcher_if_idle`` ends it otherwise (the next ``launch`` starts one
again)."""

from __future__ import annotations

import concurrent.futures
import queue
import subprocess
import threading
from typing import Any

__all__ = ["launch", "launcher_thread", "stop_launcher_if_idle"]

_JOIN_WAIT_S = 5.0
_LOCK = threading.Lock()
_LAUNCHER: dict[str, Any] = {"thread": None, "jobs": None, "procs": [], "pending": 0}


def launch(argv: list[str], **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(argv, **kwargs)``, run by the launcher thread.

    Raises:
        OSError (and what else ``Popen`` raises): the launch failed.
    """
    job: concurrent.futures.Future = concurrent.futures.Future()
    with _LOCK:
        if _LAUNCHER["thread"] is None or not _LAUNCHER["thread"].is_alive():  # none yet, or a forked process
            _LAUNCHER.update(jobs=queue.Queue(), procs=[], pending=0)
            _LAUNCHER["thread"] = threading.Thread(target=_launcher, args=(_LAUNCHER["jobs"],),
                                                   name="agentrl-launcher", daemon=True)
            _LAUNCHER["thread"].start()
        _LAUNCHER["pending"] += 1
        _LAUNCHER["jobs"].put((argv, kwargs, job))
    return job.result()


def _launcher(jobs: queue.Queue) -> None:
    while True:
        item = jobs.get()
        if item is None:
            return
        argv, kwargs, job = item
        try:
            proc = subprocess.Popen(argv, **kwargs)
        except BaseException as exc:  # noqa: BLE001 - handed to the caller
            with _LOCK:
                _LAUNCHER["pending"] -= 1
            job.set_exception(exc)
            continue
        with _LOCK:  # recorded before the launch counts as done: a stop sees it either way
            _LAUNCHER["procs"].append(proc)
            _LAUNCHER["pending"] -= 1
        job.set_result(proc)


def stop_launcher_if_idle() -> None:
    """End the launcher thread when no launch is in flight and every process it started has
    ended."""
    with _LOCK:
        thread = _LAUNCHER["thread"]
        if thread is None or _LAUNCHER["pending"] or any(p.poll() is None for p in _LAUNCHER["procs"]):
            return
        _LAUNCHER["jobs"].put(None)
        _LAUNCHER.update(thread=None, jobs=None, procs=[], pending=0)
    thread.join(timeout=_JOIN_WAIT_S)


def launcher_thread() -> threading.Thread | None:
    """The live launcher thread, or None."""
    return _LAUNCHER["thread"]
