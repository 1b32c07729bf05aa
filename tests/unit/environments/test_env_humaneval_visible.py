"""HumanEval's visible tests (environments/humaneval/visible.py): the prompt's examples (doctest
``>>>`` ones, or ``f(x) => y`` lines) as a test module, the fallback to the first hidden case, and the known wrong examples. The
instrumented code runs here in-process with the dataset's canonical solutions (trusted code),
as in test_env_humaneval_split.py; the sandboxed grading is in
tests/integration/environments/test_env_humaneval_sandboxed.py."""

from __future__ import annotations

import collections

import pytest

from agentrl.errors import ConfigError
from environments.humaneval import HumanEvalEnv, get_task, split_check, task_ids, visible_tests
from environments.humaneval.visible import (
    WRONG_DOCSTRING_EXAMPLES,
    _example_case,
    check_module_source,
    docstring_examples,
    graded_program,
)


UNUSABLE = {"HumanEval/80": (0, 1, 2, 3, 4, 5)}
"""Examples left out because they cannot be run as written (``is_happy(a)``: names, not strings)."""


def verdicts(task_id: str, solution: str, program) -> dict[int, str]:
    """Run ``program`` (a CheckProgram) on ``solution`` in-process: case index -> pass/fail."""
    task = get_task(task_id)
    ns: dict = {"__name__": "__solution__"}
    exec(compile(task.prompt, "<prompt>", "exec"), ns)
    exec(compile(solution, "<solution>", "exec"), ns)
    exec(compile(program.source, "<test>", "exec"), ns)
    events: list[tuple] = []
    ns["__agentrl_check__"](ns[task.entry_point], lambda kind, k=None, detail=None: events.append((kind, k)), 0)
    return {k: kind for kind, k in events if kind in ("pass", "fail")}


def test_counts_over_the_164_problems():
    tests = {tid: visible_tests(tid) for tid in task_ids("all")}
    by_source = collections.Counter(v.source for v in tests.values())
    assert by_source == {"docstring": 129, "first_hidden_case": 35}
    assert sum(v.program.num_cases for v in tests.values() if v.source == "docstring") == 357
    doctest_form = [tid for tid, v in tests.items() if v.source == "docstring" and ">>>" in get_task(tid).prompt]
    assert (len(doctest_form), sum(tests[t].program.num_cases for t in doctest_form)) == (75, 178)
    # a fallback is exactly one case: the hidden check's first
    for tid, v in tests.items():
        if v.source == "first_hidden_case":
            hidden = split_check(get_task(tid).test, label=tid)
            assert v.program.case_sources == hidden.case_sources[:1], tid
    # the wrong references and the unusable examples are skipped, nothing else is
    skipped = {tid: tuple(i for i, _ in v.skipped) for tid, v in tests.items() if v.skipped}
    assert skipped == {**WRONG_DOCSTRING_EXAMPLES, **UNUSABLE}


def test_doctest_examples_of_real_problems_become_asserts():
    v = visible_tests("HumanEval/0")
    assert v.source == "docstring"
    assert v.program.case_sources == (
        "assert (has_close_elements([1.0, 2.0, 3.0], 0.5)) == (False)",
        "assert (has_close_elements([1.0, 2.8, 3.0, 4.0, 5.0, 2.0], 0.3)) == (True)",
    )
    # an example with no output is doctest's None (HumanEval/12: longest([]))
    assert visible_tests("HumanEval/12").program.case_sources[0] == "assert (longest([])) is None"
    # a comparison written as a statement is an assert of it (HumanEval/108)
    assert visible_tests("HumanEval/108").program.case_sources[0] == "assert count_nums([]) == 0"
    # escapes inside examples are read from the prompt's source (HumanEval/51's docstring has
    # a literal newline once processed, which doctest cannot parse)
    assert "'abcdef\\nghijklm'" in visible_tests("HumanEval/51").program.case_sources[1]
    # a comment after the call (HumanEval/32) is dropped, the call kept
    assert visible_tests("HumanEval/32").program.case_sources[0] == "assert (round(find_zero([1, 2]), 2)) == (-0.5)"
    # the other form, one line each (HumanEval/66 "digitSum("abAB") => 131", HumanEval/77
    # "iscube(1) ==> True", HumanEval/79 with a comment after the call)
    assert visible_tests("HumanEval/66").program.case_sources[1] == "assert (digitSum('abAB')) == (131)"
    assert visible_tests("HumanEval/77").program.case_sources[0] == "assert (iscube(1)) == (True)"
    assert visible_tests("HumanEval/79").program.case_sources[0] == "assert (decimal_to_binary(15)) == ('db1111db')"
    # no example at all (HumanEval/41), results that are no literal (HumanEval/67:
    # "fruit_distribution(...) ->19 - 5 - 6 = 8"), or unquoted strings (HumanEval/80:
    # "is_happy(a) => False"): the first hidden case
    assert {visible_tests(f"HumanEval/{n}").source for n in (41, 67, 80)} == {"first_hidden_case"}


def test_canonical_solutions_pass_every_visible_case_and_fail_exactly_the_wrong_examples():
    for tid in task_ids("all"):
        task = get_task(tid)
        v = visible_tests(tid)
        assert verdicts(tid, task.canonical_program, v.program) == {k: "pass" for k in range(v.program.num_cases)}, tid
        for i, example in enumerate(docstring_examples(tid)):  # every example, none left out
            case = _example_case(example, task.entry_point)
            assert case is not None or tid in UNUSABLE, (tid, i, example.source)
            if case is None:
                continue
            program = split_check(check_module_source([case]))
            passed = verdicts(tid, task.canonical_program, program) == {0: "pass"}
            assert passed == (i not in WRONG_DOCSTRING_EXAMPLES.get(tid, ())), (tid, i, example.source)


def test_a_solution_fitted_to_the_examples_passes_them_and_fails_the_hidden_check():
    fitted = ("def has_close_elements(numbers, threshold):\n"
              "    return numbers == [1.0, 2.8, 3.0, 4.0, 5.0, 2.0]\n")
    assert set(verdicts("HumanEval/0", fitted, visible_tests("HumanEval/0").program).values()) == {"pass"}
    hidden = verdicts("HumanEval/0", fitted, graded_program("HumanEval/0", "hidden"))
    assert "fail" in hidden.values() and "pass" in hidden.values()


def test_bad_reward_tests_is_a_config_error():
    with pytest.raises(ConfigError, match=r"tests='public' is not a HumanEval test set; expected one of \('hidden', 'visible'\)"):
        graded_program("HumanEval/0", "public")
    assert dict(HumanEvalEnv.judge_kwargs) == {"reward_tests": "hidden"}
