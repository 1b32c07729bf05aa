"""``hub/Harbor-v0``: Harbor-format tasks (harbor 0.25's task folders, as Terminal-Bench 2
publishes them) as a text Gymnasium env, without importing ``harbor``. docs/hubs/harbor.md.

Tasks
    ``path`` (env kwarg; else the registered default, else ``$AGENTRL_HARBOR_PATH``) is a
    folder of task folders, or one task folder; task ids are the folders' names, sorted, and
    every task is in every split unless the folder has a ``splits.json``
    (``agentrl.hubs.harbor_task``). Listing tasks reads folder names only; nothing is built,
    installed or reached while an env is made.

Episode
    ``reset`` reads the task (``task.toml``, ``instruction.md``), makes its image ready (built
    from ``environment/Dockerfile`` by the Docker sandbox backend at the task's first reset in
    the process, no pull, no network; the ``FROM`` image must be on the daemon), and starts
    the task's own container with the task's network policy, cpus and memory
    (``agentrl.hubs.harbor_runtime``). The observation is ``instruction.md``. The agent is a
    ``bash`` tool in that container: each reply's Hermes tool calls
    (``<tool_call>{"name": "bash", "arguments": {"command": ...}}</tool_call>``), else its
    fenced ```` ```bash ```` (or ``sh``, ``shell``) blocks, run in the working directory, each
    for at most ``tool_timeout_s`` and together for at most the task's agent timeout
    (``[agent] timeout_sec`` times ``timeout_multiplier``); the observation is their exit
    codes and output. A reply with no command says the agent is done: every process it left
    running is killed, ``/logs/verifier`` is made again, ``tests/`` is copied in,
    ``tests/test.sh`` runs within the verifier timeout, and its ``reward.txt`` /
    ``reward.json`` is the reward of that last step (terminated)
    (``agentrl.hubs.harbor_runtime.verify``). ``max_turns`` replies with
    commands, ``max_invalid_actions`` malformed tool calls past the limit, or the agent
    timeout spent end the episode the same way, truncated. Every other step's reward is 0.

    An agent program instead (a coding CLI reaching the model through the gateway with
    ``OPENAI_BASE_URL``) runs in the same container: ``agentrl.hubs.harbor_agent``.

Oracle
    ``checker_actions()`` is one action, ``ORACLE_ACTION``, which runs ``solution/solve.sh``
    (copied into ``/solution``, the agent timeout, ``[solution] env``) and then the verifier,
    and raises ``HarborError`` unless the reward is 1: ``agentrl envs check hub/Harbor-v0``
    passes only for a task whose oracle scores 1. The action carries a per-process secret
    drawn at import and shown in no observation, so a model cannot write it.

Anchor (GiGPO)
    ``(task_id, digest)``: the first 16 hex digits of the SHA-256 of the commands run so far
    (``""`` at reset), as ``agentrl/ShellTasks-v0`` does.

Failures (never the model's, never a score)
    A bad ``task.toml``, a missing image or ``FROM`` image, a failed or slow build, a
    container that does not start, a ``test.sh`` past the verifier timeout, a missing or
    malformed reward: ``HarborError`` or ``SandboxError`` (``InfraError``); the rollout ends
    the episode with ``infra_error``. The container is removed when the episode ends (after
    its verifier), at the next ``reset`` and at ``close``, and is reaped by its run label
    after a crash. Its commands are not recorded as the turn's sandbox execs (the run's
    sandbox listeners never see the task's own container).
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import re
import secrets
from typing import Any, ClassVar, Hashable, Mapping

import gymnasium

from agentrl.errors import ConfigError, EnvError, ToolParseError
from agentrl.hubs.harbor_runtime import (
    IMAGES,
    Verdict,
    open_client,
    prepare,
    run_script,
    stage_dir,
    start_sandbox,
    task_spec,
    verify,
)
from agentrl.hubs.harbor_task import PATH_ENV, HarborError, HarborTask, TaskSet, container_network, load_task
from agentrl.types import ExecResult, StepInfo
from environments.core import TextEnv, clip_text, invalid_reply_step
from environments.shell_tasks import bash_tool_schema
from environments.tools import HermesToolParser, ToolCall

__all__ = ["ENV_ID", "ORACLE_ACTION", "NETWORK_POLICIES", "HarborEnv", "HarborError", "register_harbor_env"]

ENV_ID = "hub/Harbor-v0"
ORACLE_ACTION = f"<harbor-oracle {secrets.token_hex(16)}/>"
"""The checker's action: run the task's oracle (module docstring). A per-process secret."""
NETWORK_POLICIES = ("task", "none")
_FENCED = re.compile(r"```[ \t]*(?:bash|sh|shell)[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)


def fenced_commands(text: str) -> list[str]:
    """The code of every closed ```` ```bash ```` / ``sh`` / ``shell`` block of ``text``, in order."""
    return [block for block in _FENCED.findall(text) if block.strip()]


class HarborEnv(TextEnv):
    """Harbor task folders with a ``bash`` tool in each task's own container; see the module
    docstring.

    Args:
        sandbox: optional; a sandbox the run made, whose spec gives the task containers their
            run id, read-only mounts (an agent command's gateway socket), variables and output
            limit. Never used for commands, never closed here.
        path: a folder of task folders, or one task folder (None: the class's
            ``default_path``, else ``$AGENTRL_HARBOR_PATH``).
        split: the tasks ``reset`` draws from when ``options`` names none.
        max_turns: replies with commands per episode; the last one ends it (truncated).
        tool_timeout_s: seconds per command (also bounded by the agent time left).
        max_invalid_actions: malformed tool calls tolerated; one more ends the episode.
        tool_output_limit_chars: characters per stream shown to the model.
        network: ``"task"`` (the task's policy: ``no-network`` offline, ``public`` on Docker's
            bridge network) or ``"none"`` (every task offline).
        timeout_multiplier: scales the task's agent, verifier and build timeouts.
        cpus, memory_mb: the container's limits where ``task.toml`` sets none.
        pids_limit: the container's process limit.
        docker_host: the Docker daemon (None: ``DOCKER_HOST``, else the default socket).
        run_id: the containers' run label without a ``sandbox`` (``sandboxes.labels``).

    Raises:
        ConfigError: a bad argument, no path, or a path without tasks.
    """

    uses_sandbox = False  # each task runs in a container of its own image, started by the env
    default_path: ClassVar[str | None] = None
    metadata = {"render_modes": []}

    def __init__(self, sandbox: Any = None, path: str | None = None, split: str = "train", max_turns: int = 30,
                 tool_timeout_s: float = 120.0, max_invalid_actions: int = 3, tool_output_limit_chars: int = 4000,
                 network: str = "task", timeout_multiplier: float = 1.0, cpus: float = 1.0, memory_mb: int = 2048,
                 pids_limit: int = 512, docker_host: str | None = None, run_id: str = "harbor") -> None:
        super().__init__()
        self.tasks = TaskSet.from_path(self.resolve_path(path))
        self._split_ids = self.tasks.ids(split)
        for name, value, low in (("max_turns", max_turns, 1), ("max_invalid_actions", max_invalid_actions, 0),
                                 ("tool_output_limit_chars", tool_output_limit_chars, 100),
                                 ("memory_mb", memory_mb, 16), ("pids_limit", pids_limit, 8)):
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"{name}={value!r} must be an int >= {low}")
        for name, value in (("tool_timeout_s", tool_timeout_s), ("timeout_multiplier", timeout_multiplier),
                            ("cpus", cpus)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
                raise ConfigError(f"{name}={value!r} must be a finite number > 0")
        if network not in NETWORK_POLICIES:
            raise ConfigError(f"network={network!r}; expected one of {NETWORK_POLICIES}")
        spec = getattr(sandbox, "spec", None)
        if sandbox is not None and spec is None:
            raise ConfigError(f"sandbox={sandbox!r} has no spec; expected a sandboxes.Sandbox (or None)")
        self.template = spec
        self.split = split
        self.max_turns = max_turns
        self.tool_timeout_s = float(tool_timeout_s)
        self.max_invalid_actions = max_invalid_actions
        self.tool_output_limit_chars = tool_output_limit_chars
        self.network = network
        self.timeout_multiplier = float(timeout_multiplier)
        self.cpus, self.memory_mb, self.pids_limit = float(cpus), memory_mb, pids_limit
        self.docker_host = docker_host
        self.run_id = run_id
        self.tools = [bash_tool_schema()]
        self._parser = HermesToolParser(self.tools)
        self._client: Any = None
        self._sandbox: Any = None
        self._task: HarborTask | None = None
        self._history = hashlib.sha256()
        self._commands = 0
        self._turns = 0
        self._invalid = 0
        self._agent_left_s = 0.0

    # --- tasks ----------------------------------------------------------------------------

    @classmethod
    def resolve_path(cls, path: Any = None) -> Any:
        """``path``, else ``default_path``, else ``$AGENTRL_HARBOR_PATH``. Raises ConfigError
        when none names one."""
        path = path or cls.default_path or os.environ.get(PATH_ENV)
        if not path:
            raise ConfigError(f"{ENV_ID} needs path= (env.kwargs.path: a folder of Harbor task folders, or one "
                              f"task folder), or ${PATH_ENV}")
        return path

    @classmethod
    def task_ids(cls, split: str = "train", env_kwargs: Mapping[str, Any] | None = None) -> list[str]:
        """The task ids of ``split`` under the path ``env_kwargs`` names (module docstring).
        Raises ConfigError: no path, no task, an unknown split."""
        return TaskSet.from_path(cls.resolve_path((env_kwargs or {}).get("path"))).ids(split)

    @classmethod
    def checker_actions(cls) -> list[str]:
        """For ``check_env``: the oracle (its reward must be 1)."""
        return [ORACLE_ACTION]

    @property
    def task(self) -> HarborTask | None:
        """The task of the episode (None before the first reset)."""
        return self._task

    @property
    def task_sandbox(self) -> Any:
        """The container of the episode in progress (a ``DockerSandbox``; None between episodes)."""
        return self._sandbox

    @property
    def system_prompt(self) -> str:
        return (
            "You are working on a task in a Linux container. You have one tool, `bash`: it runs a command in "
            "the task's working directory and shows you its exit code, stdout and stderr (at most "
            f"{self.tool_timeout_s:g} seconds per command). Call it like this:\n"
            "<tool_call>\n"
            '{"name": "bash", "arguments": {"command": "ls -la"}}\n'
            "</tool_call>\n"
            "or write the command in a ```bash fenced block. Results come back in the next message. When the "
            "task is done, reply with a short summary and no command: the task's tests then check the container."
        )

    # --- gymnasium ------------------------------------------------------------------------

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Start the task's container. ``options={"task_id": ...}`` names the task; else one
        is drawn from the split with ``np_random``.

        Raises:
            EnvError: after ``close``. ConfigError: unknown option or task id.
            HarborError, SandboxError (``InfraError``): the task, its image or its container
                failed; nothing stays running.
        """
        requested = self._start_reset(seed, options)
        self._end_episode()
        task_id = requested if requested is not None else self._draw(self._split_ids)
        task_dir = self.tasks.task_dir(task_id)
        self._task_id, self._done, self._task = task_id, False, None
        self._history, self._commands, self._turns, self._invalid = hashlib.sha256(), 0, 0, 0
        try:
            task = load_task(task_dir)
            network = container_network(task.config, self.network, task_id)
            if self._client is None:
                self._client = open_client(self.docker_host)
            image = IMAGES.ensure(task, self._client, self.docker_host, self.timeout_multiplier)
            spec = task_spec(task, image, self._client, network=network, run_id=self.run_id, cpus=self.cpus,
                             memory_mb=self.memory_mb, pids_limit=self.pids_limit, template=self.template)
            self._sandbox = start_sandbox(spec, self._client)
            prepare(self._sandbox, task_id)
        except BaseException:
            self._done = True
            self._end_episode()
            raise
        self._task = task
        self._agent_left_s = task.config.agent_timeout_s * self.timeout_multiplier
        info = self._info(system_prompt=self.system_prompt, system_prompt_describes_tools=True,
                          tools=tuple(json.loads(json.dumps(self.tools))))
        info.update(split=self.tasks.split_of(task_id), workdir=spec.workdir, network=network)
        return self._task_message(task, spec.workdir), info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Run the reply's commands, or verify when it has none; see the module docstring.

        Raises:
            EnvError: no episode running, or ``action`` is not a str.
            HarborError, SandboxError (``InfraError``): the container or the verifier failed
                (the oracle: also a reward other than 1).
        """
        self._check_step(action)
        if action == ORACLE_ACTION:
            return self._oracle()
        try:
            calls = self._parser.parse(action)
        except ToolParseError as exc:
            return self._invalid_step(f"Your tool call could not be used: {exc}. Write <tool_call>{{\"name\": "
                                      '"bash", "arguments": {"command": "..."}}</tool_call> with valid JSON, or a '
                                      "```bash fenced block.")
        commands = [c.arguments["command"] for c in calls] if calls else fenced_commands(action)
        if not commands:
            return self._finish(truncated=False, prefix="")
        self._turns += 1
        outputs, over = self._run(commands)
        if over or self._turns >= self.max_turns:
            why = ("The agent time of this task is spent" if over else
                   f"That was the last of {self.max_turns} turns with commands")
            obs, reward, term, trunc, info = self._finish(truncated=True, prefix="\n\n".join(
                outputs + [f"{why}: the task is over."]))
            return obs, reward, term, trunc, info
        role = "tool" if calls else "user"
        info = self._info(observation_role=role, tool_outputs=tuple(outputs) if calls else None,
                          tool_calls=len(commands))
        return "\n\n".join(outputs), 0.0, False, False, info

    def run_tool_calls(self, calls: list[ToolCall]) -> tuple[list[str], bool]:
        """Run parsed ``bash`` calls in the task's container within the agent's time, as
        ``step`` does (what an agent function through the gateway calls: ``AgentTask.call_tools``).

        Returns:
            ``(messages, over)``: one tool message per call run; ``over`` True when the
            agent time ran out (the calls after it were not run: the task is over).

        Raises:
            EnvError: no episode running. SandboxError: the container failed.
        """
        if self._task is None or self._done or self._sandbox is None:
            raise EnvError("run_tool_calls() needs a running episode; call reset() first")
        return self._run([c.arguments["command"] for c in calls])

    def score(self) -> tuple[float, bool]:
        """Run the verifier now and end the episode: ``(reward, success)``, success being
        reward >= 1 (the verifier of an agent through the gateway).

        Raises:
            EnvError: no episode running. HarborError, SandboxError: the verifier failed.
        """
        if self._task is None or self._done or self._sandbox is None:
            raise EnvError("score() needs a running episode; call reset() first")
        verdict = self._verify()
        return verdict.reward, verdict.reward >= 1.0

    def close(self) -> None:
        """Remove the episode's container and close the Docker client. Idempotent."""
        self._end_episode()
        client, self._client = self._client, None
        if client is not None:
            client.close()
        super().close()

    # --- internals ------------------------------------------------------------------------

    def _task_message(self, task: HarborTask, workdir: str) -> str:
        return (f"{task.instruction.strip()}\n\n(The working directory is `{workdir}`. Use the bash tool to do the "
                "task, then reply without a command.)")

    def _end_episode(self) -> None:
        sandbox, self._sandbox = self._sandbox, None
        if sandbox is not None:
            sandbox.close()

    def _run(self, commands: list[str]) -> tuple[list[str], bool]:
        outputs = []
        for i, command in enumerate(commands):
            if self._agent_left_s <= 0:
                return outputs, True
            timeout = min(self.tool_timeout_s, self._agent_left_s)
            self._history.update(command.encode() + b"\0")
            self._commands += 1
            result = self._sandbox.exec(["bash", "-c", command], timeout_s=timeout)
            self._agent_left_s -= result.duration_s
            header = f"Result of command {i + 1} of {len(commands)}:" if len(commands) > 1 else "Result:"
            outputs.append(header + "\n" + self._format(result, timeout))
        return outputs, self._agent_left_s <= 0

    def _format(self, result: ExecResult, timeout_s: float) -> str:
        lines = [f"Timed out after {timeout_s:g} s; the command was killed."] if result.timed_out else []
        lines.append(f"Exit code: {result.exit_code}")
        for name, text in (("stdout", result.stdout), ("stderr", result.stderr)):
            lines.append(f"{name}:\n{clip_text(text, self.tool_output_limit_chars).rstrip(chr(10))}" if text
                         else f"{name}: (empty)")
        return "\n".join(lines)

    def _verify(self) -> Verdict:
        assert self._task is not None
        self._done = True
        try:
            return verify(self._sandbox, self._task, self._task.config.verifier_timeout_s * self.timeout_multiplier)
        finally:
            self._end_episode()

    def _finish(self, *, truncated: bool, prefix: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        verdict = self._verify()
        text = f"The task is over: its tests scored {verdict.reward:g}."
        info = self._info(success=verdict.reward >= 1.0)
        info.update(rewards=dict(verdict.rewards), verifier_exit_code=verdict.exit_code)
        return (f"{prefix}\n\n{text}" if prefix else text), verdict.reward, not truncated, truncated, info

    def _oracle(self) -> tuple[str, float, bool, bool, dict[str, Any]]:
        task = self._task
        assert task is not None
        if not (task.solution_dir / "solve.sh").is_file():
            self._done = True
            self._end_episode()
            raise HarborError(f"task {task.task_id!r} has no solution/solve.sh: the oracle cannot run",
                              task_id=task.task_id)
        timeout_s = task.config.agent_timeout_s * self.timeout_multiplier
        try:
            stage_dir(self._sandbox, task.solution_dir, "/solution", task.task_id)
            result = run_script(self._sandbox, "/solution/solve.sh", timeout_s, task.config.solution_env)
        except BaseException:
            self._done = True
            self._end_episode()
            raise
        if result.timed_out:
            self._done = True
            self._end_episode()
            raise HarborError(f"task {task.task_id!r}: solution/solve.sh ran past the agent timeout ({timeout_s:g} s)",
                              task_id=task.task_id)
        self._history.update(b"oracle\0")
        self._commands += 1
        obs, reward, term, trunc, info = self._finish(truncated=False, prefix=f"The oracle solution ran (exit code "
                                                                              f"{result.exit_code}).")
        if reward != 1.0:
            raise HarborError(f"task {task.task_id!r}: its oracle (solution/solve.sh, exit code {result.exit_code}) "
                              f"scores {reward:g}; expected 1: the task's solution or tests are broken "
                              f"(solve.sh output: {(result.stdout + result.stderr)[-500:]!r})", task_id=task.task_id)
        return obs, reward, term, trunc, info

    def _invalid_step(self, message: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._invalid += 1
        return invalid_reply_step(message, self._invalid, self.max_invalid_actions,
                                  lambda prefix: self._finish(truncated=True, prefix=prefix),
                                  lambda: self._info(invalid_action=True))

    def _info(self, **step_info: Any) -> dict[str, Any]:
        anchor: Hashable = (self._task_id, self._history.hexdigest()[:16] if self._commands else "")
        return StepInfo(anchor=anchor, **step_info).to_info(task_id=self._task_id)


def register_harbor_env(env_id: str, path: str, **env_kwargs: Any) -> type[HarborEnv]:
    """Register a ``HarborEnv`` over the tasks at ``path`` as ``env_id`` (its ``task_ids``
    and ``agentrl envs check`` then need no kwargs), with ``env_kwargs`` as its defaults.

    Raises:
        ConfigError: ``path`` holds no task; ``env_id`` is registered already.
    """
    TaskSet.from_path(path)
    if env_id in gymnasium.registry:
        raise ConfigError(f"env id {env_id!r} is registered already")
    cls = type(f"HarborEnv_{re.sub(r'[^A-Za-z0-9]', '_', env_id)}", (HarborEnv,), {"default_path": str(path)})
    gymnasium.register(id=env_id, entry_point=cls, kwargs=dict(env_kwargs))
    return cls
