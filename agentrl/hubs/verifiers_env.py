"""``hub/Verifiers-v0``: a verifiers environment (Prime Intellect's ``verifiers``) trained
through agentrl's gateway, without importing verifiers.

The environment runs where verifiers is installed: a hub venv of its own (``python``;
scripts/hub_venvs.sh makes ``verifiers-0.4.0`` and ``verifiers-0.3.1``), never agentrl's
venv, whose ``openai`` and ``mcp`` verifiers would downgrade. The classic API (0.3.x) and
v1 (0.4.x) cannot share one venv.

Episode
    ``VerifiersEnv`` is an agent env over the gateway (``agentrl.gateway.AgentEnv``). Its
    agent is one process of the hub python running ``verifiers_runner.py`` with an
    allowlisted environment (``VerifiersSpec.runner_env``: no tokens or cloud keys of
    agentrl's unless named in ``pass_env``): it loads the environment (nothing is
    installed or fetched: Hugging Face runs offline there), runs one
    rollout of the task with every model call sent to this episode's gateway session
    (``task.shared_base_url``, ``X-Session-ID: <session id>``, the session's key), scores it,
    and answers with the reward and each reward function's score. The gateway records the
    tokens, as for any agent. Classic: ``env.rollout`` gets an ``AsyncOpenAI`` client on the
    gateway; the reward is the rubric's score. v1: the taskset's own harness runs
    (``harness``, ``runtime``: a local process by default) with verifiers' client on the
    gateway, the trace's id being the session id; the reward is the weighted sum of the
    task's ``@vf.reward`` methods (and plugged judges).

Reward and metrics
    The episode's last step carries verifiers' reward; ``info["counters"]`` carries
    ``verifiers/reward/<name>`` (each reward function's score) and
    ``verifiers/metric/<name>`` (the metrics), summed per iteration in ``metrics.jsonl``. A
    turn cut by ``rollout.max_new_tokens`` (or the context) ends the episode: verifiers'
    rollout stops there too and scores what it holds. Every judge verifiers makes (a
    ``JudgeRubric``, a v1 ``vf.Judge`` plugged or made by task code) calls ``judge`` (an
    endpoint: ``base_url``, ``model``, ``api_key_env``), never the policy nor verifiers'
    default endpoint; without ``judge`` a judge call fails the episode.

Tasks
    ``train/<i>`` and ``test/<i>``: classic: the rows of the environment's ``dataset`` and
    ``eval_dataset``; v1: the tasks of the taskset made with ``args`` and ``eval_args``
    (``max_tasks`` caps each). Listing them runs the runner once per process.

Failures
    The runner not starting, crashing, answering off-protocol, or reporting a failed load,
    rollout, model call, reward function or judge: ``VerifiersError`` (an ``InfraError``),
    the episode ``infra_error``, never a score. The model's own empty reply is scored.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import subprocess
import threading
from typing import Any, ClassVar, Mapping

import gymnasium

from agentrl.errors import ConfigError, EnvError
from agentrl.gateway import AgentEnv
from agentrl.gateway.session import SessionSettings
from agentrl.hubs.verifiers_spec import (
    SPLITS,
    RolloutResult,
    VerifiersError,
    VerifiersSpec,
    list_task_ids,
    parse_answer,
    parse_task_id,
)
from environments.core import TextEnv

__all__ = ["ENV_ID", "TASK_ENV_ID", "VerifiersEnv", "VerifiersTasks", "VerifiersError"]

log = logging.getLogger(__name__)

ENV_ID = "hub/Verifiers-v0"
TASK_ENV_ID = "hub/VerifiersTasks-v0"
"""The task side of ``hub/Verifiers-v0`` (``AgentEnv``'s task env): its task ids, no model."""
STOP_GRACE_S = 5.0
"""Seconds a cancelled runner has to stop after its stdin closes before it is killed."""


class VerifiersTasks(TextEnv):
    """The tasks of a ``VerifiersSpec`` (made of ``hub_kwargs``, the env's kwargs) as
    ``AgentEnv`` asks of a task env: ``reset`` names the task (drawn from ``split`` when none
    is given); the runner prompts the model itself, so the observation is only the task's id.
    Never stepped.

    Raises:
        ConfigError: bad kwargs (``VerifiersSpec.from_kwargs``), an unknown split.
    """

    uses_sandbox = False
    metadata = {"render_modes": []}

    def __init__(self, sandbox: Any = None, *, hub_kwargs: Mapping[str, Any] | None = None,
                 split: str = "train") -> None:
        super().__init__()
        self.verifiers_spec = VerifiersSpec.from_kwargs(hub_kwargs)
        if split not in SPLITS:
            raise ConfigError(f"split={split!r}; {ENV_ID} has splits {SPLITS}")
        self.split = split

    @classmethod
    def task_ids(cls, split: str = "train", *, env_kwargs: Mapping[str, Any] | None = None) -> list[str]:
        """The task ids of ``split``; ``env_kwargs`` are this class's (``hub_kwargs``, ``split``)
        or ``hub/Verifiers-v0``'s own.

        Raises:
            ConfigError, VerifiersError: as ``VerifiersEnv.task_ids``.
        """
        kw = dict(env_kwargs or {})
        hub = kw["hub_kwargs"] if "hub_kwargs" in kw else {k: v for k, v in kw.items() if k not in ("split", "tool_parser")}
        return list_task_ids(VerifiersSpec.from_kwargs(hub), split)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        task_id = self._start_reset(seed, options)
        if task_id is None:
            task_id = self._draw(list_task_ids(self.verifiers_spec, self.split))
        split, _ = parse_task_id(task_id)
        self._task_id, self._done = task_id, False
        return f"verifiers task {task_id} of {self.verifiers_spec.environment}", {"task_id": task_id, "split": split}

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        raise EnvError(f"{TASK_ENV_ID} is never stepped: the verifiers runner drives {ENV_ID}'s episodes")

    @classmethod
    def checker_actions(cls) -> list[str]:
        """None: this env is never stepped (``check_env`` checks its tasks, resets and close)."""
        return []


class VerifiersEnv(AgentEnv):
    """A verifiers environment through the gateway (module docstring).

    Args:
        sandbox: ignored (the runner is a local process; it uses no sandbox of agentrl's).
        split: the tasks ``reset`` draws from when none is named.
        tool_parser: the model's tool-call format, for environments with tools.
        **kwargs: ``VerifiersSpec``'s fields (``python``, ``environment``, ``api``, ``args``,
            ``eval_args``, ``harness``, ``runtime``, ``sampling``, ``judge``, ``python_path``,
            ``pass_env``, ``max_tasks``, ``timeout_s``).

    Raises:
        ConfigError: a bad kwarg. Nothing is started, listed or reached until ``reset``.
    """

    task_env: ClassVar[str | None] = TASK_ENV_ID
    uses_sandbox = False

    def __init__(self, sandbox: Any = None, *, split: str = "train", tool_parser: str = "hermes",
                 **kwargs: Any) -> None:
        self.verifiers_spec = VerifiersSpec.from_kwargs(kwargs)
        self._max_new_tokens = SessionSettings().max_new_tokens
        self._result: RolloutResult | None = None
        super().__init__(None, agent=self._run_rollout, task_env=TASK_ENV_ID,
                         task_env_kwargs={"hub_kwargs": dict(kwargs), "split": split}, tool_parser=tool_parser)

    @classmethod
    def task_ids(cls, split: str = "train", *, env_kwargs: Mapping[str, Any] | None = None) -> list[str]:
        """``train/<i>`` or ``test/<i>`` for the env made with ``env_kwargs`` (module docstring).

        Raises:
            ConfigError: bad kwargs, an unknown split, an environment that does not load or
                has no such split. VerifiersError: the runner failed otherwise.
        """
        kw = {k: v for k, v in (env_kwargs or {}).items() if k not in ("split", "tool_parser")}
        return list_task_ids(VerifiersSpec.from_kwargs(kw), split)

    @classmethod
    def task_env_of(cls, env_kwargs: Mapping[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """``hub/VerifiersTasks-v0`` with the kwargs an instance made with ``env_kwargs``
        gives it (``AgentEnv.task_env_of``)."""
        kw = dict(env_kwargs or {})
        split = kw.pop("split", "train")
        kw.pop("tool_parser", None)
        return TASK_ENV_ID, {"hub_kwargs": kw, "split": split}

    @property
    def result(self) -> RolloutResult | None:
        """The finished episode's rollout result (None before its end)."""
        return self._result

    def set_rollout(self, chat: Any, sampling: Any, max_new_tokens: int, env_timeout_s: float | None = None) -> None:
        super().set_rollout(chat, sampling, max_new_tokens, env_timeout_s)
        self._max_new_tokens = int(max_new_tokens)

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        self._result = None
        return super().reset(seed=seed, options=options)

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        obs, reward, terminated, truncated, info = super().step(action)
        if (terminated or truncated) and self._result is not None:
            info["counters"] = {**(info.get("counters") or {}), **self._result.counters()}
            info["verifiers"] = {"stop": self._result.stop, "calls": self._result.calls, "api": self._result.api}
        return obs, reward, terminated, truncated, info

    async def _run_rollout(self, task: Any, client: Any) -> float:
        """The agent: the runner's rollout of ``task`` on this episode's session; its reward.

        Raises:
            VerifiersError: the runner failed (module docstring).
        """
        split, index = parse_task_id(task.task_id)
        request = self.verifiers_spec.request(
            "rollout", split=split, index=index, model=SessionSettings().model_name,
            max_new_tokens=self._max_new_tokens, lifeline=True,
            gateway={"base_url": task.shared_base_url, "session_id": task.session_id, "api_key": task.api_key})
        what = f"rollout of task {task.task_id!r} of {self.verifiers_spec.environment!r}"
        try:  # Popen, not asyncio's subprocesses: agents run in loops of their own threads, which race to spawn
            proc = subprocess.Popen(self.verifiers_spec.argv(), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                    stderr=subprocess.PIPE, env=self.verifiers_spec.runner_env(),
                                    start_new_session=True)
        except OSError as exc:
            raise VerifiersError(f"python={self.verifiers_spec.python!r} could not run the verifiers runner ({exc}); "
                                 "make the hub venv with scripts/hub_venvs.sh") from None
        try:
            assert proc.stdin is not None
            proc.stdin.write(request.encode())
            proc.stdin.flush()  # stdin stays open: its EOF tells the runner to stop
            out, err = await asyncio.to_thread(_collect, proc)
        except BrokenPipeError:
            out, err = _collect(proc)
        finally:
            _stop(proc)
        answer = parse_answer(out, err, proc.returncode, what)
        self._result = RolloutResult.from_answer(answer)
        return self._result.reward


def _collect(proc: subprocess.Popen) -> tuple[str, str]:
    """The runner's stdout and stderr, read to their ends (stderr in a thread of its own)."""
    err: list[bytes] = []
    reader = threading.Thread(target=lambda: err.append(proc.stderr.read() if proc.stderr else b""), daemon=True)
    reader.start()
    out = proc.stdout.read() if proc.stdout else b""
    reader.join()
    proc.wait()
    return out.decode(errors="replace"), b"".join(err).decode(errors="replace")


def _stop(proc: subprocess.Popen) -> None:
    """End the runner: close its stdin (it cancels its rollout and exits), then, after
    ``STOP_GRACE_S``, kill its process group."""
    if proc.stdin is not None and not proc.stdin.closed:
        try:
            proc.stdin.close()
        except BrokenPipeError:
            pass
    try:
        proc.wait(STOP_GRACE_S)
        return
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        proc.wait(STOP_GRACE_S)
    except subprocess.TimeoutExpired:
        log.warning("the verifiers runner (pid %d) did not end after SIGKILL", proc.pid)


if TASK_ENV_ID not in gymnasium.registry:
    gymnasium.register(id=TASK_ENV_ID, entry_point=VerifiersTasks)
