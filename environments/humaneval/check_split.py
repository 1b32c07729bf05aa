"""Splitting a HumanEval ``check(candidate)`` into separately graded test cases with
``ast`` (see ``environments.humaneval`` for the rules)."""

from __future__ import annotations

import ast
import functools
import textwrap
from dataclasses import dataclass
from typing import Any

from agentrl.errors import RewardError
from environments.humaneval.tasks import get_task

__all__ = ["CheckProgram", "split_check", "check_program"]

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


def split_check(test_source: str, *, label: str = "test", max_cases: int | None = None) -> CheckProgram:
    """Split the ``check(candidate)`` of a HumanEval test module into test cases.

    Every top-level statement of ``check`` containing an ``assert`` is one case, except
    constant asserts (``assert True``); the other statements are setup, kept in place (see
    the module docstring). When there is no case, the whole body is one case. Module-level code
    besides ``check`` (e.g. ``METADATA = {...}``) is kept as is.

    Args:
        test_source: the task's ``test`` field.
        label: name used in error messages (e.g. the task id).
        max_cases: keep only the first ``max_cases`` test cases (later ones are dropped; the
            setup statements stay); ``None``: all.

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
    if max_cases is not None and len(cases) > max_cases:
        dropped = {id(stmt) for stmt in cases[max_cases:]}
        check.body = [stmt for stmt in check.body if id(stmt) not in dropped]
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
def check_program(task_id: str) -> CheckProgram:
    """The instrumented test module of ``task_id`` (computed once per process)."""
    task = get_task(task_id)
    return split_check(task.test, label=task_id)
