"""The in-sandbox grading supervisor (environments/humaneval/harness/supervisor.py), loaded
from the package data exactly as ``score_solutions`` ships it. ``ChildMessages`` (the
protocol a test process must keep) is driven directly, message by message; ``Supervisor``
runs here on the host with the real child script on trusted code (the dataset's
canonical solutions), so what it streams can be read back by the host-side parser."""

from __future__ import annotations

import io
import json
import sys
import types

import pytest

from agentrl.types import ExecResult
from environments.humaneval import get_task, split_check
from environments.humaneval.scoring import _complete_report, _Job, _parse_events, harness_scripts

TOKEN = "t" * 32


def load(source: str, name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(compile(source, f"<{name}>", "exec"), module.__dict__)
    return module


SUPERVISOR = load(harness_scripts()[0], "harness_supervisor")


def test_the_harness_scripts_import_only_the_standard_library():
    for source in harness_scripts():
        for line in source.splitlines():
            if line.startswith(("import ", "from ")):
                top = line.split()[1].split(".")[0]
                assert top in sys.stdlib_module_names, line


class Session:
    """A ChildMessages for 3 cases from ``start``, recording what it emits and records."""

    def __init__(self, start: int = 0, results=None) -> None:
        self.events: list[tuple] = []
        self.recorded: list[tuple] = []
        self.results = results if results is not None else [None, None, None]
        self.msgs = SUPERVISOR.ChildMessages(TOKEN, 3, start, self.results, self.emit, self.record, lambda t: str(t)[:20])

    def emit(self, *event):
        self.events.append(event)

    def record(self, k, status, detail):
        self.results[k] = status
        self.recorded.append((k, status, detail))

    def send(self, *msg, token: str = TOKEN):
        return self.msgs.feed((json.dumps([token, *msg]) + "\n").encode())


def test_a_well_behaved_child_reports_every_case_then_done():
    s = Session()
    for msg in (("hello",), ("ready",), ("begin", 0), ("pass", 0), ("begin", 1), ("fail", 1, "AssertionError"),
                ("begin", 2), ("pass", 2)):
        assert s.send(*msg) is None
    assert s.send("done") == "done"
    assert s.events == [("begin", 0), ("begin", 1), ("begin", 2)]
    assert s.recorded == [(0, "pass", ""), (1, "fail", "AssertionError"), (2, "pass", "")]
    assert s.msgs.hello and s.msgs.ready and s.msgs.current is None


def test_messages_split_across_reads_are_joined_at_newlines():
    s = Session()
    data = "".join(json.dumps([TOKEN, *m]) + "\n" for m in (("hello",), ("ready",), ("begin", 0)))
    for i in range(0, len(data), 7):
        assert s.msgs.feed(data[i:i + 7].encode()) is None
    assert s.msgs.current == 0  # begun, not finished: a timeout now blames case 0


@pytest.mark.parametrize("script, why", [
    ([("ready",)], "ready before hello"),
    ([("hello",), ("hello",)], "hello twice"),
    ([("hello",), ("begin", 0)], "a case before ready"),
    ([("hello",), ("ready",), ("ready",)], "ready twice"),
    ([("hello",), ("ready",), ("loaderr", "x")], "loaderr after ready"),
    ([("hello",), ("ready",), ("begin", 0), ("begin", 1)], "two cases at once"),
    ([("hello",), ("ready",), ("begin", 3)], "a case out of range"),
    ([("hello",), ("ready",), ("begin", True)], "a bool is not a case index"),
    ([("hello",), ("ready",), ("begin", 0), ("pass", 1)], "a result for a case not begun"),
    ([("hello",), ("ready",), ("begin", 0), ("pass", 0), ("begin", 0)], "a case twice"),
    ([("hello",), ("ready",), ("begin", 0), ("done",)], "done inside a case"),
    ([("hello",), ("ready",), ("cheer",)], "an unknown kind"),
])
def test_a_child_that_breaks_the_protocol_is_a_violation(script, why):
    s = Session()
    verdicts = [s.send(*m) for m in script]
    assert verdicts[-1] == "violation" and all(v is None for v in verdicts[:-1]), why


def test_a_wrong_token_garbage_or_an_endless_line_is_a_violation():
    assert Session().send("hello", token="forged") == "violation"
    assert Session().msgs.feed(b"not json\n") == "violation"
    assert Session().msgs.feed(b"\xff\xfe\n") == "violation"
    assert Session().msgs.feed(b"x" * (SUPERVISOR.MAX_BUFFERED_BYTES + 1)) == "violation"


def test_a_restarted_child_may_begin_only_after_the_cases_already_judged():
    s = Session(start=2, results=["pass", "crash", None])
    s.send("hello")
    s.send("ready")
    assert s.send("begin", 1) == "violation"
    s = Session(start=2, results=["pass", "crash", None])
    s.send("hello")
    s.send("ready")
    assert s.send("begin", 2) is None


def test_load_and_check_errors_and_internal_failures_end_reading_with_their_detail():
    s = Session()
    s.send("hello")
    assert s.send("loaderr", "SyntaxError: invalid syntax (line 3)") == "loaderr"
    assert s.msgs.detail == "SyntaxError: invalid" and not s.msgs.ready  # clipped
    s = Session()
    s.send("hello")
    s.send("ready")
    assert s.send("checkerr", "NameError: x") == "checkerr" and s.msgs.detail == "NameError: x"
    s = Session()
    assert s.send("internal", "Traceback ...") == "internal" and s.msgs.detail == "Traceback ..."


def test_describe_exit_names_the_signal():
    assert SUPERVISOR.describe_exit(3) == "exit code 3"
    assert SUPERVISOR.describe_exit(-9) == "killed by signal SIGKILL"


def run_supervisor(items, timeout_s=5.0):
    """Supervisor.run on the host; returns what it streamed, as the sandbox's ExecResult."""
    supervisor, child = harness_scripts()
    jobs = [_Job(get_task(tid), split_check(get_task(tid).test, label=tid), code) for tid, code in items]
    nonce = "n" * 32
    payload = {"nonce": nonce, "child_source": child, "startup_timeout_s": 10.0, "max_failure_details": 20,
               "detail_chars": 200, "jobs": [
                   {"prompt": j.task.prompt, "solution": j.solution, "test_program": j.program.source,
                    "entry_point": j.task.entry_point, "n_tests": j.program.num_cases, "timeout_s": timeout_s,
                    "memory_mb": None} for j in jobs]}
    out = io.StringIO()
    SUPERVISOR.Supervisor(payload, out=out).run()
    result = ExecResult(("python3",), 0, out.getvalue(), "", 1.0)
    return jobs, _parse_events(result, nonce, jobs), result


def test_the_supervisor_grades_real_jobs_with_the_real_child():
    canonical = get_task("HumanEval/3").canonical_program
    wrong = "def below_zero(operations):\n    return False\n"
    hang = "def below_zero(operations):\n    while True:\n        pass\n"
    jobs, (events, harness_error), result = run_supervisor(
        [("HumanEval/3", canonical), ("HumanEval/3", wrong), ("HumanEval/3", "def nothing(:\n")])
    assert harness_error is None and result.stdout.rstrip().endswith('["done"]')
    reports = [_complete_report(j, ev, result) for j, ev in zip(jobs, events)]
    assert reports[0].reward == 1.0 and reports[0].attempts == 1
    assert reports[1].passed == 3 and reports[1].total == 6
    assert reports[2].load_error and "SyntaxError" in reports[2].load_error
    assert {o.status for o in reports[2].outcomes} == {"not_run"}
    jobs, (events, _), result = run_supervisor([("HumanEval/3", hang)], timeout_s=0.5)
    report = _complete_report(jobs[0], events[0], result)
    # every case hangs: each one times out in its own fresh child
    assert [o.status for o in report.outcomes] == ["timeout"] * 6 and report.attempts == 6
