"""``agentrl/ShellTasks-v0``: do a small job on files with a ``bash`` tool in a sandbox; the
reward is what a checker finds in the sandbox afterwards, not what the model claims.

Tasks
    The 46 tasks of ``environments.shell_task_bank.TASKS``, written for agentrl: file
    management (15), text processing (21) and small programs (10). Each has a setup (files
    written into the sandbox's working directory at ``reset``, then an optional setup
    script), a prompt, checks and a reference solution. Ids are ``shell/<name>``.
    Fixed split by task id: ``test`` holds the ids with ``zlib.crc32(id) % 5 == 0``,
    ``train`` the others, ``all`` every task (``task_ids(split)``).

Actions and observations (text)
    1. One or more Hermes-style tool calls
       ``<tool_call>{"name": "bash", "arguments": {"command": "ls -la"}}</tool_call>``: each
       runs as ``bash -c`` in the working directory (``tool_timeout_s``); the observation
       (role ``tool``) shows exit code, stdout and stderr.
    2. A reply with no tool call: the model says it is done. The checks run; the episode
       terminates.
    3. A malformed tool call: an invalid action (observation role ``user`` says what is
       wrong); not terminated.

    The ``max_tool_calls + 1``-th tool call (not run) or the ``max_invalid_actions + 1``-th
    invalid action ends the episode with ``truncated=True``; the checks run then too, since
    the reward is the state of the sandbox.

Reward
    The fraction of the task's checks met (0/1 for one-check tasks), given on the step that
    ends the episode; every other step gives 0. All checks run in ONE sandbox exec
    (``bash -c``), each in a subshell with its output discarded, reporting through lines
    prefixed with a random per-grading nonce, so nothing the model left in files can
    forge a result. A grading exec that fails or prints malformed results raises
    ``RewardError`` (never a reward of 0); ``SandboxError`` propagates.

Anchor
    ``(task_id, digest)`` where ``digest`` is the first 16 hex digits of the SHA-256 of the
    tool commands run so far (``""`` at the start): tasks are deterministic, so the same
    commands from the same setup reach the same sandbox state (Feng et al. 2025, GiGPO,
    arXiv:2505.10978, "anchor states"). An invalid reply leaves it unchanged.

The sandbox is injected and owned by the caller: ``close()`` does not close it. ``reset``
empties the working directory (one exec) when anything ran in it since this env last set
it up, then writes the task's files.
"""

from __future__ import annotations

import hashlib
import json
import math
import secrets
import zlib
from typing import Any, Hashable

from agentrl.errors import ConfigError, EnvError, RewardError, SandboxError, ToolParseError
from agentrl.types import ExecResult, StepInfo
from environments.core import TextEnv, clip_text, invalid_reply_step
from environments.shell_task_bank import TASKS, ShellTask
from environments.tools import HermesToolParser, ToolCall
from sandboxes.base import Sandbox

__all__ = ["ENV_ID", "SPLITS", "ShellTasksEnv", "task_ids", "get_task", "bash_tool_schema", "grade"]

ENV_ID = "agentrl/ShellTasks-v0"
SPLITS = ("train", "test", "all")
_BY_ID = {t.task_id: t for t in TASKS}


def _split_of(task_id: str) -> str:
    return "test" if zlib.crc32(task_id.encode()) % 5 == 0 else "train"


def task_ids(split: str = "train") -> list[str]:
    """Task ids of ``split`` (``train``, ``test`` or ``all``), in bank order.

    Raises:
        ConfigError: unknown split.
    """
    if split not in SPLITS:
        raise ConfigError(f"split={split!r} is not one of {SPLITS}")
    return [t.task_id for t in TASKS if split == "all" or _split_of(t.task_id) == split]


def get_task(task_id: str) -> ShellTask:
    """The task ``task_id``. Raises ConfigError naming it when unknown."""
    try:
        return _BY_ID[task_id]
    except KeyError:
        raise ConfigError(f"task_id={task_id!r} is not a ShellTasks task; e.g. {TASKS[0].task_id!r}") from None


def bash_tool_schema() -> dict[str, Any]:
    """The OpenAI-style schema of the ``bash`` tool (one required string ``command``)."""
    return {
        "type": "function",
        "function": {
            "name": "bash",
            "description": "Run a bash command in the task's working directory (no network) "
                           "and return its exit code, stdout and stderr.",
            "parameters": {
                "type": "object",
                "properties": {"command": {"type": "string", "description": "The bash command(s) to run."}},
                "required": ["command"],
                "additionalProperties": False,
            },
        },
    }


def grade(sandbox: Sandbox, task: ShellTask, *, timeout_s: float = 30.0) -> list[bool]:
    """Run ``task``'s checks in ``sandbox`` (one exec); one bool per check, in order.

    Raises:
        RewardError: the grading script timed out or its output is malformed.
        SandboxError: the sandbox failed.
    """
    nonce = secrets.token_hex(16)
    lines = []
    for k, check in enumerate(task.checks):
        lines.append(f"if ( {check.command}\n) </dev/null >/dev/null 2>&1; then echo '{nonce} {k} 1'; else echo '{nonce} {k} 0'; fi")
    result = sandbox.exec(["bash", "-c", "\n".join(lines)], timeout_s=timeout_s)
    if result.timed_out:
        raise RewardError(f"grading {task.task_id} timed out after {timeout_s:g} s")
    found: dict[int, bool] = {}
    for line in result.stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == nonce and parts[1].isdigit() and parts[2] in ("0", "1"):
            found[int(parts[1])] = parts[2] == "1"
    if sorted(found) != list(range(len(task.checks))):
        raise RewardError(
            f"grading {task.task_id}: expected {len(task.checks)} check results, got {sorted(found)} "
            f"(exit code {result.exit_code}, stderr {result.stderr[-300:]!r})"
        )
    return [found[k] for k in range(len(task.checks))]


class ShellTasksEnv(TextEnv):
    """Shell tasks with a ``bash`` tool; see the module docstring for the protocol.

    Args:
        sandbox: where commands and checks run (needs bash, coreutils, python3). Owned by
            the caller.
        split: the tasks ``reset`` draws from when ``options`` names none.
        max_tool_calls: tool calls per episode; one more ends it (truncated). Default 10.
        tool_timeout_s: wall seconds per tool call. Default 10.
        max_invalid_actions: invalid replies tolerated; one more ends it. Default 3.
        tool_output_limit_chars: characters per stream shown to the model. Default 4000.

    Raises:
        ConfigError: an argument is out of range or ``sandbox`` lacks the interface.
    """

    def __init__(self, sandbox: Sandbox, split: str = "train", max_tool_calls: int = 10,
                 tool_timeout_s: float = 10.0, max_invalid_actions: int = 3,
                 tool_output_limit_chars: int = 4000) -> None:
        super().__init__()
        if not isinstance(sandbox, Sandbox):
            raise ConfigError(f"sandbox={sandbox!r} does not implement sandboxes.base.Sandbox")
        self._split_ids = self.task_ids(split)
        for name, value in (("max_tool_calls", max_tool_calls), ("max_invalid_actions", max_invalid_actions)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise ConfigError(f"{name}={value!r} must be an int >= 0")
        if not (isinstance(tool_timeout_s, (int, float)) and math.isfinite(tool_timeout_s) and tool_timeout_s > 0):
            raise ConfigError(f"tool_timeout_s={tool_timeout_s!r} must be a positive number of seconds")
        if not isinstance(tool_output_limit_chars, int) or tool_output_limit_chars < 100:
            raise ConfigError(f"tool_output_limit_chars={tool_output_limit_chars!r} must be an int >= 100")
        self.sandbox = sandbox
        self.split = split
        self.max_tool_calls = max_tool_calls
        self.tool_timeout_s = float(tool_timeout_s)
        self.max_invalid_actions = max_invalid_actions
        self.tool_output_limit_chars = tool_output_limit_chars
        self.tools = [bash_tool_schema()]
        self._parser = HermesToolParser(self.tools)
        self._task: ShellTask | None = None
        self._dirty = False
        self._history = hashlib.sha256()
        self._num_tool_calls = 0
        self._num_invalid_actions = 0

    @classmethod
    def task_ids(cls, split: str = "train") -> list[str]:
        return task_ids(split)

    @classmethod
    def get_task(cls, task_id: str) -> ShellTask:
        """The task ``task_id`` (a subclass with other tasks overrides this, ``task_ids`` and
        ``split_of``). Raises ConfigError naming it when unknown."""
        return get_task(task_id)

    @classmethod
    def split_of(cls, task_id: str) -> str:
        """``train`` or ``test``: the split ``task_id`` belongs to."""
        return _split_of(task_id)

    @classmethod
    def checker_actions(cls) -> list[str]:
        """For ``check_env``: a command, a malformed call, then "done"."""
        return [
            '<tool_call>{"name": "bash", "arguments": {"command": "ls -R | head -n 20"}}</tool_call>',
            '<tool_call>{"name": "bash", "arguments": {}}</tool_call>',
            "I am done.",
        ]

    @property
    def task(self) -> ShellTask | None:
        return self._task

    @property
    def system_prompt(self) -> str:
        return (
            "You are a careful Linux user working in a sandbox with no network. You have one "
            "tool, `bash`: it runs a command in the task's working directory and shows you "
            f"its exit code, stdout and stderr (at most {self.tool_timeout_s:g} seconds per "
            f"call, {self.max_tool_calls} calls per task). Call it exactly like this:\n"
            "<tool_call>\n"
            '{"name": "bash", "arguments": {"command": "ls -la"}}\n'
            "</tool_call>\n"
            "Results come back in the next message. When the task is done, reply with a short "
            "summary and no tool call: the files in the working directory are then checked."
        )

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Set up a task. ``options={"task_id": ...}`` chooses it; otherwise one is drawn
        from the split with ``self.np_random``.

        Returns:
            ``(prompt, info)`` with ``task_id``, ``split``, ``category``, ``system_prompt``,
            ``system_prompt_describes_tools`` (True), ``tools``, ``anchor``,
            ``observation_role``, ``invalid_action``.

        Raises:
            EnvError: after ``close``. ConfigError: unknown option or task.
            SandboxError: the setup failed.
        """
        task_id = self._start_reset(seed, options)
        task = self.get_task(task_id if task_id is not None else self._draw(self._split_ids))
        self._setup(task)
        self._task, self._task_id, self._done = task, task.task_id, False
        self._history = hashlib.sha256()
        self._num_tool_calls = 0
        self._num_invalid_actions = 0
        info = self._info(system_prompt=self.system_prompt, system_prompt_describes_tools=True,
                          tools=tuple(json.loads(json.dumps(self.tools))), example_messages=self.example_messages())
        info.update(split=self.split_of(task.task_id), category=task.category)
        return self._task_message(task.prompt), info

    def example_messages(self) -> tuple[dict[str, str], ...] | None:
        """Worked example turns shown before the task (``StepInfo.example_messages``); None
        here. A subclass renders them with ``_task_message`` and ``_tool_messages`` so they
        read exactly like an episode of this env."""
        return None

    def _task_message(self, prompt: str) -> str:
        """The first user message of an episode whose task is ``prompt``."""
        return (f"Task: {prompt}\n\nThe working directory is `{self.sandbox.spec.workdir}`. "
                "Use the bash tool to do the task, then reply without a tool call.")

    def _tool_messages(self, outputs: list[str], calls_left: int) -> list[str]:
        """The tool messages after tool calls, one per call: its formatted result, the last
        one followed by the calls left. The observation is these joined by blank lines, so the
        text that per-step prompts show and the tool messages of a full-history prompt hold
        the same words."""
        return outputs[:-1] + [outputs[-1] + f"\n\n(Tool calls left: {calls_left}.)"]

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Apply one completion; see the module docstring.

        Returns:
            ``(observation, reward, terminated, truncated, info)``; ``info`` has ``task_id``,
            ``anchor``, ``invalid_action``, ``tool_calls``, ``observation_role``,
            ``num_tool_calls``; tool steps add ``tool_outputs``; the final step adds
            ``checks_passed`` (list of bool) and ``checks`` (their descriptions).

        Raises:
            EnvError: no episode running or ``action`` not a str. RewardError: grading
            failed. SandboxError: the sandbox failed.
        """
        self._check_step(action)
        try:
            calls = self._parser.parse(action)
        except ToolParseError as exc:
            return self._invalid(f"Your tool call could not be used: {exc}. Write "
                                 '<tool_call>{"name": "bash", "arguments": {"command": "..."}}</tool_call> with valid JSON.')
        if not calls:
            return self._finish(truncated=False, prefix="")
        messages, over = self.run_tool_calls(calls)
        if over:
            outputs = messages
            note = (f"Tool call limit reached: {len(calls) - len(outputs)} call(s) not run "
                    f"(at most {self.max_tool_calls} per task). The task is over.")
            obs, reward, term, trunc, info = self._finish(truncated=True, prefix="\n\n".join(outputs + [note]),
                                                          tool_calls=len(outputs))
            info["tool_calls"] = calls
            return obs, reward, term, trunc, info
        info = self._info(calls=calls, observation_role="tool", tool_outputs=tuple(messages))
        observation = "\n\n".join(messages)
        return observation, 0.0, False, False, info

    def run_tool_calls(self, calls: list[ToolCall]) -> tuple[list[str], bool]:
        """Run parsed ``bash`` calls in the sandbox as ``step`` does, within the task's
        tool-call budget. Also what an agent through the gateway calls for its tools
        (``agentrl.gateway.agent_task.AgentTask.call_tools``).

        Returns:
            ``(messages, over)``: with ``over`` False, one tool message per call (the last
            followed by the calls left); with ``over`` True (the budget ran out) the
            results of the calls that ran, and the task is over.

        Raises:
            EnvError: no episode running. SandboxError: the sandbox failed.
        """
        if self._task is None or self._done:
            raise EnvError("run_tool_calls() needs a running episode; call reset() first")
        budget = self.max_tool_calls - self._num_tool_calls
        outputs = []
        for i, call in enumerate(calls[: max(budget, 0)]):
            command = call.arguments["command"]
            self._dirty = True
            self._history.update(command.encode() + b"\0")
            result = self.sandbox.exec(["bash", "-c", command], timeout_s=self.tool_timeout_s)
            header = f"Result of tool call {i + 1} of {len(calls)} (bash):" if len(calls) > 1 else "Result (bash):"
            outputs.append(header + "\n" + self._format(result))
        self._num_tool_calls += len(outputs)
        if len(calls) > len(outputs):
            return outputs, True
        return self._tool_messages(outputs, self.max_tool_calls - self._num_tool_calls), False

    def score(self) -> tuple[float, bool]:
        """Grade the working directory now and end the episode: ``(reward, success)``, the
        fraction of checks met and whether all were (what the episode's last ``step``
        returns). Also the verifier of an agent through the gateway.

        Raises:
            EnvError: no episode running. RewardError: grading failed.
        """
        if self._task is None:
            raise EnvError("score() needs an episode; call reset() first")
        passed = self._grade()
        return sum(passed) / len(passed), all(passed)

    def _grade(self) -> list[bool]:
        """The task's checks run now; the episode is over."""
        assert self._task is not None
        passed = grade(self.sandbox, self._task)
        self._done = True
        return passed

    def close(self) -> None:
        """End the env; the sandbox is NOT closed (its owner closes it). Idempotent."""
        super().close()

    # -- internals ------------------------------------------------------------------------

    def _setup(self, task: ShellTask) -> None:
        workdir = self.sandbox.spec.workdir
        if self._dirty:
            r = self.sandbox.exec(["find", workdir, "-mindepth", "1", "-delete"], timeout_s=30.0, cwd=workdir)
            if r.exit_code != 0:
                raise SandboxError(f"cleaning {workdir} for {task.task_id} failed: {r.stderr[-300:]}",
                                   command=r.command, output=r.stderr)
        self._dirty = True
        for path, content in task.files.items():
            self.sandbox.write_file(path, content)
        if task.setup:
            r = self.sandbox.exec(["bash", "-c", task.setup], timeout_s=30.0)
            if r.exit_code != 0:
                raise SandboxError(f"setup of {task.task_id} failed (exit {r.exit_code}): {r.stderr[-300:]}",
                                   command=r.command, output=r.stderr)

    def _info(self, *, calls: list[ToolCall] | None = None, **step_info: Any) -> dict[str, Any]:
        """``StepInfo(anchor=..., **step_info).to_info()`` plus this env's own keys."""
        assert self._task is not None
        digest = self._history.hexdigest()[:16] if self._num_tool_calls or calls else ""
        anchor: Hashable = (self._task.task_id, digest)
        if calls is not None:
            step_info.setdefault("tool_calls", len(calls))
        return StepInfo(anchor=anchor, **step_info).to_info(
            task_id=self._task.task_id, tool_calls=list(calls or []),
            num_tool_calls=self._num_tool_calls, num_invalid_actions=self._num_invalid_actions)

    def _invalid(self, message: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._num_invalid_actions += 1
        return invalid_reply_step(message, self._num_invalid_actions, self.max_invalid_actions,
                                  lambda prefix: self._finish(truncated=True, prefix=prefix),
                                  lambda: self._info(invalid_action=True))

    def _finish(self, *, truncated: bool, prefix: str,
                tool_calls: int | None = None) -> tuple[str, float, bool, bool, dict[str, Any]]:
        passed = self._grade()
        reward = sum(passed) / len(passed)
        lines = [prefix] if prefix else []
        lines.append(f"Checked the working directory: {sum(passed)} of {len(passed)} criteria met.")
        lines += [f"- [{'x' if ok else ' '}] {c.description}" for ok, c in zip(passed, self._task.checks)]
        info = self._info(success=all(passed)) if tool_calls is None else \
            self._info(success=all(passed), tool_calls=tool_calls)
        info.update(checks_passed=passed, checks=[c.description for c in self._task.checks])
        return "\n".join(lines), float(reward), not truncated, truncated, info

    def _format(self, result: ExecResult) -> str:
        lines = []
        if result.timed_out:
            lines.append(f"Timed out after {self.tool_timeout_s:g} s; the command was killed.")
        lines.append("Exit code: none (did not start)." if result.exit_code is None else f"Exit code: {result.exit_code}")
        for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
            lines.append(f"{name}:\n{clip_text(text, self.tool_output_limit_chars).rstrip(chr(10))}" if text else f"{name}: (empty)")
        return "\n".join(lines)
