"""Grading HumanEval submissions in a sandbox: one exec per group of submissions runs the
harness (``harness/supervisor.py`` and ``harness/child.py``, standard-library scripts shipped
as package data), whose event lines become one ``ScoreReport`` per submission. See
``environments.humaneval`` for the protocol and what it defends against."""

from __future__ import annotations

import functools
import importlib.resources
import json
import math
import secrets
import signal
from dataclasses import dataclass, field
from typing import Literal, Sequence

from agentrl.errors import ConfigError, RewardError
from agentrl.types import ExecResult
from environments.humaneval.check_split import CheckProgram
from environments.humaneval.tasks import HumanEvalTask, get_task
from environments.humaneval.visible import REWARD_TESTS, graded_program
from sandboxes.base import Sandbox

__all__ = ["CaseStatus", "AssertionOutcome", "ScoreReport", "score_solutions", "harness_scripts"]


@functools.lru_cache(maxsize=1)
def harness_scripts() -> tuple[str, str]:
    """``(supervisor source, child source)``: the harness scripts, read from this package's
    data (``environments/humaneval/harness/``) with ``importlib.resources``, each after the
    value codec both sides share (``codec.py``); the supervisor's also after its process and
    time guards (``guard.py``).

    Raises:
        RewardError: a script is missing from the installed package.
    """
    root = importlib.resources.files("environments.humaneval").joinpath("harness")
    try:
        codec, guard, supervisor, child = (root.joinpath(name).read_text(encoding="utf-8")
                                           for name in ("codec.py", "guard.py", "supervisor.py", "child.py"))
    except OSError as exc:
        raise RewardError(f"the HumanEval grading harness is missing from the package ({exc}); "
                          "expected environments/humaneval/harness/codec.py, guard.py, supervisor.py "
                          "and child.py") from exc
    return "\n\n".join((codec, guard, supervisor)), codec + "\n\n" + child


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
        tamper: one ``"kind: detail"`` line per attempt to get past the judge that the
            harness refused: ``override`` (a result whose type subclasses a builtin value
            type or defines its own comparison, truth or conversion methods, e.g. an
            ``__eq__`` that always returns True), ``exit`` (the solution ended its test
            process with code 0, or raised ``SystemExit``/``KeyboardInterrupt``),
            ``protocol`` (a message on the harness's pipe that the test process's own code
            did not send: the solution forged or broke one). Such cases score as failures
            either way; this says why.
    """

    task_id: str
    outcomes: tuple[AssertionOutcome, ...]
    load_error: str | None
    attempts: int
    duration_s: float
    tamper: tuple[str, ...] = ()

    @property
    def judge_tamper(self) -> int:
        """Attempts to get past the judge that were refused (``len(tamper)``)."""
        return len(self.tamper)

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
    tests: str = "hidden",
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
        tests: ``"hidden"`` grades on the problem's full ``check`` (the benchmark's judge);
            ``"visible"`` on the examples its prompt shows (``environments.humaneval.visible``),
            with the same harness.

    Returns:
        One ``ScoreReport`` per item, in order.

    Raises:
        ConfigError: unknown task id, unknown ``tests``, or a non-positive timeout or memory
            limit.
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
    if tests not in REWARD_TESTS:
        raise ConfigError(f"tests={tests!r} is not a HumanEval test set; expected one of {REWARD_TESTS}")
    jobs = [_Job(get_task(tid), graded_program(tid, tests), code) for tid, code in items]
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
    tamper: list[str] = field(default_factory=list)
    begun: int | None = None
    attempted: bool = False
    load_error: str | None = None
    attempts: int = 0
    duration_s: float = 0.0
    done: bool = False


def _score_group(
    sandbox: Sandbox, group: Sequence[_Job], timeout_s: float, memory_mb: int | None
) -> list[ScoreReport]:
    supervisor, child = harness_scripts()
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
    ``start``), ``["begin", j, k]``, ``["case", j, k, status, detail]``, ``["tamper", j, k,
    kind, detail]``, ``["load_error", j, detail]``, ``["job_done", j, attempts, duration_s]``, ``["done"]``,
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
            elif kind == "tamper":
                st.tamper.append(f"{ev[3]}: {ev[4]}")
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


_CPU_LIMIT_EXIT_CODES = frozenset({-signal.SIGPROF, 128 + signal.SIGPROF})
"""How the sandbox reports a supervisor ended by its per-phase CPU backstop (SIGPROF: the
test code's work on a result ran past the case's limit inside one builtin operation)."""


def _killed_report(job: _Job, ev: _JobEvents, result: ExecResult) -> ScoreReport:
    why = f"the grading process was killed while the solution ran (exit code {result.exit_code})"
    begun_status = "crash"
    if result.exit_code in _CPU_LIMIT_EXIT_CODES:
        why = "the judge's work on the solution's result ran past the case's time limit"
        begun_status = "timeout"
    outcomes = dict(ev.outcomes)
    if not outcomes and ev.begun is None and ev.load_error is None:
        ev.load_error = why[:_DETAIL_CHARS]
    for k in range(job.program.num_cases):
        if k not in outcomes:
            status = begun_status if k == ev.begun else "not_run"
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
        tamper=tuple(ev.tamper),
    )
