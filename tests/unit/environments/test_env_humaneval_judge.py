"""The HumanEval judge against submissions that try to get past it rather than solve the
task: results whose comparisons lie, subclasses of builtin types, exits, patched builtins and
redefined test helpers; and against submissions that try to turn their grade into a harness
error (forged ``internal`` reports, processes left behind that kill later test processes,
replies built to be slow for the judge to rebuild). The real supervisor and test-process scripts run here on the host
(``run_supervisor``); the same harness runs in the real sandbox in
tests/integration/environments/test_env_humaneval_sandboxed.py. Each case must score 0 on
the cases it attacks, and the attempts the harness can recognise must be counted."""

from __future__ import annotations

import importlib.resources
import math
import os
import signal
import subprocess
import sys

import pytest

from agentrl.types import ExecResult
from environments.humaneval import get_task, split_check
from environments.humaneval.scoring import _complete_report, _Job, _JobEvents, _killed_report, harness_scripts
from tests.unit.environments.test_env_humaneval_supervisor import SUPERVISOR, run_supervisor

BELOW_ZERO = "def below_zero(operations):\n"
"""HumanEval/3: six cases; ``return False`` passes the three that expect False."""


def grade(task_id: str, code: str, timeout_s: float = 3.0):
    jobs, (events, harness_error), result = run_supervisor([(task_id, code)], timeout_s=timeout_s)
    assert harness_error is None
    return _complete_report(jobs[0], events[0], result)


EQ_ALWAYS_TRUE = (
    "class Anything:\n"
    "    def __eq__(self, other):\n        return True\n"
    "    def __ne__(self, other):\n        return False\n"
    "    def __bool__(self):\n        return True\n"
    "    def __hash__(self):\n        return 0\n"
)


@pytest.mark.parametrize("name, code", [
    ("__eq__ always True", EQ_ALWAYS_TRUE + BELOW_ZERO + "    return Anything()\n"),
    ("int subclass whose __eq__ is True", "class Yes(int):\n    def __eq__(self, o):\n        return True\n"
     "    __hash__ = int.__hash__\n" + BELOW_ZERO + "    return Yes(0)\n"),
    ("bool-like str subclass", "class S(str):\n    def __eq__(self, o):\n        return True\n"
     "    __hash__ = str.__hash__\n" + BELOW_ZERO + "    return S('x')\n"),
    ("list of liars", EQ_ALWAYS_TRUE + BELOW_ZERO + "    return [Anything()]\n"),
])
def test_results_whose_comparisons_lie_score_0_and_are_counted(name, code):
    report = grade("HumanEval/3", code)
    assert report.reward == 0.0, name
    assert report.judge_tamper == report.total == 6, report.tamper
    assert all(t.startswith("override: ") for t in report.tamper)
    assert {o.status for o in report.outcomes} == {"fail"}
    assert all("not a plain builtin value" in o.detail for o in report.outcomes)


def test_every_test_case_fails_when_the_candidate_lies_on_humaneval_0():
    # HumanEval/0: 7 cases, the example of the issue ("7/7 tests, reward 1.0")
    report = grade("HumanEval/0", EQ_ALWAYS_TRUE + "def has_close_elements(numbers, threshold):\n"
                   "    return Anything()\n")
    assert (report.passed, report.total, report.judge_tamper) == (0, 7, 7)


@pytest.mark.parametrize("name, code, load_error", [
    ("os._exit(0) in the call", "import os\n" + BELOW_ZERO + "    os._exit(0)\n", None),
    ("sys.exit(0) in the call", "import sys\n" + BELOW_ZERO + "    sys.exit(0)\n", None),
    ("raise SystemExit in the call", BELOW_ZERO + "    raise SystemExit(0)\n", None),
    ("raise KeyboardInterrupt in the call", BELOW_ZERO + "    raise KeyboardInterrupt\n", None),
    ("os._exit(0) at import", "import os\nos._exit(0)\n" + BELOW_ZERO + "    return False\n",
     "the process exited while loading the solution (exit code 0)"),
    ("sys.exit(0) at import", "import sys\nsys.exit(0)\n" + BELOW_ZERO + "    return False\n", "SystemExit: 0"),
])
def test_exiting_early_scores_0_and_is_counted(name, code, load_error):
    report = grade("HumanEval/3", code)
    assert report.reward == 0.0, name
    assert report.load_error == load_error
    assert report.judge_tamper == (1 if load_error else 6), report.tamper
    assert all(t.startswith("exit: ") for t in report.tamper)


def test_an_exit_with_an_error_code_is_a_crash_not_a_tamper_attempt():
    report = grade("HumanEval/3", "import os\n" + BELOW_ZERO + "    os._exit(3)\n")
    assert report.reward == 0.0 and report.judge_tamper == 0
    assert {o.detail for o in report.outcomes} == {"the test process died (exit code 3)"}


@pytest.mark.parametrize("name, task_id, code", [
    # the test's abs() must stay the builtin: HumanEval/2 asserts abs(candidate(x) - y) < 1e-6
    ("patched builtins.abs", "HumanEval/2",
     "import builtins\nbuiltins.abs = lambda x: 0\ndef truncate_number(number):\n    return 0.0\n"),
    # the test's poly() is the prompt's, not one the submission redefines
    ("redefined prompt helper", "HumanEval/32",
     "def poly(xs, x):\n    return 0.0\ndef find_zero(xs):\n    return 0.0\n"),
    # the test's frames, its globals and the harness's report function are not in the
    # submission's process: a candidate that finds them on the stack and reports every case
    # as passed (then exits) cannot, since the assertions run in the supervisor
    ("forged verdicts from the stack", "HumanEval/3",
     "import os, sys\n" + BELOW_ZERO + "    f = sys._getframe(1)\n    while f is not None:\n"
     "        rep = f.f_locals.get('__agentrl_report__')\n"
     "        if rep is not None:\n"
     "            rep('pass', 0)\n"
     "            for k in range(1, 6):\n                rep('begin', k)\n                rep('pass', k)\n"
     "            rep('done')\n            os._exit(0)\n"
     "        f.f_globals['AssertionError'] = StopIteration\n"
     "        f = f.f_back\n    return None\n"),
    ("a tracer that skips lines", "HumanEval/3",
     "import sys\ndef tracer(frame, event, arg):\n"
     "    if event == 'line' and frame.f_code.co_name == '__agentrl_check__':\n"
     "        try:\n            frame.f_lineno = frame.f_lineno + 1\n        except Exception:\n            pass\n"
     "    return tracer\nsys.settrace(tracer)\n" + BELOW_ZERO + "    return None\n"),
])
def test_tampering_with_the_test_process_does_not_reach_the_judge(name, task_id, code):
    report = grade(task_id, code)
    assert report.reward == 0.0, (name, report.outcomes)
    assert report.load_error is None
    # the submission's wrong answers are judged as such
    assert {o.status for o in report.outcomes} == {"fail"}
    assert any(o.detail == "AssertionError" for o in report.outcomes), report.outcomes


def test_a_generator_result_fails_without_counting_as_tamper():
    report = grade("HumanEval/3", BELOW_ZERO + "    return (x for x in [])\n")
    assert report.reward == 0.0 and report.judge_tamper == 0
    assert "object of type generator" in report.outcomes[0].detail


def test_honest_results_of_every_plain_type_reach_the_test_unchanged():
    codec = SUPERVISOR  # the supervisor script carries the codec
    values = [None, True, False, 0, -5, 2 ** 200, 1.5, -0.0, math.inf, "é\ud800", b"\x00\xff", 3 + 4j,
              [1, [2.5, "x"]], (1, (2,)), {"a": 1, 2: [3], (1, 2): None}, {1, 2}, frozenset({"a"}), ()]
    for value in values:
        back = codec.loads_tagged(codec.dumps_tagged(value))
        assert back == value and type(back) is type(value), value
    nan = codec.loads_tagged(codec.dumps_tagged(math.nan))
    assert math.isnan(nan)


@pytest.mark.parametrize("data", ['{"x": 1}', '[1, 2]', '{"l": 1}', '{"d": [[1]]}', '{"s": [{"l": []}]}',
                                  '{"c": ["a", 1]}', '{"l": [], "t": []}'])
def test_the_codec_refuses_anything_but_a_tagged_value(data):
    with pytest.raises((ValueError, TypeError)):
        SUPERVISOR.loads_tagged(data)


def test_the_codec_refuses_subclasses_and_foreign_objects():
    class Liar:
        def __eq__(self, other):
            return True

    class Plain:
        pass

    for value, override in ((type("I", (int,), {})(1), True), (Liar(), True),
                            (Plain(), False), (iter([]), False), ([1, Liar()], True)):
        with pytest.raises(SUPERVISOR.ForeignValue) as info:
            SUPERVISOR.to_tagged(value)
        assert info.value.judge_override is override, value


def test_every_canonical_solution_scores_1_through_the_judge_proxy():
    from environments.humaneval import task_ids

    items = [(tid, get_task(tid).canonical_program) for tid in task_ids("all")]
    jobs, (events, harness_error), result = run_supervisor(items)
    assert harness_error is None
    reports = [_complete_report(j, ev, result) for j, ev in zip(jobs, events)]
    assert [r.task_id for r in reports if r.reward != 1.0 or r.tamper] == []
    assert sum(r.total for r in reports) == 1133
    assert harness_scripts()[0].count("def to_tagged") == 1


# -- a submission cannot turn its grade into a harness error ------------------------------

HONEST_BELOW_ZERO = get_task("HumanEval/3").canonical_program


def grade_with_honest_after(code: str, timeout_s: float = 3.0, **kwargs):
    """Grade ``code`` and then the canonical HumanEval/3 in the same supervisor."""
    jobs, (events, harness_error), result = run_supervisor(
        [("HumanEval/3", code), ("HumanEval/3", HONEST_BELOW_ZERO)], timeout_s=timeout_s, **kwargs)
    assert harness_error is None, harness_error
    attacker, honest = (_complete_report(j, ev, result) for j, ev in zip(jobs, events))
    assert (honest.reward, honest.attempts, honest.tamper) == (1.0, 1, ())
    return attacker


FORGE_INTERNAL = "import sys\nsys._getframe({depth}).f_locals['send']('internal', 'not my fault')\n"


def test_a_forged_internal_error_at_load_time_is_the_submissions_load_error():
    # the test process's own send() is on the stack while the solution loads
    report = grade_with_honest_after(FORGE_INTERNAL.format(depth=1) + BELOW_ZERO + "    return False\n")
    assert report.reward == 0.0 and {o.status for o in report.outcomes} == {"not_run"}
    assert report.load_error == "the test process broke the harness protocol while loading the solution"
    assert report.tamper == ("protocol: the solution sent a 'internal' message while loading",)


def test_a_forged_internal_error_inside_a_call_is_an_error_case_and_counted():
    report = grade_with_honest_after(BELOW_ZERO + "    " + FORGE_INTERNAL.format(depth=1).replace("\n", "\n    ")
                                     + "return False\n")
    assert report.reward == 0.0 and report.load_error is None
    assert {o.status for o in report.outcomes} == {"error"}
    assert report.judge_tamper == 6 and all(t.startswith("protocol: ") for t in report.tamper)


KILLER = '''
import os, sys
_sup, _first = os.getppid(), os.getpid()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open({pid_file!r}, "w") as fh:
            fh.write(str(os.getpid()))
        end = time.time() + 10
        me = os.getpid()
        while time.time() < end:  # SIGKILL every other test process the supervisor starts
            for p in os.listdir("/proc"):
                if not p.isdigit() or int(p) in (me, _first):
                    continue
                try:
                    with open(f"/proc/{{p}}/stat") as f:
                        ppid = int(f.read().rsplit(")", 1)[1].split()[1])
                    if ppid == _sup:
                        os.kill(int(p), 9)
                except Exception:
                    pass
        os._exit(0)
    os._exit(0)
os.wait()
def below_zero(operations):
    os._exit(1)
'''


def test_a_detached_process_that_kills_new_test_processes_is_swept_before_each_start(tmp_path):
    """A setsid'd grandchild of the first test process SIGKILLs every later test process
    before it says hello: the restarts of this job and the next job's process. It is killed
    before each start (the supervisor is a child subreaper), so every case is the
    submission's own crash, the next job is graded normally and nothing outlives grading."""
    pid_file = tmp_path / "killer.pid"
    report = grade_with_honest_after("import time\n" + KILLER.format(pid_file=str(pid_file)))
    assert report.reward == 0.0 and report.load_error is None
    assert [o.status for o in report.outcomes] == ["crash"] * 6
    assert {o.detail for o in report.outcomes} == {"the test process died (exit code 1)"}
    killer = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):
        os.kill(killer, 0)


def test_a_restarted_test_process_that_never_starts_is_that_cases_crash(tmp_path):
    """Whatever makes a restarted test process die before it says hello (here: every test
    process after the solution has loaded once kills itself first), it is the job's
    crash, not a harness error: the job's own code ran in this exec before."""
    mark = tmp_path / "loaded"
    die_after_first_load = f"import os\nif os.path.exists({str(mark)!r}):\n    os.kill(os.getpid(), 9)\n"
    code = f"open({str(mark)!r}, 'w').close()\nimport os\n" + BELOW_ZERO + "    os._exit(1)\n"
    jobs, (events, harness_error), result = run_supervisor(
        [("HumanEval/3", code)], timeout_s=3.0, child_prefix=die_after_first_load)
    assert harness_error is None, harness_error
    report = _complete_report(jobs[0], events[0], result)
    assert [o.status for o in report.outcomes] == ["crash"] * 6
    assert report.outcomes[1].detail == "the restarted test process never started (killed by signal SIGKILL)"


def test_a_failure_before_any_submitted_code_ran_stays_a_harness_error():
    jobs, (events, harness_error), _ = run_supervisor(
        [("HumanEval/3", HONEST_BELOW_ZERO)], child_prefix="import os\nos.kill(os.getpid(), 9)\n")
    assert harness_error is not None and "never started (killed by signal SIGKILL)" in harness_error
    assert not events[0].done


# -- the case's time limit covers the judge's own work on a result -------------------------

def test_a_forged_reply_that_is_slow_to_rebuild_is_the_cases_timeout():
    """A set of 10,000 integers whose hashes all collide (k * (2**61 - 1)) takes seconds to
    rebuild (quadratic); the case's 0.5 s limit covers the rebuilding."""
    forge = (
        "import sys\n" + BELOW_ZERO
        + "    f = sys._getframe(1)\n"
        + "    f.f_locals['send']('result', f.f_locals['call_id'], "
        + "{'s': [k * (2 ** 61 - 1) for k in range(10000)]})\n"
        + "    return False\n"
    )
    report = grade_with_honest_after(forge, timeout_s=0.5)
    assert report.outcomes[0].status == "timeout", report.outcomes
    assert report.outcomes[0].detail == "took more than 0.5 s"
    assert report.reward == 0.0


GUARD_SCRIPT = '''
import sys
{guard}
class Late(BaseException):
    pass
clock = CaseClock([], lambda s: 2 * s + 1, Late)
clock.install()
clock.start(0.2)
exec(compile({work!r}, "<test>", "exec"))
print("not interrupted")
'''


def test_the_case_clock_interrupts_test_code_and_ends_a_stuck_builtin_by_sigprof():
    source = importlib.resources.files("environments.humaneval").joinpath("harness", "guard.py").read_text()
    # Python-level test code: SIGALRM raises the phase's timeout in it
    loop = subprocess.run([sys.executable, "-I", "-c", GUARD_SCRIPT.format(guard=source, work="while True:\n    pass\n")],
                          capture_output=True, text=True, timeout=60)
    assert loop.returncode == 1 and "Late" in loop.stderr.splitlines()[-1]
    # one builtin call that runs for minutes: no handler can run; SIGPROF ends the process
    stuck = subprocess.run([sys.executable, "-I", "-c", GUARD_SCRIPT.format(guard=source, work="sum(range(10 ** 12))\n")],
                           capture_output=True, text=True, timeout=60)
    assert stuck.returncode == -signal.SIGPROF
    # the host scores the case that was running when the sandbox reports that death
    job = _Job(get_task("HumanEval/3"), split_check(get_task("HumanEval/3").test), HONEST_BELOW_ZERO)
    for exit_code in (128 + signal.SIGPROF, -signal.SIGPROF):
        ev = _JobEvents(outcomes={0: ("pass", ""), 1: ("pass", "")}, begun=2, attempted=True)
        report = _killed_report(job, ev, ExecResult(("python3",), exit_code, "", "", 1.0))
        assert [o.status for o in report.outcomes] == ["pass", "pass", "timeout", "not_run", "not_run", "not_run"]
