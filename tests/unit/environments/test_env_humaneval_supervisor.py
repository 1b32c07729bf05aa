"""The in-sandbox grading supervisor (environments/humaneval/harness/supervisor.py), loaded
from the package data exactly as ``score_solutions`` ships it. ``LineReader`` (how a test
process's messages are read) and the value codec are driven directly; ``Supervisor`` runs
here on the host with the real child script, so what it streams can be read back by the
host-side parser. Hostile submissions run here too: the judge's verdict must not depend
on anything the submission's process does (the same cases run in the real sandbox in
tests/integration/environments)."""

from __future__ import annotations

import json
import subprocess
import sys
import time
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


def feed(*lines: str, token: str = TOKEN) -> list:
    reader = SUPERVISOR.LineReader(token)
    return reader.feed("".join(lines).encode())


def msg(*parts, token: str = TOKEN) -> str:
    return json.dumps([token, *parts]) + "\n"


def test_the_line_reader_returns_each_message_without_its_token():
    assert feed(msg("hello"), msg("ready"), msg("result", 0, {"l": [1, 2]})) == [
        ["hello"], ["ready"], ["result", 0, {"l": [1, 2]}]]


def test_messages_split_across_reads_are_joined_at_newlines():
    reader = SUPERVISOR.LineReader(TOKEN)
    data = (msg("hello") + msg("ready") + msg("raise", 0, "ValueError: x", False)).encode()
    got = []
    for i in range(0, len(data), 7):
        got += reader.feed(data[i:i + 7])
    assert got == [["hello"], ["ready"], ["raise", 0, "ValueError: x", False]]


@pytest.mark.parametrize("data, why", [
    (msg("hello", token="forged"), "a wrong token"),
    ("not json\n", "garbage"),
    ('"a string"\n', "not a list"),
    (json.dumps([TOKEN]) + "\n", "no kind"),
    (json.dumps([TOKEN, 3]) + "\n", "a kind that is not a string"),
])
def test_a_line_that_is_not_a_message_is_a_violation(data, why):
    with pytest.raises(SUPERVISOR.Violation):
        feed(data)


def test_invalid_utf8_or_an_endless_line_is_a_violation():
    with pytest.raises(SUPERVISOR.Violation):
        SUPERVISOR.LineReader(TOKEN).feed(b"\xff\xfe\n")
    with pytest.raises(SUPERVISOR.Violation):
        SUPERVISOR.LineReader(TOKEN).feed(b"x" * (SUPERVISOR.MAX_BUFFERED_BYTES + 1))


def test_describe_exit_names_the_signal():
    assert SUPERVISOR.describe_exit(3) == "exit code 3"
    assert SUPERVISOR.describe_exit(-9) == "killed by signal SIGKILL"


def run_supervisor(items, timeout_s=5.0, child_prefix=""):
    """The supervisor script on the host, in its own process as in the sandbox (``python3
    -I -c``: it becomes a child subreaper and takes SIGALRM/SIGPROF, which must not reach
    pytest's process); returns what it streamed, as the sandbox's ExecResult.
    ``child_prefix``: code run at the top of every test process (before it says hello)."""
    supervisor, child = harness_scripts()
    child = child_prefix + child
    jobs = [_Job(get_task(tid), split_check(get_task(tid).test, label=tid), code) for tid, code in items]
    nonce = "n" * 32
    payload = {"nonce": nonce, "child_source": child, "startup_timeout_s": 10.0, "max_failure_details": 20,
               "detail_chars": 200, "jobs": [
                   {"prompt": j.task.prompt, "solution": j.solution, "test_program": j.program.source,
                    "entry_point": j.task.entry_point, "n_tests": j.program.num_cases, "timeout_s": timeout_s,
                    "memory_mb": None} for j in jobs]}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-I", "-c", supervisor], input=json.dumps(payload),
                          capture_output=True, text=True, timeout=600)
    result = ExecResult(("python3",), proc.returncode, proc.stdout, proc.stderr, time.monotonic() - t0)
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
