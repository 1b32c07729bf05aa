"""HumanEval tasks, the train/test split, and splitting ``check`` into test cases
(environments/humaneval/tasks.py, check_split.py). The instrumented check code is executed here in-process with
the dataset's own canonical solutions (trusted code); the sandboxed harness is tested in
tests/integration/environments."""

from __future__ import annotations

import pytest

from agentrl.errors import ConfigError, RewardError
from environments.humaneval import (
    HumanEvalEnv,
    get_task,
    load_tasks,
    split_check,
    task_ids,
)

# Test cases per task, read off the dataset's check() functions: one per top-level assert,
# one per top-level loop that asserts.
EXPECTED_CASES = {
    "HumanEval/0": 7,  # seven plain asserts (module-level METADATA kept)
    "HumanEval/3": 6,
    "HumanEval/31": 13,
    "HumanEval/32": 1,  # imports + rng setup, then one loop of 100 random asserts
    "HumanEval/38": 1,  # local variable named `str` inside a loop
    "HumanEval/44": 7,  # six asserts + one `for x in range(2, 8): assert ...`
    "HumanEval/50": 1,
    "HumanEval/53": 6,  # five asserts + one loop of 100 random asserts
    "HumanEval/129": 11,  # a bare `print` statement is setup
    "HumanEval/151": 7,  # setup assignments between the 6th and 7th assert
    "HumanEval/160": 3,  # its fourth assert is `assert True, "..."`: tests nothing, not a case
    "HumanEval/66": 8,  # 10 asserts, two of them `assert True`
}


def test_dataset_has_164_tasks_and_the_documented_split():
    assert len(load_tasks()) == 164
    train, test, every = task_ids("train"), task_ids("test"), task_ids("all")
    assert (len(train), len(test), len(every)) == (131, 33, 164)
    assert set(train).isdisjoint(test) and set(train) | set(test) == set(every)
    assert all(int(t.split("/")[1]) % 5 == 0 for t in test)
    assert test[:3] == ["HumanEval/0", "HumanEval/5", "HumanEval/10"]
    assert HumanEvalEnv.task_ids("test") == test


def test_unknown_split_and_task_id_are_config_errors():
    with pytest.raises(ConfigError, match=r"split='validation' is not a HumanEval split"):
        task_ids("validation")
    with pytest.raises(ConfigError, match=r"task_id='HumanEval/999' is not a HumanEval task"):
        get_task("HumanEval/999")


@pytest.mark.parametrize("task_id,n_cases", sorted(EXPECTED_CASES.items()))
def test_case_counts_on_real_problems(task_id, n_cases):
    program = split_check(get_task(task_id).test, label=task_id)
    assert program.num_cases == n_cases
    assert not program.whole_check
    assert all("assert" in src for src in program.case_sources)


def test_every_task_splits_and_loops_stay_one_case():
    programs = {tid: split_check(get_task(tid).test, label=tid) for tid in task_ids("all")}
    assert all(p.num_cases >= 1 and not p.whole_check for p in programs.values())
    assert programs["HumanEval/44"].case_sources[-1] == (
        "for x in range(2, 8):\n    assert candidate(x, x + 1) == str(x)"
    )
    assert not any(
        src.startswith("assert True") for p in programs.values() for src in p.case_sources
    )
    # The split rule over the whole dataset (pinned so a change to it is noticed).
    assert sum(p.num_cases for p in programs.values()) == 1133


class Recorder:
    """The ``report`` callable the harness child passes to the instrumented check."""

    def __init__(self) -> None:
        self.events: list[tuple] = []

    def __call__(self, kind, index=None, detail=None):
        self.events.append((kind, index) if detail is None else (kind, index, type(detail).__name__))

    def verdicts(self) -> dict[int, str]:
        return {e[1]: e[0] for e in self.events if e[0] in ("pass", "fail")}


def run_instrumented(task_id: str, solution: str, start: int = 0) -> Recorder:
    task = get_task(task_id)
    program = split_check(task.test, label=task_id)
    ns: dict = {"__name__": "__solution__"}
    exec(compile(task.prompt, "<prompt>", "exec"), ns)
    exec(compile(solution, "<solution>", "exec"), ns)
    exec(compile(program.source, "<test>", "exec"), ns)
    rec = Recorder()
    ns["__agentrl_check__"](ns[task.entry_point], rec, start)
    return rec


@pytest.mark.parametrize("task_id", sorted(EXPECTED_CASES))
def test_canonical_solution_passes_every_case_in_process(task_id):
    task = get_task(task_id)
    rec = run_instrumented(task_id, task.canonical_program)
    n = EXPECTED_CASES[task_id]
    assert rec.verdicts() == {k: "pass" for k in range(n)}
    # Each case is announced before it runs, in order.
    assert [e for e in rec.events if e[0] == "begin"] == [("begin", k) for k in range(n)]


def test_wrong_solution_fails_some_cases_and_keeps_going():
    # below_zero (HumanEval/3) answered with "always False": the cases expecting False pass.
    rec = run_instrumented("HumanEval/3", "def below_zero(operations):\n    return False\n")
    verdicts = rec.verdicts()
    assert len(verdicts) == 6
    assert 0 < list(verdicts.values()).count("pass") < 6
    assert ("fail", 2, "AssertionError") in rec.events  # below_zero([1, 2, -4, 5, 6]) is True


def test_exceptions_of_any_kind_fail_only_their_case():
    solution = (
        "def sum_squares(lst):\n"
        "    if len(lst) == 2:\n"
        "        raise SystemExit(0)\n"  # an exit attempt inside one case
        "    import math\n"
        "    return sum(math.ceil(x) ** 2 for x in lst)\n"
    )
    # HumanEval/133 (sum_squares) has a case with a 2-element list; it fails, others pass.
    rec = run_instrumented("HumanEval/133", solution)
    failed = [e for e in rec.events if e[0] == "fail"]
    assert failed and all(e[2] == "SystemExit" for e in failed)
    assert "pass" in rec.verdicts().values()


def test_start_skips_earlier_cases_but_runs_setup():
    task = get_task("HumanEval/151")
    rec = run_instrumented("HumanEval/151", task.canonical_program, start=6)
    # Case 6 needs `lst`/`odd_sum`, set up by the statements before it.
    assert rec.events == [("begin", 6), ("pass", 6)]


def test_local_names_in_check_do_not_leak_into_the_solution_globals():
    # HumanEval/38's check binds a local named `str`; a candidate calling str() still works.
    solution = (
        "def decode_cyclic(s):\n"
        "    out = str()\n"
        "    return out + encode_cyclic(encode_cyclic(s))\n"
    )
    assert run_instrumented("HumanEval/38", solution).verdicts() == {0: "pass"}


def test_check_without_top_level_asserts_becomes_one_case():
    source = (
        "def check(candidate):\n"
        "    def helper(x):\n"
        "        assert candidate(x) == x\n"
        "    helper(1)\n"
        "    helper(2)\n"
    )
    program = split_check(source)
    assert program.whole_check and program.num_cases == 1
    ns: dict = {}
    exec(program.source, ns)
    rec = Recorder()
    ns["__agentrl_check__"](lambda x: x, rec, 0)
    assert rec.verdicts() == {0: "pass"}
    rec = Recorder()
    ns["__agentrl_check__"](lambda x: 1, rec, 0)
    assert rec.verdicts() == {0: "fail"}


def test_split_check_rejects_test_code_without_check():
    with pytest.raises(RewardError, match="expected exactly one top-level 'def check"):
        split_check("def test(candidate):\n    assert candidate()\n", label="X/1")
    with pytest.raises(RewardError, match="X/2: the test code does not parse"):
        split_check("def check(candidate:\n", label="X/2")
