"""``HumanEvalEnv``: the ``agentrl/HumanEval-v0`` environment (see ``environments.humaneval``
for the full protocol: actions, limits, grading, failures)."""

from __future__ import annotations

import json
import math
from types import MappingProxyType
from typing import Any, ClassVar, Hashable, Mapping, Sequence

from agentrl.errors import ConfigError, SandboxError, ToolParseError
from agentrl.types import ExecResult, StepInfo
from environments.core import TextEnv, clip_text
from environments.humaneval.scoring import score_solutions
from environments.humaneval.tasks import HumanEvalTask, get_task, task_ids
from environments.humaneval.visible import REWARD_TESTS
from environments.tools import FencedCodeParser, HermesToolParser, ToolCall, python_tool_schema
from sandboxes.base import Sandbox

__all__ = ["ENV_ID", "HumanEvalEnv"]

ENV_ID = "agentrl/HumanEval-v0"


class HumanEvalEnv(TextEnv):
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
        reward_tests: what a submission's reward is the pass fraction of: ``"hidden"`` (the
            default) the problem's full hidden ``check``, the benchmark's judge;
            ``"visible"`` the examples the prompt shows (``environments.humaneval.visible``;
            the first hidden case where it shows none), to train on while the eval judges
            on the hidden check (``judge_kwargs``). The prompt is the same either way, so
            eval episodes see what training episodes saw.

    Raises:
        ConfigError: an argument is out of range, or ``sandbox`` lacks the ``Sandbox``
            interface.
    """

    judge_kwargs: ClassVar[Mapping[str, Any]] = MappingProxyType({"reward_tests": "hidden"})
    """Constructor kwargs that make this env score as its evaluation judge (the full hidden
    check): ``agentrl eval`` and ``eval.every`` apply them over ``env.kwargs`` to every eval
    episode (``agentrl.driver.judge``), whatever reward the training used."""

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
        reward_tests: str = "hidden",
    ) -> None:
        super().__init__()
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
        if reward_tests not in REWARD_TESTS:
            raise ConfigError(f"reward_tests={reward_tests!r} must be one of {REWARD_TESTS}")
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
        self.reward_tests = reward_tests

        self.tools: list[dict[str, Any]] = [python_tool_schema()]
        self._tool_parser = HermesToolParser(self.tools)
        self._code_parser = FencedCodeParser()

        # Episode state (cleared by reset; TextEnv holds _task_id, _done, _closed).
        self._task: HumanEvalTask | None = None
        self._num_tool_calls = 0
        self._num_invalid_actions = 0
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
        task_id = self._start_reset(seed, options)
        task = get_task(task_id if task_id is not None else self._draw(self._split_ids))
        if self.clean_workdir_on_reset and self._workdir_dirty:
            self._clean_workdir()
            self._workdir_dirty = False
        self._task, self._task_id, self._done = task, task.task_id, False
        self._num_tool_calls = 0
        self._num_invalid_actions = 0
        # The system prompt already explains the tool and its call format in plain words, so
        # the rollout must not append a second, generated description of the schemas.
        info = self._info(
            system_prompt=self.system_prompt, system_prompt_describes_tools=True,
            tools=tuple(json.loads(json.dumps(t)) for t in self.tools) if self.max_tool_calls else (),
        )
        info["split"] = task.split
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
            ``load_error``, ``judge_tamper`` (test cases where the submission tried to get
            past the judge, ``ScoreReport.tamper``; they score as failures), ``solution``,
            ``reward_tests`` (what was graded).

        Raises:
            EnvError: no episode is running (before ``reset``, after it ended, after
                ``close``), or ``action`` is not a ``str``.
            RewardError: grading failed for a reason that is not the model's fault.
            SandboxError: the sandbox failed (never caught here).
        """
        self._check_step(action)
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
        super().close()

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

    def _info(self, *, tool_calls: Sequence[ToolCall] = (), **step_info: Any) -> dict[str, Any]:
        """``StepInfo(anchor=..., **step_info).to_info()`` plus this env's own keys."""
        assert self._task is not None
        anchor: Hashable = (self._task.task_id, self._num_tool_calls)
        if tool_calls:
            step_info.setdefault("tool_calls", len(tool_calls))  # StepInfo's count (Turn.tool_calls)
        return StepInfo(anchor=anchor, **step_info).to_info(
            task_id=self._task.task_id,
            tool_calls=list(tool_calls),
            num_tool_calls=self._num_tool_calls,
            num_invalid_actions=self._num_invalid_actions,
        )

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
        info = self._info(invalid_action=True)
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
        if not truncated and outputs:
            # the calls left go into the last tool message, so that a full-history prompt
            # (one tool message per output) shows the same words as the observation
            outputs[-1] += f"\n\n(Tool calls left: {self.max_tool_calls - self._num_tool_calls}.)"
        observation = "\n\n".join(outputs)
        if truncated:
            self._done = True
            note = (
                f"Tool call limit reached: {len(calls) - len(to_run)} call(s) not run "
                f"(at most {self.max_tool_calls} per task). The task is over."
            )
            observation = f"{observation}\n\n{note}" if observation else note
        info = self._info(tool_calls=calls, observation_role="tool", tool_outputs=tuple(outputs))
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
                lines.append(f"{name}:\n{clip_text(text, limit).rstrip(chr(10))}")
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
            tests=self.reward_tests,
        )[0]
        self._done = True
        lines = [f"Submission graded: {report.passed} of {report.total} tests passed."]
        if report.load_error:
            lines.append(f"The solution could not be loaded: {report.load_error}")
        for o in report.outcomes:
            if not o.passed and o.detail and not report.load_error:
                lines.append(f"- test {o.index + 1}: {o.status}: {o.detail}")
        if report.judge_tamper:
            lines.append(f"The judge refused {report.judge_tamper} attempt(s) to get past the tests "
                         f"(first: {report.tamper[0]}); those tests count as failed.")
        info = self._info(success=report.total > 0 and report.passed == report.total)
        info.update(
            tests_passed=report.passed,
            tests_total=report.total,
            test_results=[o.status for o in report.outcomes],
            load_error=report.load_error,
            judge_tamper=report.judge_tamper,
            solution=code,
            reward_tests=self.reward_tests,
        )
        return "\n".join(lines), float(report.reward), True, False, info
