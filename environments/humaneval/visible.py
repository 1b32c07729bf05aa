"""The *visible* tests of a HumanEval problem: the examples its prompt shows, as a test module
that the same hardened harness grades (``scoring.score_solutions(..., tests="visible")``).

Why: the issue's "judge kept apart from the training reward". HumanEval's hidden ``check``
is the benchmark's judge (Chen et al. 2021, arXiv:2107.03374, section 2); a policy trained
on the judge's own asserts is evaluated on what it was paid for. With
``HumanEvalEnv(reward_tests="visible")`` the training reward comes from the examples a
programmer reading the prompt sees, and the eval (``HumanEvalEnv.judge_kwargs``) still runs
the full hidden check.

Extraction (``visible_tests``), per problem:

1. ``docstring``: the entry point's docstring, read as it stands in the prompt's *source*
   (escape sequences such as ``\\n`` inside examples stay Python source, as a programmer
   reads them; HumanEval/51's processed docstring would not even parse), is parsed by the
   standard library's ``doctest.DocTestParser``. A docstring without ``>>>`` examples is read
   for the other form its authors used, one line each: ``entry_point(args) <sep> <literal>``
   with ``<sep>`` one of ``=>``, ``==>``, ``➞``, ``->``, ``→``, ``==``, "should return",
   "should be", "will return", "returns" (``_ARROW``). Each example becomes one test case:
   an example with an expected output ``want`` (a Python literal) is
   ``assert (source) == (want)``; a ``>>>`` one with no output is a comparison the author wrote as a statement
   (``>>> count_nums([]) == 0``, ``assert (source)``) or, for other expressions, doctest's
   own meaning: the value is ``None`` (``>>> longest([])``). Examples whose output is not
   a literal, that expect an exception, that are not expressions, or that name something
   other than the entry point and builtins (HumanEval/80's ``is_happy(a)`` means the
   string ``"a"``) are left out, and so are the examples the dataset's own canonical
   solution fails (``WRONG_DOCSTRING_EXAMPLES``: wrong references, which would pay for a
   wrong program and punish a right one).
2. ``first_hidden_case``: a problem with no usable example is trained on the first test
   case of its hidden ``check`` (with the check's setup statements), so every problem has a
   non-empty training reward. The remaining hidden cases stay unseen.

Counts on HumanEval 1.0.3 (pinned by ``tests/unit/environments/test_env_humaneval_visible.py``):
129 problems use their docstring examples (357 cases: 75 problems with ``>>>`` examples, 178
cases; 54 with the other form, 179 cases), 35 fall back to the first hidden case
(HumanEval/116 among them: all three of its examples are wrong; HumanEval/80: unquoted
strings).
"""

from __future__ import annotations

import ast
import builtins
import doctest
import functools
import inspect
import re
from dataclasses import dataclass
from typing import Literal

from agentrl.errors import ConfigError, RewardError
from environments.humaneval.check_split import CheckProgram, check_program, split_check
from environments.humaneval.tasks import HumanEvalTask, get_task

__all__ = ["RewardTests", "REWARD_TESTS", "VisibleTests", "WRONG_DOCSTRING_EXAMPLES", "docstring_examples",
           "graded_program", "visible_tests", "check_module_source"]

RewardTests = Literal["hidden", "visible"]
REWARD_TESTS: tuple[str, ...] = ("hidden", "visible")
"""What a HumanEval submission is graded on: the full hidden ``check`` or the visible tests."""

WRONG_DOCSTRING_EXAMPLES: dict[str, tuple[int, ...]] = {
    # median: ``median([-10, 4, 6, 1000, 10, 20])`` is 8.0 (the mean of 6 and 10), not the
    # docstring's 15.0; the hidden check agrees with 8.0.
    "HumanEval/47": (1,),
    # sort_array: the docstring's three examples disagree with the problem's own hidden check
    # and canonical solution (which sort by the number of ones, then by value); the third is
    # not even a comparison (``sort_array([1, 0, 2, 3, 4]) [0, 1, 2, 3, 4]``).
    "HumanEval/116": (0, 1, 2),
    # bf: ``bf("Earth", "Mercury") ==> ("Venus")`` is the string "Venus"; the function returns
    # the tuple ``("Venus",)``, as the hidden check expects.
    "HumanEval/148": (1,),
}
"""``task_id -> indices`` (0-based, in ``docstring_examples`` order) of docstring examples
that the dataset's canonical solution fails: wrong references, left out of the visible
tests. Found by running every canonical solution on every example; the unit test re-checks
that exactly these fail."""


@dataclass(frozen=True)
class VisibleTests:
    """The visible tests of one problem.

    Attributes:
        task_id: ``"HumanEval/N"``.
        source: ``"docstring"`` (the prompt's examples) or ``"first_hidden_case"`` (no
            usable example: the hidden check's first case).
        program: the instrumented test module (``CheckProgram``: one case per example),
            graded by the same harness as the hidden check.
        skipped: docstring examples left out (wrong references, unusable forms), as
            ``(index, source)`` pairs.
    """

    task_id: str
    source: Literal["docstring", "first_hidden_case"]
    program: CheckProgram
    skipped: tuple[tuple[int, str], ...] = ()


def _docstring_source(task: HumanEvalTask) -> str | None:
    """The entry point's docstring as written in the prompt's source (escapes not
    processed), cleaned of its indentation (``inspect.cleandoc``); None without one."""
    try:
        module = ast.parse(task.prompt)
    except SyntaxError as exc:
        raise RewardError(f"{task.task_id}: the prompt does not parse: {exc}") from exc
    fns = [n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == task.entry_point]
    if len(fns) != 1 or not fns[0].body:
        return None
    first = fns[0].body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value, str)):
        return None
    segment = ast.get_source_segment(task.prompt, first.value) or ""
    literal = segment.lstrip("rRuUbB")
    for quote in ('"""', "'''", '"', "'"):
        if literal.startswith(quote) and literal.endswith(quote) and len(literal) >= 2 * len(quote):
            return inspect.cleandoc(literal[len(quote):-len(quote)])
    return None


_ARROW = re.compile(r"\s*(==>|=>|➞|->|→|==|should return|should be|will return|returns)\s*")
"""What separates a call from its result in the docstrings' other example form
(``digitSum("abAB") => 131``, ``search([4, 1, 2, 2, 3, 1]) == 2``, ``iscube(1) ==> True``,
``decimal_to_binary(15)   # returns "db1111db"``: a comment before the result is dropped)."""


def _arrow_examples(doc: str, entry_point: str) -> list[doctest.Example]:
    """Lines ``entry_point(...) <separator> <literal>`` of ``doc`` (``_ARROW``), as examples."""
    out = []
    for line in doc.splitlines():
        text = line.strip()
        if not text.startswith(entry_point + "("):
            continue
        for m in _ARROW.finditer(text):
            call, want = text[: m.start()], text[m.end():].strip().rstrip(".,;").strip()
            try:
                ast.parse(call, mode="eval")
                ast.literal_eval(want)
            except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
                continue
            out.append(doctest.Example(call + "\n", want + "\n"))
            break
    return out


def docstring_examples(task_id: str) -> list[doctest.Example]:
    """The examples of ``task_id``'s entry-point docstring, read from its source text: the
    ``>>>`` examples (``doctest.DocTestParser``), or, where it has none, the lines of the
    form ``entry_point(args) <separator> <literal>`` (``_ARROW``: ``=>``, ``➞``, ``==`` ...);
    ``[]`` when there is neither.

    Raises:
        ConfigError: unknown task id.
    """
    task = get_task(task_id)
    doc = _docstring_source(task)
    if not doc:
        return []
    try:
        examples = doctest.DocTestParser().get_examples(doc, name=task_id)
    except ValueError:  # inconsistent indentation and the like: no parsable >>> example
        examples = []
    return examples or _arrow_examples(doc, task.entry_point)


_BUILTINS = frozenset(dir(builtins))


def _example_case(example: doctest.Example, entry_point: str) -> str | None:
    """The ``assert`` statement of one example (module docstring), or None if unusable (an
    expected exception, not an expression, an output that is not a literal, or a name that
    is neither the entry point nor a builtin: ``is_happy(a)`` means the string ``"a"``)."""
    src = example.source.strip()
    if example.exc_msg is not None:
        return None
    try:
        expr = ast.parse(src, mode="eval").body
    except SyntaxError:
        return None
    if any(isinstance(n, ast.Name) and n.id != entry_point and n.id not in _BUILTINS for n in ast.walk(expr)):
        return None
    call = ast.unparse(expr)  # comments after the call (HumanEval/32) dropped
    want = example.want.strip()
    if not want:
        return f"assert {call}" if isinstance(expr, ast.Compare) else f"assert ({call}) is None"
    try:
        ast.literal_eval(want)
        expected = ast.unparse(ast.parse(want, mode="eval").body)
    except (ValueError, SyntaxError, TypeError, MemoryError, RecursionError):
        return None
    return f"assert ({call}) == ({expected})"


def check_module_source(cases: list[str]) -> str:
    """A HumanEval-style test module: ``def check(candidate):`` with ``cases`` as its body
    (each an ``assert`` that calls the entry point by its name, as the examples do; the
    harness runs the module in the solution's namespace)."""
    body = "\n".join(f"    {c}" for c in cases) if cases else "    pass"
    return f"def check(candidate):\n{body}\n"


@functools.cache
def visible_tests(task_id: str) -> VisibleTests:
    """The visible tests of ``task_id`` (module docstring; computed once per process).

    Raises:
        ConfigError: unknown task id.
        RewardError: the dataset's prompt or check does not parse.
    """
    task = get_task(task_id)
    wrong = set(WRONG_DOCSTRING_EXAMPLES.get(task_id, ()))
    cases: list[str] = []
    skipped: list[tuple[int, str]] = []
    for i, example in enumerate(docstring_examples(task_id)):
        case = None if i in wrong else _example_case(example, task.entry_point)
        if case is None:
            skipped.append((i, example.source.strip()))
        else:
            cases.append(case)
    if cases:
        program = split_check(check_module_source(cases), label=f"{task_id} (visible tests)")
        return VisibleTests(task_id, "docstring", program, tuple(skipped))
    first = split_check(task.test, label=task_id, max_cases=1)
    return VisibleTests(task_id, "first_hidden_case", first, tuple(skipped))


def graded_program(task_id: str, tests: str) -> CheckProgram:
    """The test module a submission to ``task_id`` is graded on: ``tests="hidden"`` the full
    check (``check_program``), ``"visible"`` the visible tests (``visible_tests``).

    Raises:
        ConfigError: ``tests`` is neither, or an unknown task id.
    """
    if tests == "hidden":
        return check_program(task_id)
    if tests == "visible":
        return visible_tests(task_id).program
    raise ConfigError(f"tests={tests!r} is not a HumanEval test set; expected one of {REWARD_TESTS}")
