"""What a user's agent receives, and the thread that runs it.

An agent is a Python function ``agent(task, client) -> float | None``: ``async def`` gets an
``openai.AsyncOpenAI``, a plain ``def`` an ``openai.OpenAI``; either client is pointed at
the episode's gateway session (``base_url``, ``api_key``), so the agent needs nothing of
agentrl but ``task``. Its return value is the episode's reward (None: the reward comes from
``POST /sessions/{id}/reward`` or the task's verifier).

``AgentTask`` carries the task's first messages and tools as the in-process environment
would show them, and the task's tools as functions (``call_tools``), which run where the
task lives (its sandbox), exactly as the environment runs a parsed call.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import json
import logging
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

import openai

from agentrl.errors import ConfigError, EnvError, ToolParseError
from agentrl.gateway.session import AgentSession
from environments.tools import ToolCall

log = logging.getLogger(__name__)

AgentFn = Callable[..., Any]


def load_agent(agent: str | AgentFn) -> AgentFn:
    """The agent function: a callable, or ``"package.module:function"``.

    Raises:
        ConfigError: not importable, not callable, or not of the form ``module:function``.
    """
    if callable(agent):
        return agent
    if not isinstance(agent, str) or ":" not in agent:
        raise ConfigError(f"agent={agent!r}; expected a callable or 'package.module:function'")
    module_name, _, attr = agent.partition(":")
    try:
        fn = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"agent={agent!r} could not be loaded: {exc}") from None
    if not callable(fn):
        raise ConfigError(f"agent={agent!r} is a {type(fn).__name__}; expected a function (task, client) -> reward")
    return fn


@dataclass
class AgentTask:
    """One task, as the agent sees it.

    Attributes:
        task_id: the task's id.
        messages: the first messages the environment would prompt with (system, worked
            example turns, the task), as OpenAI chat message dicts.
        tools: OpenAI function tool schemas the task offers (may be empty).
        sandbox: the episode's sandbox (None for tasks without one), for agents that run
            their own commands (``sandbox.exec(...)``).
        over: set once the task's environment has ended the task (e.g. its tool-call limit);
            the agent should then stop.
        session_id, api_key: the episode's gateway session and its key, for a harness that
            takes one base URL for the whole run (``shared_base_url``) and names the session
            in the ``X-Session-ID`` header.
        shared_base_url: that one URL (``.../v1``): the run's router in front of every
            engine's gateway, or this process's gateway.
    """

    task_id: str
    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]]
    sandbox: Any = None
    over: bool = False
    session_id: str = ""
    api_key: str = ""
    shared_base_url: str = ""
    _run_tools: Callable[[list[ToolCall]], tuple[list[str], bool]] | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _closed: bool = field(default=False, repr=False)

    def close(self) -> None:
        """End the task: a tool call in progress finishes first, later ones raise
        ``EnvError`` (the episode is over; its sandbox may serve another one next)."""
        with self._lock:
            self._closed = True

    def call_tools(self, tool_calls: list[Any]) -> list[dict[str, Any]]:
        """Run the assistant message's tool calls with the task's own tools and return one
        ``{"role": "tool", "tool_call_id", "content"}`` message per call, in order.

        Args:
            tool_calls: the ``tool_calls`` of an assistant message (the ``openai`` SDK's
                objects or dicts), each with ``id`` and ``function.name`` / ``.arguments``
                (a JSON string).

        Raises:
            ConfigError: the task's environment runs no tools.
            ToolParseError: a call's arguments are not a JSON object.
            EnvError: the task is over (``close``).
        """
        if self._run_tools is None:
            raise ConfigError(f"task {self.task_id!r}: its environment runs no tools; run them in the agent")
        calls, ids = [], []
        for tc in tool_calls:
            d = tc if isinstance(tc, dict) else tc.model_dump()
            fn = d.get("function") or {}
            raw = fn.get("arguments") or "{}"
            try:
                args = json.loads(raw) if isinstance(raw, str) else dict(raw)
            except json.JSONDecodeError as exc:
                raise ToolParseError(f"tool call {fn.get('name')!r} has arguments that are not JSON: {exc}") from None
            if not isinstance(args, dict):
                raise ToolParseError(f"tool call {fn.get('name')!r} has arguments {raw!r}; expected a JSON object")
            calls.append(ToolCall(str(fn.get("name")), args))
            ids.append(d.get("id") or "")
        with self._lock:
            if self._closed:
                raise EnvError(f"task {self.task_id!r} is over: its episode ended, its tools no longer run")
            outputs, over = self._run_tools(calls)
        self.over = self.over or over
        return [{"role": "tool", "tool_call_id": i, "content": o} for i, o in zip(ids, outputs)]


class AgentRunner:
    """Runs one agent call in a thread of its own and reports its end to the session:
    ``agent_finished(value)`` or ``agent_failed(exc)``. ``cancel()`` stops an async agent
    at its next await (a sync agent's thread is left to finish; its calls are refused once
    the session is closed)."""

    def __init__(self, fn: AgentFn, task: AgentTask, session: AgentSession, base_url: str,
                 timeout_s: float) -> None:
        self.fn, self.task, self.session = fn, task, session
        self.base_url, self.timeout_s = base_url, timeout_s
        self._loop: asyncio.AbstractEventLoop | None = None
        self._task: asyncio.Task | None = None
        self._cancelled = False
        self._thread = threading.Thread(target=self._run, name=f"agentrl-agent-{session.session_id[:8]}", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def _client_kwargs(self) -> dict[str, Any]:
        return {"base_url": self.base_url, "api_key": self.session.key, "max_retries": 0, "timeout": self.timeout_s}

    def _run(self) -> None:
        try:
            if inspect.iscoroutinefunction(self.fn):
                value = asyncio.run(self._main())
            else:
                with openai.OpenAI(**self._client_kwargs()) as client:
                    value = self.fn(self.task, client)
        except asyncio.CancelledError as exc:
            if not self._cancelled:  # not ours: the agent's own cancellation is its failure
                self.session.agent_failed(exc)
            return
        except BaseException as exc:  # the agent's own failure, reported as the episode's
            if not self._cancelled:
                self.session.agent_failed(exc)
            return
        self.session.agent_finished(value)

    async def _main(self) -> Any:
        self._loop = asyncio.get_running_loop()
        async with openai.AsyncOpenAI(**self._client_kwargs()) as client:
            self._task = asyncio.current_task()
            if self._cancelled:
                raise asyncio.CancelledError
            return await self.fn(self.task, client)

    def cancel(self) -> None:
        self._cancelled = True
        loop, task = self._loop, self._task
        if loop is not None and task is not None and not loop.is_closed():
            try:
                loop.call_soon_threadsafe(task.cancel)
            except RuntimeError:  # the loop closed in between
                pass
