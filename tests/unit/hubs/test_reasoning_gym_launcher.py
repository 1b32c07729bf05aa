"""The launcher thread of the scorer's workers (``sandboxes.launcher``): the processes it starts
die with it (``PR_SET_PDEATHSIG``), so a stop (``release_shared``, the checker) must never end
it while a launch is in flight or a process of it runs."""

from __future__ import annotations

import ctypes
import signal
import subprocess
import threading
import time

from agentrl.hubs import reasoning_gym_scorer as rs
from sandboxes import launcher


def _die_with_parent_thread() -> None:
    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG, as the worker's launch does


def test_a_stop_during_a_launch_leaves_the_launcher_and_the_new_process_alone(monkeypatch):
    real_popen = subprocess.Popen

    class SlowPopen(real_popen):  # the launcher is inside Popen when the stop comes
        def __init__(self, *args, **kwargs):
            time.sleep(0.3)
            super().__init__(*args, **kwargs)

    rs.stop_shared_worker()  # the workers of earlier tests: this one starts with none
    monkeypatch.setattr(launcher.subprocess, "Popen", SlowPopen)
    out: dict = {}
    launching = threading.Thread(target=lambda: out.setdefault("proc", launcher.launch(
        ["sleep", "30"], preexec_fn=_die_with_parent_thread)))
    launching.start()
    time.sleep(0.1)
    launcher.stop_launcher_if_idle()  # a launch is in flight: nothing stops
    launching.join()
    proc = out["proc"]
    try:
        launcher.stop_launcher_if_idle()  # its process runs: nothing stops
        time.sleep(0.5)
        assert proc.poll() is None and launcher.launcher_thread() is not None and launcher.launcher_thread().is_alive()
    finally:
        proc.kill()
        proc.wait()
    thread = launcher.launcher_thread()
    launcher.stop_launcher_if_idle()  # idle now: the thread ends
    assert launcher.launcher_thread() is None and not thread.is_alive()
