"""HumanEval grading supervisor. Runs INSIDE the sandbox as ``python3 -I -c <this file>``;
standard library only (it must not import anything of agentrl).

Reads ``{"nonce", "child_source", "startup_timeout_s", "max_failure_details",
"detail_chars", "jobs": [...]}`` as JSON on stdin, grades every job with fresh child
interpreters (``child.py``, passed in as ``child_source``) and streams one line per event
on stdout: ``nonce + " " + json.dumps(event)``. Events (read by
``environments.humaneval.scoring``): ``["attempt", j, start]``, ``["begin", j, k]``,
``["case", j, k, status, detail]``, ``["load_error", j, detail]``, ``["job_done", j,
attempts, duration_s]``, ``["done"]``, ``["harness_error", traceback]``.

A child reports over a private pipe, one JSON list per line, each starting with its
per-child token: ``hello``, then ``ready`` (or ``loaderr``), then ``begin k`` / ``pass k``
/ ``fail k detail`` per test case, then ``done`` (or ``checkerr``); ``internal`` when the
child itself broke. ``ChildMessages`` judges that stream; anything out of order is a
protocol violation.
"""

import ctypes
import json
import os
import secrets
import select
import signal
import subprocess
import sys
import time
import traceback

MAX_BUFFERED_BYTES = 1 << 20
"""A child that sends more than this without a newline breaks the protocol."""


class ChildMessages:
    """What one test process said so far, and whether it keeps the protocol.

    Args:
        token: the child's random token; every message must start with it.
        n_cases: test cases of the job.
        start: the first case this child may begin (earlier ones are done).
        results: the job's per-case status list (None: not yet known); read to refuse a
            case twice, written through ``record``.
        emit: ``emit(*event)`` streams an event line (called for ``begin``).
        record: ``record(k, status, detail)`` stores a case's result.
        clip: shortens a detail text for the event stream.

    ``feed(chunk)`` returns None while the child may go on, else the verdict that ends
    reading: ``"violation"``, ``"internal"``, ``"loaderr"``, ``"checkerr"`` or ``"done"``.
    After it, ``hello``, ``ready``, ``current`` (the case begun and not finished, or None)
    and ``detail`` (text of the last loaderr / checkerr / done / internal) say where the
    child was.
    """

    def __init__(self, token, n_cases, start, results, emit, record, clip):
        self.token = token
        self.n_cases = n_cases
        self.results = results
        self.emit = emit
        self.record = record
        self.clip = clip
        self.hello = False
        self.ready = False
        self.current = None
        self.next_min = start
        self.detail = ""
        self._buf = b""

    def feed(self, chunk):
        """Take bytes read from the pipe; handle every complete line."""
        self._buf += chunk
        if len(self._buf) > MAX_BUFFERED_BYTES:
            return "violation"
        while b"\n" in self._buf:
            line, self._buf = self._buf.split(b"\n", 1)
            verdict = self.handle(line)
            if verdict is not None:
                return verdict
        return None

    def handle(self, line):
        """One message line; returns a verdict as ``feed`` does."""
        try:
            msg = json.loads(line.decode("utf-8"))
        except (ValueError, UnicodeDecodeError):
            return "violation"
        if not isinstance(msg, list) or len(msg) < 2 or msg[0] != self.token:
            return "violation"
        kind, args = msg[1], msg[2:]
        if kind == "internal":
            self.detail = str(args[0]) if args else ""
            return "internal"
        if kind == "hello":
            if self.hello:
                return "violation"
            self.hello = True
            return None
        if not self.hello:
            return "violation"
        if kind == "loaderr":
            if self.ready:
                return "violation"
            self.detail = self.clip(args[0] if args else "")
            return "loaderr"
        if kind == "ready":
            if self.ready:
                return "violation"
            self.ready = True
            return None
        if not self.ready:
            return "violation"
        if kind == "begin":
            return self._begin(args[0] if args else None)
        if kind in ("pass", "fail"):
            k = args[0] if args else None
            if type(k) is not int or self.current != k:
                return "violation"
            self.record(k, kind, args[1] if kind == "fail" and len(args) > 1 else "")
            self.current = None
            self.next_min = k + 1
            return None
        if kind in ("checkerr", "done"):
            if self.current is not None:
                return "violation"
            self.detail = self.clip(args[0]) if args else ""
            return kind
        return "violation"

    def _begin(self, k):
        if (self.current is not None or type(k) is not int
                or not self.next_min <= k < self.n_cases or self.results[k] is not None):
            return "violation"
        self.current = k
        self.emit("begin", k)
        return None


def describe_exit(rc):
    """``exit code N`` or ``killed by signal NAME`` for a child's return code."""
    if rc < 0:
        try:
            return f"killed by signal {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


class Supervisor:
    """Grades the jobs of one payload (see the module docstring)."""

    def __init__(self, payload, out=None):
        self.nonce = payload["nonce"]
        self.child_source = payload["child_source"]
        self.startup_timeout_s = float(payload["startup_timeout_s"])
        self.max_details = int(payload["max_failure_details"])
        self.detail_chars = int(payload["detail_chars"])
        self.jobs = payload["jobs"]
        self.out = out if out is not None else sys.stdout

    def emit(self, *event):
        self.out.write(self.nonce + " " + json.dumps(list(event)) + "\n")
        self.out.flush()

    def clip(self, text):
        text = str(text).encode("ascii", "backslashreplace").decode("ascii")
        return text if len(text) <= self.detail_chars else text[: self.detail_chars - 3] + "..."

    def run(self):
        try:
            for j, job in enumerate(self.jobs):
                self.run_job(j, job)
        except BaseException:
            self.emit("harness_error", traceback.format_exc()[-3000:])
        else:
            self.emit("done")

    def run_job(self, j, job):
        n = int(job["n_tests"])
        timeout_s = float(job["timeout_s"])
        results = [None] * n
        shown = [0]

        def record(k, status, detail):
            if status != "pass":
                shown[0] += 1
                if shown[0] > self.max_details:
                    detail = ""
            results[k] = status
            self.emit("case", j, k, status, self.clip(detail))

        start = 0
        attempts = 0
        load_error = None
        t_job = time.monotonic()
        while True:
            attempts += 1
            self.emit("attempt", j, start)
            msgs, ended, rc = self.run_child(job, start, n, results, timeout_s,
                                             lambda *ev: self.emit(ev[0], j, *ev[1:]), record)
            if ended == "internal":
                raise RuntimeError(f"test process reported an internal error: {msgs.detail}")
            if not msgs.hello:
                raise RuntimeError(
                    "test process never started "
                    f"({'timed out' if ended == 'timeout' else describe_exit(rc)})"
                )
            if ended == "done":
                break
            if ended == "violation":
                for k in range(n):
                    if results[k] is None:
                        record(k, "error", "invalid message from the test process")
                break
            if not msgs.ready:
                if ended == "loaderr":
                    load_error = msgs.detail
                elif ended == "timeout":
                    load_error = f"loading the solution took more than {timeout_s:g} s"
                else:
                    load_error = f"the process exited while loading the solution ({describe_exit(rc)})"
                self.emit("load_error", j, self.clip(load_error))
                break
            if msgs.current is not None:
                k = msgs.current
                if ended == "timeout":
                    record(k, "timeout", f"took more than {timeout_s:g} s")
                else:
                    record(k, "crash", f"the test process died ({describe_exit(rc)})")
                start = k + 1
                if start >= n:
                    break
                continue
            if ended == "checkerr":
                why = f"test code outside the assertions raised {msgs.detail}"
            elif ended == "timeout":
                why = f"test code outside the assertions took more than {timeout_s:g} s"
            else:
                why = f"the process exited between test cases ({describe_exit(rc)})"
            for k in range(n):
                if results[k] is None:
                    record(k, "fail", why)
            break
        for k in range(n):
            if results[k] is None:
                record(k, "not_run", load_error or "not run")
        self.emit("job_done", j, attempts, time.monotonic() - t_job)

    def run_child(self, job, start, n, results, timeout_s, emit, record):
        """Start one test process at case ``start`` and read its messages until a verdict,
        EOF, its exit or a timeout. Its process group is killed afterwards.

        Returns:
            ``(messages, ended, rc)``: the ``ChildMessages``, the verdict (or ``"exit"`` /
            ``"timeout"``) and the child's return code.
        """
        token = secrets.token_hex(16)
        r, w = os.pipe()
        child_job = {
            "prompt": job["prompt"],
            "solution": job["solution"],
            "test_program": job["test_program"],
            "entry_point": job["entry_point"],
            "memory_mb": job["memory_mb"],
            "start": start,
            "token": token,
            "report_fd": w,
        }
        try:
            proc = subprocess.Popen(
                [sys.executable, "-I", "-c", self.child_source],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                pass_fds=(w,),
                start_new_session=True,
            )
        finally:
            os.close(w)
        try:
            proc.stdin.write(json.dumps(child_job).encode("utf-8"))
            proc.stdin.close()
        except BrokenPipeError:
            pass
        msgs = ChildMessages(token, n, start, results, emit, record, self.clip)
        ended = None
        deadline = time.monotonic() + self.startup_timeout_s
        try:
            while ended is None:
                now = time.monotonic()
                if now >= deadline:
                    ended = "timeout"
                    break
                ready, _, _ = select.select([r], [], [], min(deadline - now, 0.05))
                if ready:
                    chunk = os.read(r, 65536)
                    if not chunk:
                        ended = "exit"
                        break
                    ended = msgs.feed(chunk)
                    deadline = time.monotonic() + timeout_s
                elif proc.poll() is not None:
                    # Exited, but a forked descendant may hold the pipe open: drain.
                    while ended is None and select.select([r], [], [], 0)[0]:
                        chunk = os.read(r, 65536)
                        if not chunk:
                            break
                        ended = msgs.feed(chunk)
                    ended = ended or "exit"
        finally:
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
            rc = proc.wait()
            os.close(r)
        return msgs, ended, rc


def main():
    payload = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    try:  # PR_SET_DUMPABLE = 4: others may not read our memory nor open /proc/<pid>/fd/*.
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    except Exception:
        pass
    Supervisor(payload).run()


if __name__ == "__main__":
    main()
