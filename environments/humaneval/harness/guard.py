"""The supervisor's two guards: no process of a submission outlives its turn, and no test
case outlives its time limit. Standard library only; its source is placed between
``codec.py`` and ``supervisor.py`` (``environments.humaneval.scoring.harness_scripts``).

Processes. ``ProcessSweeper`` makes the supervisor a child subreaper
(``prctl(PR_SET_CHILD_SUBREAPER)``, Linux >= 3.4): a process that a test process starts and
that leaves its parent behind (``setsid`` + double ``fork``) is re-parented to the
supervisor, not to the pid namespace's init, so every process the submission ever started
stays a descendant of the supervisor. ``sweep()`` SIGKILLs all descendants (read from
``/proc/<pid>/stat``) and reaps them, round after round until none is left. It never
touches a process outside the supervisor's own tree: not its ancestors, not other processes
of the sandbox (in the Docker backend several execs share one pid namespace), not the
host's processes when the supervisor runs on the host in the unit tests.

Time. ``CaseClock`` arms ``signal.setitimer(ITIMER_REAL)`` at each deadline; its SIGALRM
handler raises the case's timeout in the main thread when the interrupted code is the test
code (``<test>``, ``<prompt>``, or library code they called) or the rebuilding of a result
(``from_tagged``); inside the supervisor's own bookkeeping it re-arms for a few
milliseconds and waits for that code to return (its I/O has its own deadline). So a result
built to be slow to rebuild (a set of integers whose hashes all collide) or to work on in
Python ends as a timeout of its case. A single C call that runs long (one builtin operation
on such a value) cannot be interrupted by a Python handler; ``ITIMER_PROF`` with its default
action (terminate) bounds it: the supervisor dies by SIGPROF after ``hard_limit_s`` of CPU
time in one phase, and the host scores the case that was running as a timeout.
"""

import ctypes as _guard_ctypes
import os as _guard_os
import signal as _guard_signal
import time as _guard_time

PR_SET_CHILD_SUBREAPER = 36
ALARM_RETRY_S = 0.01
"""How soon a deadline that passed inside the supervisor's own code is looked at again."""
JUDGED_FILES = frozenset(("<test>", "<prompt>"))
"""Code whose time the case's deadline bounds (compiled under these names by the judge)."""


class ProcessSweeper:
    """Kills what test processes leave behind. ``subreaper`` says whether the kernel made
    this process a child subreaper (without it, orphaned descendants reach init and only
    descendants still attached to the tree can be found)."""

    def __init__(self):
        try:
            libc = _guard_ctypes.CDLL(None, use_errno=True)
            self.subreaper = libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0
        except (OSError, AttributeError):
            self.subreaper = False

    def _reap(self):
        """Reap finished children; True when this process has no child left at all."""
        while True:
            try:
                pid, _ = _guard_os.waitpid(-1, _guard_os.WNOHANG)
            except ChildProcessError:
                return True
            if pid == 0:
                return False

    @staticmethod
    def descendants(root):
        """Pids of the live (not zombie) descendants of ``root``, read from ``/proc``."""
        children = {}
        for name in _guard_os.listdir("/proc"):
            if not name.isdigit():
                continue
            try:
                with open(f"/proc/{name}/stat", "rb") as fh:
                    fields = fh.read().rsplit(b")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if fields and fields[0] != b"Z":
                children.setdefault(int(fields[1]), []).append(int(name))
        found, todo = [], [root]
        while todo:
            for pid in children.get(todo.pop(), ()):
                found.append(pid)
                todo.append(pid)
        return found

    def sweep(self, limit_s=5.0):
        """SIGKILL and reap every descendant of this process. Call only when no child is
        still wanted (every ``Popen`` already waited for). Returns False when some were
        still alive after ``limit_s`` seconds (e.g. stuck in uninterruptible sleep)."""
        end = _guard_time.monotonic() + limit_s
        me = _guard_os.getpid()
        while True:
            if self._reap() and self.subreaper:
                return True  # a subreaper without children has no descendants
            pids = self.descendants(me)
            if not pids and self.subreaper is False:
                return True
            for pid in pids:
                try:
                    _guard_os.kill(pid, _guard_signal.SIGKILL)
                except OSError:
                    pass
            if _guard_time.monotonic() > end:
                return False
            _guard_time.sleep(0.001)


class CaseClock:
    """Wall-clock deadline of the current phase (loading, one test case, the setup between
    cases), enforced in the main thread by SIGALRM, with a CPU-time backstop (SIGPROF,
    default action). ``start(seconds)`` arms both, ``stop()`` disarms; ``deadline`` is the
    ``time.monotonic()`` value at which the phase ends (infinite when stopped).
    ``interruptible_codes``: harness code objects that run on the test's time (the result's
    rebuilding); ``hard_limit_s(seconds)``: the CPU seconds after which SIGPROF ends the
    process; ``timeout_error()``: the exception the handler raises."""

    def __init__(self, interruptible_codes, hard_limit_s, timeout_error):
        self.interruptible = frozenset(interruptible_codes)
        self.hard_limit_s = hard_limit_s
        self.timeout_error = timeout_error
        self.deadline = float("inf")
        self.own_file = ProcessSweeper.descendants.__code__.co_filename

    def install(self):
        _guard_signal.signal(_guard_signal.SIGALRM, self._on_alarm)

    def start(self, seconds):
        self.deadline = _guard_time.monotonic() + seconds
        _guard_signal.setitimer(_guard_signal.ITIMER_PROF, self.hard_limit_s(seconds))
        _guard_signal.setitimer(_guard_signal.ITIMER_REAL, seconds)

    def stop(self):
        self.deadline = float("inf")
        _guard_signal.setitimer(_guard_signal.ITIMER_REAL, 0)
        _guard_signal.setitimer(_guard_signal.ITIMER_PROF, 0)

    def _judged(self, frame):
        """Whether ``frame`` runs on the test's time: the innermost frame that is the
        test's or the harness's decides (library frames in between are skipped)."""
        while frame is not None:
            code = frame.f_code
            if code in self.interruptible or code.co_filename in JUDGED_FILES:
                return True
            if code.co_filename == self.own_file:
                return False
            frame = frame.f_back
        return False

    def _on_alarm(self, signum, frame):
        left = self.deadline - _guard_time.monotonic()
        if left > 0:
            if left != float("inf"):
                _guard_signal.setitimer(_guard_signal.ITIMER_REAL, left + 0.001)
            return
        if self._judged(frame):
            raise self.timeout_error()
        _guard_signal.setitimer(_guard_signal.ITIMER_REAL, ALARM_RETRY_S)
