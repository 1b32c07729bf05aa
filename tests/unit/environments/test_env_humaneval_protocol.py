"""The host side of the grading protocol: reading the supervisor's event lines
(environments/humaneval/scoring.py ``_parse_events`` and the report builders). The supervisor itself
runs in the real sandbox in tests/integration/environments; here its output is given as
``ExecResult`` values, to pin how malformed or missing output is judged."""

from __future__ import annotations

import json

import pytest

from agentrl.errors import RewardError
from agentrl.types import ExecResult
from environments.humaneval import get_task, split_check
from environments.humaneval.scoring import _complete_report, _Job, _killed_report, _parse_events

NONCE = "ab" * 16


def job(task_id: str = "HumanEval/3") -> _Job:
    task = get_task(task_id)
    return _Job(task, split_check(task.test, label=task_id), "def below_zero(x):\n    return False\n")


def result(*events, other: str = "", exit_code: int = 0) -> ExecResult:
    lines = [f"{NONCE} {json.dumps(list(e))}" for e in events]
    return ExecResult(("python3",), exit_code, other + "\n".join(lines) + "\n", "", 0.1)


def full_job_events(j=0, statuses=("pass", "pass", "fail", "pass", "fail", "fail")):
    events = [("attempt", j, 0)]
    for k, st in enumerate(statuses):
        events += [("begin", j, k), ("case", j, k, st, "AssertionError" if st != "pass" else "")]
    return events + [("job_done", j, 1, 0.02)]


def test_complete_job_is_reported_case_by_case():
    res = result(*full_job_events(), ("done",))
    [ev], err = _parse_events(res, NONCE, [job()])
    assert err is None and ev.done
    report = _complete_report(job(), ev, res)
    assert (report.passed, report.total, report.reward) == (3, 6, 0.5)
    assert report.outcomes[2].source == "assert candidate([1, 2, -4, 5, 6]) == True"


def test_lines_without_the_nonce_are_ignored():
    forged = '0000 ["case", 0, 2, "pass", ""]\n["case", 0, 2, "pass", ""]\n'
    res = result(*full_job_events(), ("done",), other=forged)
    [ev], _ = _parse_events(res, NONCE, [job()])
    assert ev.outcomes[2] == ("fail", "AssertionError")


@pytest.mark.parametrize(
    "bad_line",
    [
        f"{NONCE} not json",
        f"{NONCE} " + json.dumps(["case", 0, 9, "pass", ""]),  # case index out of range
        f"{NONCE} " + json.dumps(["case", 0, 1, "great", ""]),  # unknown status
        f"{NONCE} " + json.dumps(["case", 5, 1, "pass", ""]),  # unknown job
        f"{NONCE} " + json.dumps(["teleport", 0]),
    ],
)
def test_malformed_event_is_a_reward_error(bad_line):
    res = ExecResult(("python3",), 0, bad_line + "\n", "", 0.1)
    with pytest.raises(RewardError, match="malformed event"):
        _parse_events(res, NONCE, [job()])


def test_missing_cases_in_a_finished_job_are_a_reward_error():
    events = full_job_events()
    del events[3:5]  # drop case 1
    res = result(*events, ("done",))
    [ev], _ = _parse_events(res, NONCE, [job()])
    with pytest.raises(RewardError, match="reported 5 of 6 test cases"):
        _complete_report(job(), ev, res)


def test_harness_error_is_returned_for_the_caller_to_raise():
    res = result(("attempt", 0, 0), ("harness_error", "Traceback ... OSError: [Errno 11]"))
    [ev], err = _parse_events(res, NONCE, [job()])
    assert "Errno 11" in err and not ev.done


def test_killed_while_a_case_ran_blames_that_case():
    events = full_job_events()[:5] + [("begin", 0, 2)]  # cases 0, 1 done, case 2 running
    res = result(*events, exit_code=137)
    [ev], _ = _parse_events(res, NONCE, [job()])
    report = _killed_report(job(), ev, res)
    assert [o.status for o in report.outcomes] == ["pass", "pass", "crash", "not_run", "not_run", "not_run"]
    assert "killed while the solution ran (exit code 137)" in report.outcomes[2].detail
    assert report.load_error is None and report.reward == pytest.approx(2 / 6)


def test_killed_while_loading_is_a_load_failure():
    res = result(("attempt", 0, 0), exit_code=137)
    [ev], _ = _parse_events(res, NONCE, [job()])
    report = _killed_report(job(), ev, res)
    assert report.reward == 0.0 and "killed" in report.load_error
