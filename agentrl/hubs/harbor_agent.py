"""An agent program on Harbor tasks: ``register_harbor_agent`` registers a user's agent (an
agent command run in each task's own container, or an agent function) over ``hub/Harbor-v0``
through the gateway (docs/gateway.md), so a coding CLI that reads ``OPENAI_BASE_URL`` works on
Harbor tasks as it does in Harbor, while every token it gets is sampled and recorded by the run.

The command runs in the container ``HarborEnv`` starts for the episode's task (its image, its
network policy), in the task's working directory, under the gateway's forwarder (the image needs
``python3``: images ``FROM agentrl-base`` have it), with the variables of docs/gateway.md
(``OPENAI_BASE_URL``, ``OPENAI_API_KEY``, ``AGENTRL_TASK_FILE``, ...). When it exits 0 the task's
verifier (``tests/test.sh``) scores the container. Its time limit is the task's agent timeout
(``[agent] timeout_sec`` times ``timeout_multiplier``); as for any agent command, a run past it,
a non-zero exit or a failed container is an infrastructure error, never a score.

The run makes a sandbox for the env (``uses_sandbox``: it carries the gateway's socket mount,
``SandboxSpec.ro_mounts``, which the task's container then gets); that sandbox only lends its
settings and runs nothing.
"""

from __future__ import annotations

import re
from typing import Any, Mapping

import gymnasium

from agentrl.errors import ConfigError
from agentrl.gateway import AgentCommand, AgentEnv
from agentrl.hubs.harbor import ENV_ID, HarborEnv
from agentrl.hubs.harbor_task import TaskSet

__all__ = ["HarborAgentEnv", "register_harbor_agent"]


class HarborAgentEnv(AgentEnv):
    """``AgentEnv`` over ``hub/Harbor-v0`` whose agent command runs in the episode's task
    container (module docstring); made by ``register_harbor_agent``."""

    task_env = ENV_ID

    @property
    def sandbox(self) -> Any:
        """The episode's task container while one runs, else the sandbox the run gave."""
        inner = self.__dict__.get("inner")
        box = getattr(inner.unwrapped, "task_sandbox", None) if inner is not None else None
        return box if box is not None else self.__dict__.get("_run_sandbox")

    @sandbox.setter
    def sandbox(self, value: Any) -> None:
        self.__dict__["_run_sandbox"] = value

    @property
    def timeout_s(self) -> float:
        """The task's agent timeout while an episode runs (its command's limit), else the
        env's ``timeout_s``."""
        inner = self.__dict__.get("inner")
        env = inner.unwrapped if inner is not None else None
        task = getattr(env, "task", None)
        if task is not None and getattr(env, "task_sandbox", None) is not None:
            return task.config.agent_timeout_s * env.timeout_multiplier
        return self.__dict__.get("_timeout_s", 0.0)

    @timeout_s.setter
    def timeout_s(self, value: float) -> None:
        self.__dict__["_timeout_s"] = float(value)

    @classmethod
    def task_ids(cls, split: str = "train", env_kwargs: Mapping[str, Any] | None = None) -> list[str]:
        """The task ids of ``split`` of the Harbor tasks this agent works on (the class's
        ``task_env_kwargs``, updated by ``env_kwargs["task_env_kwargs"]``)."""
        kwargs = dict(cls.task_env_kwargs, **(dict(env_kwargs or {}).get("task_env_kwargs") or {}))
        return HarborEnv.task_ids(split, env_kwargs=kwargs)


def register_harbor_agent(env_id: str, *, path: str, command: str | list[str] | None = None, agent: Any = None,
                          task_env_kwargs: Mapping[str, Any] | None = None,
                          max_episode_steps: int | None = None) -> type[HarborAgentEnv]:
    """Register an agent over the Harbor tasks at ``path`` as ``env_id``.

    Args:
        path: a folder of Harbor task folders, or one task folder.
        command: an agent command (a shell string or an argv list) run in each task's
            container; or ``agent``: an ``AgentCommand`` or an agent function
            (docs/gateway.md).
        task_env_kwargs: further ``HarborEnv`` kwargs (``network``, ``timeout_multiplier``, ...).

    Raises:
        ConfigError: both or neither of ``command`` and ``agent``; ``path`` holds no task;
            ``env_id`` is registered already.
    """
    if (agent is None) == (command is None):
        raise ConfigError(f"register_harbor_agent({env_id!r}): give command= (run in each task's container) or "
                          "agent= (an AgentCommand or an agent function), not both or neither")
    if command is not None:
        agent = AgentCommand(command)
    TaskSet.from_path(path)
    if env_id in gymnasium.registry:
        raise ConfigError(f"env id {env_id!r} is registered already")
    attrs = {"agent": staticmethod(agent) if callable(agent) else agent,
             "task_env_kwargs": {"path": str(path), **dict(task_env_kwargs or {})},
             "uses_sandbox": isinstance(agent, AgentCommand)}
    cls = type(f"HarborAgentEnv_{re.sub(r'[^A-Za-z0-9]', '_', env_id)}", (HarborAgentEnv,), attrs)
    gymnasium.register(id=env_id, entry_point=cls, max_episode_steps=max_episode_steps)
    return cls
