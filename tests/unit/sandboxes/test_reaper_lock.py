"""``sandboxes.reaper.reaper_lock``: the reapers of concurrent processes take turns, a holder
can look at what a crash left before any reaper removes it, and the lock is re-entrant within
a process (a holder may reap itself)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from sandboxes.reaper import reap_orphans, reaper_lock

ROOT = Path(__file__).resolve().parents[3]

_REAP = """
import sys, time
from pathlib import Path
from sandboxes.reaper import reap_orphans
print("start", flush=True)
reap_orphans("lock-test", root=Path(sys.argv[1]), docker_host="unix:///nonexistent/docker.sock")
print("done", time.time(), flush=True)
"""


def _orphan_dir(root: Path) -> Path:
    d = root / "lock-test" / "999999999-1-0123456789ab"  # its owner's pid is above pid_max: dead
    (d / "work").mkdir(parents=True)
    return d


def test_another_process_reaps_only_after_the_holder_lets_go(tmp_path):
    orphan = _orphan_dir(tmp_path)
    with reaper_lock(tmp_path) as taken:
        assert taken
        proc = subprocess.Popen([sys.executable, "-c", _REAP, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE,
                                text=True)
        assert proc.stdout.readline().strip() == "start"
        time.sleep(1.5)  # the other reaper runs meanwhile, and waits
        assert orphan.is_dir() and proc.poll() is None
        released = time.time()
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 0
    assert float(out.split()[-1]) >= released and not orphan.exists()


def test_the_lock_is_re_entrant_in_a_process_and_a_waiting_reaper_gives_up_after_its_wait(tmp_path, caplog):
    orphan = _orphan_dir(tmp_path)
    with reaper_lock(tmp_path):
        with reaper_lock(tmp_path) as again:
            assert again
        assert reap_orphans("lock-test", root=tmp_path, docker_host="unix:///nonexistent/docker.sock") == 0
        assert not orphan.exists()  # reaped by the holder itself (a directory counts no process)
    _orphan_dir(tmp_path)
    proc = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], os.O_RDWR); "
                             "fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); time.sleep(30)",
                             str(tmp_path / ".reaper.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "held"
        t0 = time.monotonic()
        with reaper_lock(tmp_path, wait_s=0.5) as taken:
            assert not taken and 0.5 <= time.monotonic() - t0 < 5
        assert "reaping without it" in caplog.text
    finally:
        proc.kill()
        proc.wait()


_PROBE = ("import sys; from pathlib import Path; from sandboxes.reaper import reaper_lock\n"
          "with reaper_lock(Path(sys.argv[1]), wait_s=5) as t: print(t)")


def test_a_child_forked_while_the_lock_is_held_does_not_keep_it(tmp_path):
    """A child forked without exec (a multiprocessing 'fork' worker) closes its copy of the
    lock's descriptor: once the parent lets go, another process takes the lock at once."""
    import multiprocessing

    with reaper_lock(tmp_path) as taken:
        assert taken
        child = multiprocessing.get_context("fork").Process(target=time.sleep, args=(30,), daemon=True)
        child.start()
    try:
        t0 = time.monotonic()
        out = subprocess.run([sys.executable, "-c", _PROBE, str(tmp_path)], cwd=ROOT, capture_output=True,
                             text=True, timeout=60)
        assert out.stdout.strip() == "True" and time.monotonic() - t0 < 5, out.stdout + out.stderr
    finally:
        child.kill()
        child.join()


def test_a_child_forked_while_a_thread_waits_for_the_lock_can_take_it(tmp_path):
    """A fork while another thread of the parent waits for the flock: the child's first
    reaper_lock() is not stuck behind that thread (it gives up after its own wait)."""
    import os
    import threading

    holder = subprocess.Popen([sys.executable, "-c", "import fcntl, os, sys, time; fd = os.open(sys.argv[1], "
                               "os.O_RDWR | os.O_CREAT); fcntl.flock(fd, fcntl.LOCK_EX); print('held', flush=True); "
                               "time.sleep(30)", str(tmp_path / ".reaper.lock")], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        waiter = threading.Thread(target=lambda: reaper_lock(tmp_path, wait_s=4).__enter__(), daemon=True)
        waiter.start()
        time.sleep(0.5)  # the thread now waits for the flock
        pid = os.fork()
        if pid == 0:  # the child: must give up after its 1 s, not wait for the parent's thread
            with reaper_lock(tmp_path, wait_s=1) as taken:
                os._exit(0 if not taken else 3)
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                assert os.waitstatus_to_exitcode(status) == 0
                break
            time.sleep(0.1)
        else:
            os.kill(pid, 9)
            os.waitpid(pid, 0)
            raise AssertionError("the forked child is stuck in reaper_lock()")
    finally:
        holder.kill()
        holder.wait()
