"""Scoring reasoning-gym answers outside the rollout process (``hub/ReasoningGym-v0``).

Some scorers evaluate the answer as code (``spiral_matrix`` calls ``eval``; ``countdown`` and
``puzzle24`` call sympy's ``parse_expr``, which evaluates its input), so the policy's text
never reaches a scorer in the rollout process. Each process has one long-lived worker
(``shared_worker()``: started at the first answer, shared by the process's envs, thread-safe,
stopped at exit, dead with its parent) that imports reasoning-gym once.

Isolation: under bubblewrap when ``bwrap`` works here (probed once per process): the root
read-only; ``/tmp``, ``/var/tmp``, ``/run`` and ``/dev/shm`` private (no host unix socket,
such as Docker's, is reachable); ``--unshare-all`` (no network; new pid, ipc, user
namespaces), ``--cap-drop ALL``, ``--new-session``, ``--die-with-parent``, the worker pid 1
of its namespace. Else a plain subprocess, with a WARNING: out of the rollout process, but an
answer can reach the machine as the rollout's user. The worker itself never runs policy
text: it makes the datasets (trusted code, the env's kwargs) and hands each answer to a
forked child (one is kept forked ahead) that holds none of its pipes, scores under an
address-space limit and writes its result to a pipe of its own. The worker is not dumpable
(no ptrace, no ``/proc/<pid>/mem``) and, as pid 1, kills every other process of its
namespace after each answer. Code in an answer can so forge at most its own score, never the
scorer, the worker or the rollout process for a later answer.

Protocol, a JSON object per line: ``{"id", "op": "prepare", "family", "seed", "size", "config"}``
(a dataset's first answer in a worker; ``config`` as JSON), then ``{"id", "op": "score", <the
same>, "entry", "index", "answer"}`` (``entry``: the item made in the env process, pickled,
base64; None: the worker makes item ``index``). Replies: ``{"id", "ok": true}``, ``{"id",
"score"}``, ``{"id", "returned": repr}`` or ``{"id", "error"}``. A scorer that raises or returns
a non-number, and a worker that times out, exits or replies garbage (then killed; the next
answer starts a new one) are ``RewardError``s naming family and task, never a score of 0.
"""

from __future__ import annotations

import atexit
import base64
import contextlib
import ctypes
import fcntl
import gc
import json
import logging
import os
import pickle
import resource
import select
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from agentrl.errors import RewardError, SandboxError
from sandboxes.bwrap_process import LAUNCH_PATH, find_bwrap
from sandboxes.launcher import launch, stop_launcher_if_idle

__all__ = ["DEFAULT_SCORE_TIMEOUT_S", "ScorerWorker", "shared_worker", "stop_shared_worker", "serve"]

logger = logging.getLogger(__name__)

DEFAULT_SCORE_TIMEOUT_S = 10.0
"""Seconds one answer may take to score (the env kwarg ``score_timeout_s``)."""
START_TIMEOUT_S = 120.0
"""Seconds a new worker may take to import reasoning-gym and say it is ready."""
PREPARE_TIMEOUT_S = 120.0
"""Seconds a worker may take to make a dataset (``acre`` makes its whole set when made)."""
CHILD_EXTRA_ADDRESS_BYTES = 4 << 30
"""The scoring child's address space may grow this far beyond the worker's."""
MAX_REPLY_BYTES = 1 << 16
"""A reply line longer than this is garbage."""
_KILL_WAIT_S = 5.0
_PR_SET_PDEATHSIG, _PR_SET_DUMPABLE = 1, 4
_ROOT = str(Path(__file__).resolve().parents[2])  # holds the agentrl package
_PRIVATE_DIRS = ("/tmp", "/var/tmp", "/run", "/var/run", "/dev/shm")


# --------------------------------------------------------------------------- the client side

_BWRAP_LOCK = threading.Lock()
_BWRAP: dict[str, list[str] | None] = {}


def _bwrap_prefix() -> list[str] | None:
    """The bubblewrap command line the worker runs under, or None where bubblewrap does not
    work here (probed once per process by running python in it; a WARNING says why)."""
    with _BWRAP_LOCK:
        if "prefix" in _BWRAP:
            return _BWRAP["prefix"]
        try:
            path = find_bwrap(None).path
            prefix = [path, "--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--as-pid-1",
                      "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
            for d in _PRIVATE_DIRS:
                if os.path.isdir(d) and not os.path.islink(d):
                    prefix += ["--tmpfs", d]
            prefix += ["--chdir", "/tmp", "--clearenv", "--setenv", "PATH", LAUNCH_PATH, "--setenv", "HOME", "/tmp",
                       "--"]
            probe = subprocess.run([*prefix, sys.executable, "-I", "-c", "pass"], capture_output=True, timeout=60,
                                   env={"PATH": LAUNCH_PATH})
            if probe.returncode != 0:
                raise SandboxError(f"python in bubblewrap exited {probe.returncode}: "
                                   f"{probe.stderr.decode(errors='replace').strip()[-500:]}")
        except (SandboxError, OSError, subprocess.TimeoutExpired) as exc:
            logger.warning("bubblewrap does not work here (%s): reasoning-gym answers are scored in a plain "
                           "subprocess, out of the rollout process but NOT isolated from this machine (an answer "
                           "a scorer evaluates can use the rollout user's files and the network)", exc)
            prefix = None
        _BWRAP["prefix"] = prefix
        return prefix


class ScorerWorker:
    """A scoring worker process (module docstring), started at the first call and after a
    failure. Thread-safe: calls are served one at a time.

    Args:
        sandbox: run the worker under bubblewrap (True: or raise ``RewardError`` when it does
            not work; None: when it works here, else a plain subprocess; False: never).
        prelude: Python source the worker runs (in its module's namespace) after importing
            reasoning-gym and before serving; tests use it to plant a failing scorer.
    """

    def __init__(self, *, sandbox: bool | None = None, prelude: str = "") -> None:
        self._sandbox, self._prelude = sandbox, prelude
        self._lock = threading.Lock()
        self._proc: subprocess.Popen | None = None
        self._stderr: Any = None
        self._buf = b""
        self._prepared: set[tuple[str, int, int, str]] = set()
        self._next_id = 0
        self.isolated: bool | None = None
        """Whether the running (or last) worker runs under bubblewrap; None before the first start."""
        self.starts = 0
        """How many worker processes this object has started."""

    def start(self) -> None:
        """Start the worker now unless one runs (``score`` otherwise starts it at its first call).

        Raises:
            RewardError: it did not start (bubblewrap or python failed, or it was not ready in
                ``START_TIMEOUT_S``).
        """
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                self._kill()
                self._start("answers")

    @property
    def pid(self) -> int | None:
        """The pid of the worker's outer process (bwrap, or the worker), or None when none runs."""
        return self._proc.pid if self._proc is not None else None

    def score(self, family: str, seed: int, size: int, config_json: str, entry: Any, index: int, answer: str, *,
              task_id: str, timeout_s: float = DEFAULT_SCORE_TIMEOUT_S) -> float:
        """``dataset.score_answer(answer, entry)`` of ``create_dataset(family, seed=seed,
        size=size, **json.loads(config_json))``, run in the worker. Returns the scorer's number
        as a float, unchecked (the env checks [0, 1]; it may be nan).

        Raises:
            RewardError: naming ``family`` and ``task_id``: the scorer raised or returned a
                non-number, or the worker did not start, timed out after ``timeout_s`` seconds,
                exited or replied garbage (it is killed; the next call starts a new one).
        """
        what = f"reasoning-gym family {family!r} on task {task_id!r}"
        key = (family, seed, size, config_json)
        base = {"family": family, "seed": seed, "size": size, "config": config_json}
        try:
            blob: str | None = base64.b64encode(pickle.dumps(entry)).decode("ascii")
        except Exception:  # noqa: BLE001 - an entry pickle cannot carry: the worker makes item `index`
            blob = None
        with self._lock:
            if key not in self._prepared:
                reply = self._call({"op": "prepare", **base}, PREPARE_TIMEOUT_S, what, "make its dataset")
                if "error" in reply:
                    raise RewardError(f"the scoring worker could not make the dataset of {what}: {reply['error']}")
                self._prepared.add(key)
            reply = self._call({"op": "score", **base, "entry": blob, "index": index, "answer": answer},
                               timeout_s, what, "score the answer")
        if "error" in reply:
            raise RewardError(f"the scorer of reasoning-gym family {family!r} raised on task {task_id!r}: "
                              f"{reply['error']}")
        if "returned" in reply:
            raise RewardError(f"the scorer of reasoning-gym family {family!r} returned {reply['returned']} on task "
                              f"{task_id!r}; expected a number in [0, 1]")
        return float(reply["score"])

    # -- process

    def _start(self, what: str) -> None:
        prefix = _bwrap_prefix() if self._sandbox is not False else None
        if self._sandbox is True and prefix is None:
            raise RewardError(f"cannot score {what}: sandbox=True, but bubblewrap does not work here")
        boot = (f"import sys; sys.path.insert(0, {_ROOT!r}); import importlib.util as u; "
                f"s = u.spec_from_file_location('_rg_scorer_worker', {__file__!r}); m = u.module_from_spec(s); "
                f"s.loader.exec_module(m); m.serve({self._prelude!r}, parent_pid={os.getpid()})")
        argv = [*(prefix or []), sys.executable, "-I", "-c", boot]
        self._stderr = tempfile.TemporaryFile()
        try:
            self._proc = launch(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=self._stderr,
                                 cwd="/", start_new_session=True, env={"PATH": LAUNCH_PATH, "HOME": "/tmp"})
        except OSError as exc:
            raise RewardError(f"cannot score {what}: the scoring worker did not start ({argv[0]}: {exc})") from exc
        self.isolated, self.starts, self._buf, self._prepared = prefix is not None, self.starts + 1, b"", set()
        try:
            hello = self._read(time.monotonic() + START_TIMEOUT_S)
        except _WorkerFailed as exc:
            self._kill()
            raise RewardError(f"cannot score {what}: the scoring worker did not start: {exc}") from None
        if hello != {"ready": True}:
            self._kill()
            raise RewardError(f"cannot score {what}: the scoring worker said {hello!r} instead of being ready")

    def _call(self, request: dict[str, Any], timeout_s: float, what: str, doing: str) -> dict[str, Any]:
        if self._proc is None or self._proc.poll() is not None:
            if self._proc is not None:  # between answers: no answer is lost
                logger.warning("the reasoning-gym scoring worker exited (%s); starting a new one", self._exit_note())
                self._kill()
            self._start(what)
        self._next_id += 1
        rid = self._next_id
        deadline = time.monotonic() + timeout_s
        try:
            self._write((json.dumps({"id": rid, **request}) + "\n").encode(), deadline)
            reply = self._read(deadline)
            if not isinstance(reply, dict) or reply.get("id") != rid or not _well_formed(reply, request["op"]):
                raise _WorkerFailed(f"replied {json.dumps(reply)[:300]}, which is not a reply to request {rid}")
        except _WorkerFailed as exc:
            self._kill()
            note = f"timed out after {timeout_s:g} s" if str(exc) == "timed out" else str(exc)
            raise RewardError(f"the scoring worker failed to {doing} of {what}: {note}; it was killed (the next "
                              "answer starts a new one)") from None
        return reply

    def _write(self, data: bytes, deadline: float) -> None:
        assert self._proc is not None and self._proc.stdin is not None
        fd = self._proc.stdin.fileno()
        while data:
            if not _ready(fd, select.POLLOUT, deadline):
                raise _WorkerFailed("timed out")
            try:
                data = data[os.write(fd, data[: 1 << 16]):]
            except OSError as exc:
                raise _WorkerFailed(f"exited ({self._exit_note()})") from exc

    def _read(self, deadline: float) -> Any:
        assert self._proc is not None and self._proc.stdout is not None
        fd = self._proc.stdout.fileno()
        while b"\n" not in self._buf:
            if len(self._buf) > MAX_REPLY_BYTES:
                raise _WorkerFailed(f"sent {len(self._buf)} bytes without a line end: {self._buf[:200]!r}")
            if not _ready(fd, select.POLLIN, deadline):
                raise _WorkerFailed("timed out")
            chunk = os.read(fd, 1 << 16)
            if not chunk:
                raise _WorkerFailed(f"exited ({self._exit_note()})")
            self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            return json.loads(line)
        except ValueError:
            raise _WorkerFailed(f"sent garbage: {line[:200]!r}") from None

    def _exit_note(self) -> str:
        try:
            code = self._proc.wait(_KILL_WAIT_S) if self._proc is not None else None
            self._stderr.seek(max(0, self._stderr.seek(0, os.SEEK_END) - 800))
            tail = self._stderr.read().decode(errors="replace").strip()
        except (subprocess.TimeoutExpired, OSError, ValueError, AttributeError):
            code, tail = None, ""
        return f"exit code {code}" + (f"; its stderr ends: {tail!r}" if tail else "")

    def _kill(self) -> None:
        proc, self._proc = self._proc, None
        if proc is None:
            return
        if proc.returncode is None:  # not reaped yet, so its pid (its session's id) is not reused
            try:
                os.killpg(proc.pid, signal.SIGKILL)  # its own session (start_new_session)
            except (ProcessLookupError, PermissionError):
                proc.kill()
        try:
            proc.wait(_KILL_WAIT_S)
        except subprocess.TimeoutExpired:
            logger.warning("the reasoning-gym scoring worker (pid %d) did not exit after SIGKILL", proc.pid)
        for f in (proc.stdin, proc.stdout, self._stderr):
            with contextlib.suppress(OSError, AttributeError):
                f.close()

    def close(self) -> None:
        """Stop the worker (a later call starts a new one). Idempotent."""
        with self._lock:
            self._kill()


class _WorkerFailed(Exception):
    """The worker timed out (the message is "timed out"), exited or replied garbage."""


def _ready(fd: int, event: int, deadline: float) -> bool:
    """Whether ``fd`` is ready for ``event`` (or hung up) before ``deadline`` (monotonic s)."""
    poller = select.poll()
    poller.register(fd, event)
    left = deadline - time.monotonic()
    return left > 0 and bool(poller.poll(left * 1000))


def _well_formed(reply: dict[str, Any], op: str) -> bool:
    if op == "prepare":
        return reply.get("ok") is True or isinstance(reply.get("error"), str)
    return type(reply.get("score")) in (int, float) or isinstance(reply.get("error") or reply.get("returned"), str)


_SHARED_LOCK = threading.Lock()
_SHARED: dict[str, Any] = {"pid": None, "worker": None}


def shared_worker() -> ScorerWorker:
    """This process's scoring worker, shared by its envs (one per process: a forked child gets
    a new one and leaves its parent's alone)."""
    with _SHARED_LOCK:
        if _SHARED["pid"] != os.getpid() or _SHARED["worker"] is None:
            _SHARED["pid"], _SHARED["worker"] = os.getpid(), ScorerWorker()
        return _SHARED["worker"]


def stop_shared_worker() -> None:
    """Stop this process's scoring worker (also run at exit); a later answer starts a new one."""
    with _SHARED_LOCK:
        worker = _SHARED["worker"] if _SHARED["pid"] == os.getpid() else None
        _SHARED["worker"] = None
    if worker is not None:
        worker.close()
    stop_launcher_if_idle()


atexit.register(stop_shared_worker)


# --------------------------------------------------------------------------- the worker side

def _prctl(option: int, value: int) -> None:
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(option, value, 0, 0, 0)


def serve(prelude: str = "", parent_pid: int | None = None) -> None:
    """The worker's loop (run as ``python -I -c``, see ``ScorerWorker``): read requests on
    stdin, reply on stdout, until stdin ends. One scoring child is kept forked ahead (a spare
    that holds every dataset made so far), so an answer does not wait for a fork.

    ``parent_pid``: the process that launched it. The death signal is armed here, after the
    interpreter started: a worker whose parent is already gone by then (its parent is no
    longer ``parent_pid``) exits at once instead of living on orphaned. Under bubblewrap the
    parent is outside the worker's pid namespace (``getppid()`` is 0) and ``--die-with-parent``
    covers it."""
    _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    _prctl(_PR_SET_DUMPABLE, 0)
    if parent_pid is not None and os.getppid() not in (0, parent_pid):
        os._exit(1)  # the launcher died before the death signal was armed: nobody reads our replies
    requests, replies = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
    null = os.open(os.devnull, os.O_RDWR)
    os.dup2(null, 0)
    os.dup2(2, 1)  # a stray print goes to stderr, never into a reply
    os.close(null)
    import reasoning_gym  # the optional extra `reasoning-gym` (a ConfigError in the env when missing)

    if prelude:
        exec(prelude, globals())  # trusted test code (ScorerWorker's prelude)
    datasets: dict[tuple[Any, ...], Any] = {}
    spare: tuple | None = _fork_scorer(datasets)  # (pid, request fd, result fd, the dataset keys it holds)
    used: tuple | None = None  # the child of the last answer, until it is ended
    replies.write(b'{"ready": true}\n')
    replies.flush()
    for line in requests:
        request = json.loads(line)
        key = (request["family"], request["seed"], request["size"], request["config"])
        try:
            if key not in datasets:
                if len(datasets) >= 64:
                    datasets.pop(next(iter(datasets)))
                datasets[key] = reasoning_gym.create_dataset(key[0], seed=key[1], size=key[2], **json.loads(key[3]))
                _warm(datasets[key])
            reply: dict[str, Any] = {"ok": True}
            if request["op"] == "score":
                spare = _fresh(spare, key)
                child, spare = spare or _fork_scorer(datasets), None
                reply, used = _score_in(child, line)
        except Exception as exc:  # noqa: BLE001 - trusted code failed (making the dataset, forking)
            reply = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
        replies.write(_encode_reply({"id": request["id"], **reply}))
        replies.flush()
        if used is not None:  # ended after the reply: its exit (tearing down its memory) takes a while
            _end_children(used)
            used = None
        spare = _fresh(spare, key) or _fork_scorer(datasets)


def _encode_reply(reply: dict[str, Any]) -> bytes:
    return (json.dumps(reply) + "\n").encode()


def _warm(ds: Any) -> None:
    """Score item 0's own reference answer here (trusted text), so the scorer's lazy imports and
    caches (sympy's, for countdown) are made once, in the worker, not in every child."""
    try:
        entry = ds[0]
        ds.score_answer(entry.get("answer"), entry)
    except Exception:  # noqa: BLE001 - a warm-up only
        pass


def _fresh(spare: tuple | None, key: tuple) -> tuple | None:
    """``spare``, or None (ended) when it was forked before the dataset ``key`` was made."""
    if spare is not None and key not in spare[3]:
        _end_children(spare)
        return None
    return spare


def _fork_scorer(datasets: dict[tuple[Any, ...], Any]) -> tuple:
    """Fork a scoring child that holds none of the worker's pipes: it reads one score request
    line (to EOF) on fd 3, scores it under an address-space limit and writes its result
    (``{"score"}``, ``{"returned"}`` or ``{"error"}``) to fd 4."""
    req_r, req_w = os.pipe()
    res_r, res_w = os.pipe()
    gc.freeze()  # the child's collections leave the worker's objects (and their shared pages) alone
    pid = os.fork()
    if pid == 0:
        try:
            gc.disable()  # a short life: no collection copies the worker's pages
            os.setpgid(0, 0)
            high_r, high_w = fcntl.fcntl(req_r, fcntl.F_DUPFD, 5), fcntl.fcntl(res_w, fcntl.F_DUPFD, 5)
            os.dup2(high_r, 3)
            os.dup2(high_w, 4)
            null = os.open(os.devnull, os.O_RDWR)
            for fd in (0, 1, 2):
                os.dup2(null, fd)
            os.closerange(5, max(os.sysconf("SC_OPEN_MAX"), 5))
            limit = int(Path("/proc/self/statm").read_text().split()[0]) * os.sysconf("SC_PAGE_SIZE")
            resource.setrlimit(resource.RLIMIT_AS, (limit + CHILD_EXTRA_ADDRESS_BYTES,) * 2)
            with os.fdopen(3, "rb") as f:
                request = json.loads(f.read())
            try:
                ds = datasets[(request["family"], request["seed"], request["size"], request["config"])]
                entry = (pickle.loads(base64.b64decode(request["entry"])) if request["entry"] is not None
                         else ds[request["index"]])
                value = ds.score_answer(request["answer"], entry)
                ok = isinstance(value, (int, float)) and not isinstance(value, bool)
                out: dict[str, Any] = {"score": float(value)} if ok else {"returned": repr(value)[:200]}
            except BaseException as exc:  # noqa: BLE001 - reported as the scorer's failure
                out = {"error": f"{type(exc).__name__}: {exc}"[:2000]}
            os.write(4, json.dumps(out).encode())
            os.close(4)  # the worker reads its end now, not after this process's memory is torn down
        finally:
            os._exit(0)
    with contextlib.suppress(OSError):
        os.setpgid(pid, pid)  # also here: the child may not have run yet when it is ended
    os.close(req_r)
    os.close(res_w)
    return pid, req_w, res_r, frozenset(datasets)


def _end_children(child: tuple) -> int:
    """Kill ``child`` and whatever it started (as pid 1 of the bubblewrap namespace: every
    other process in it), close its pipes and reap them. Returns its wait status."""
    pid = child[0]
    for target, how in (((-1, os.kill),) if os.getpid() == 1 else ()) + ((pid, os.killpg), (pid, os.kill)):
        with contextlib.suppress(OSError):
            how(target, signal.SIGKILL)
    for fd in child[1:3]:
        with contextlib.suppress(OSError):
            os.close(fd)
    status = os.waitpid(pid, 0)[1]
    with contextlib.suppress(ChildProcessError):  # reap (as pid 1, the namespace's orphans too)
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass
    return status


def _score_in(child: tuple, line: bytes) -> tuple[dict[str, Any], tuple | None]:
    """Hand the request ``line`` to the spare ``child``. Returns its result and the child for
    the caller to end, or an error saying how it ended without one and None (ended here)."""
    pid, req_w, res_r, _ = child
    with contextlib.suppress(OSError):  # it died: said below
        while line:
            line = line[os.write(req_w, line):]
    os.close(req_w)
    data = b""
    while len(data) <= MAX_REPLY_BYTES and (chunk := os.read(res_r, 1 << 16)):
        data += chunk
    try:
        out = json.loads(data) if len(data) <= MAX_REPLY_BYTES else None
    except ValueError:
        out = None
    if isinstance(out, dict) and len(out) == 1 and (isinstance(out.get("score"), float) or
                                                   isinstance(out.get("returned"), str) or
                                                   isinstance(out.get("error"), str)):
        return out, (pid, -1, res_r)
    code = os.waitstatus_to_exitcode(_end_children((pid, -1, res_r)))
    how = f"was killed by signal {-code}" if code < 0 else f"exited with code {code}"
    return {"error": f"the scoring process {how} without a result (out of memory, or the answer ended it)"}, None
