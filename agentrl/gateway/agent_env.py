"""A user's agent as a Gymnasium environment the rollout loop can run: the agent drives, the
loop samples.

``AgentEnv`` wraps a task environment (for its tasks, its sandbox, its tools and its
verifier) and a user's agent function (``agentrl.gateway.agent_task``). Per episode:

* ``reset`` resets the task env, opens a gateway session, starts the agent with an
  ``openai`` client pointed at it, and waits for the agent's first chat call: its messages,
  rendered for the model's template (``agentrl.gateway.render``), are the first prompt
  (``StepInfo.messages``).
* the loop samples the turn and hands it over (``receive_completion``: the sampled ids,
  their log-probs and versions, the engine's prompt); ``step`` parses the completion's tool
  calls, answers the waiting call with it, and waits for what the agent does next:
  - a call whose messages extend a branch's history (what that branch was prompted with,
    then the answer the gateway gave): the new messages are the next observation
    (``StepInfo.messages``), appended to that branch's tokens; the sampled ids are kept,
    never re-rendered;
  - a call that extends no branch (the agent compacted or edited its history, or called a
    sub-agent): a new branch (``StepInfo.branch``), prompted with the whole rendering of its
    messages; it trains as its own row; ``gateway/forks`` counts them;
  - the agent returned: the episode ends (``terminated``) with its reward: the agent's
    return value, else a reward posted to ``/sessions/{id}/reward``, else the task env's
    verifier (``score()``).
* an agent that raises, or whose session is closed under it, ends its episode as an
  infrastructure error (``EnvError``), never scored; a call it leaves waiting past the
  loop's ``rollout.env_timeout_s`` likewise (the loop's watchdog).

The anchor of each turn (GiGPO's state) is a hash of the conversation the agent's call
holds, without the random tool-call ids, so episodes of a group that reach the same
conversation share it.

Counters (``StepInfo.counters``, summed per episode): ``gateway/forks``, ``gateway/drift_tokens``,
``gateway/tool_parse_errors`` (a completion whose tool call could not be parsed: returned
to the agent as plain content, and ``invalid_action``), ``gateway/calls``.

``register_agent_env(env_id, agent=..., task_env=...)`` registers an agent over a task
environment under its own id, whose task ids and splits are the task env's.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import logging
import time
from typing import Any, ClassVar

import gymnasium
from gymnasium.envs.registration import load_env_creator

from agentrl.errors import ConfigError, EnvError, RewardError
from agentrl.gateway.agent_command import AgentCommand, CommandRunner
from agentrl.gateway.agent_task import AgentRunner, AgentTask, load_agent
from agentrl.gateway.render import is_extension, template_messages
from agentrl.gateway.server import gateway, shared_base_url
from agentrl.gateway.session import AgentCall, AgentReply, AgentSession, SessionSettings
from agentrl.gateway.tool_calls import parse_tool_calls
from agentrl.types import StepInfo, Turn
from environments.core import TextEnv

log = logging.getLogger(__name__)

DEFAULT_AGENT_TIMEOUT_S = 3600.0
COMMAND_STOP_TIMEOUT_S = 10.0
"""Seconds an episode's end waits for its agent command to stop (its lifeline ends within a
second); a command still running then (it stopped its forwarder) has its sandbox closed, or
a pooled one discarded, so it cannot reach the next episode."""


class AgentEnv(TextEnv):
    """A user's agent over a task environment (module docstring).

    Args:
        sandbox: the episode's sandbox, handed to the task env (None when it needs none).
        agent: the agent function, ``"module:function"``, or an ``AgentCommand`` run inside
            the sandbox (``agentrl.gateway.agent_command``); class attribute ``agent`` when
            made by ``register_agent_env``.
        task_env: id of the registered task environment (class attribute ``task_env``).
        task_env_kwargs: its keyword arguments.
        tool_parser: the model's tool-call format (``hermes``, or a vLLM tool parser name).
        timeout_s: seconds the env waits for the agent's next move before giving up (the
            loop's ``rollout.env_timeout_s`` usually ends it first).

    Raises:
        ConfigError: no agent or task env, or one that cannot be loaded or made.
    """

    agent: ClassVar[Any] = None
    serves_gateway: ClassVar[bool] = True  # the engine pool starts the run's gateway router for it
    task_env: ClassVar[str | None] = None
    task_env_kwargs: ClassVar[dict[str, Any]] = {}

    def __init__(self, sandbox: Any = None, *, agent: Any = None, task_env: str | None = None,
                 task_env_kwargs: dict[str, Any] | None = None, tool_parser: str = "hermes",
                 timeout_s: float = DEFAULT_AGENT_TIMEOUT_S) -> None:
        super().__init__()
        agent = agent if agent is not None else type(self).agent
        task_env = task_env or type(self).task_env
        if agent is None or not task_env:
            raise ConfigError(f"{type(self).__name__} needs agent= and task_env= (got agent={agent!r}, "
                              f"task_env={task_env!r}); register one with agentrl.gateway.register_agent_env")
        self._command = agent if isinstance(agent, AgentCommand) else None
        self._agent_fn = None if self._command is not None else load_agent(agent)
        if self._command is not None and sandbox is None:
            raise ConfigError(f"{type(self).__name__} runs the agent command {self._command.command!r} in the "
                              f"task's sandbox, but {task_env!r} was given none (its class says uses_sandbox=False)")
        if self._command is not None and gateway().mount() not in tuple(getattr(getattr(sandbox, "spec", None),
                                                                                "ro_mounts", ())):
            raise ConfigError(f"the agent command {self._command.command!r} needs the gateway's socket mounted in "
                              f"its sandbox ({gateway().mount()} in SandboxSpec.ro_mounts), which the run adds for "
                              "an env whose class holds the command: register it with register_agent_env(..., "
                              "command=...) or agent=AgentCommand(...) rather than passing it per instance")
        kwargs = dict(type(self).task_env_kwargs, **(task_env_kwargs or {}))
        if sandbox is not None:
            kwargs["sandbox"] = sandbox
        self.inner = gymnasium.make(task_env, disable_env_checker=True, **kwargs)
        self.sandbox = sandbox
        self.tool_parser = tool_parser
        self.timeout_s = float(timeout_s)
        self._chat: Any = None
        self._settings = SessionSettings()
        self._session: AgentSession | None = None
        self._runner: AgentRunner | CommandRunner | None = None
        self._task: AgentTask | None = None
        self._branches: list[list[dict[str, Any]]] = []
        self._call: AgentCall | None = None
        self._call_branch = 0
        self._completion: tuple[Turn, list[int]] | None = None
        self._posted_reward: float | None = None
        self._describe_tools = True
        self._branch_tools: list[str] = []  # each branch's tools (JSON), which its extensions must keep
        self._sampled_text: dict[int, list[int]] = {}  # branch -> its last answer's sampled ids (stop token aside)
        self._wait_s = self.timeout_s

    # --- hooks the rollout loop calls ------------------------------------------------------
    def set_rollout(self, chat: Any, sampling: Any, max_new_tokens: int, env_timeout_s: float | None = None) -> None:
        """The loop's chat tokenizer, sampling transform, token limit and env-call limit
        (``rollout.env_timeout_s``: the env gives up on a silent agent after it, too), before
        ``reset``."""
        self._chat = chat
        self._wait_s = min(self.timeout_s, env_timeout_s) if env_timeout_s else self.timeout_s
        self._settings = SessionSettings(temperature=float(sampling.temperature), top_p=float(sampling.top_p),
                                         top_k=int(sampling.top_k), max_new_tokens=int(max_new_tokens))

    def receive_completion(self, turn: Turn, prompt_ids: list[int]) -> None:
        """The turn the engine just sampled for the waiting call, and its whole prompt."""
        self._completion = (turn, list(prompt_ids))

    # --- gymnasium ---------------------------------------------------------------------
    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        task_id = self._start_reset(seed, options)
        self._end_session()
        if self._chat is None:
            raise EnvError(f"{type(self).__name__} was reset outside the rollout loop (no chat tokenizer); "
                           "it runs only in agentrl's rollout")
        obs, raw = self.inner.reset(seed=seed, options={"task_id": task_id} if task_id is not None else None)
        info = StepInfo.from_info(raw, env_id=str(self.task_env or self.inner.spec.id), where="reset")
        self._task_id, self._done = raw.get("task_id", task_id), False
        self._task = self._make_task(obs, info)
        self._describe_tools = not info.system_prompt_describes_tools
        self._branches, self._branch_tools, self._sampled_text = [], [], {}
        self._call, self._completion, self._posted_reward = None, None, None
        server = gateway()
        self._session = server.open_session(self._settings, separate_reward_key=self._command is not None)
        self._task.session_id, self._task.api_key = self._session.session_id, self._session.key
        self._task.shared_base_url = shared_base_url()
        if self._command is not None:
            self._runner = CommandRunner(self._command, self._task, self._session, self.sandbox, self.timeout_s)
        else:
            self._runner = AgentRunner(self._agent_fn, self._task, self._session, server.base_url(self._session),
                                       self.timeout_s)
        self._runner.start()
        outcome = self._wait(first=True)
        if outcome is None:
            raise EnvError(f"the agent of task {self._task_id!r} ended without calling the model")
        return outcome

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._check_step(action)
        if self._call is None or self._completion is None:
            raise EnvError("step() without a sampled completion for a waiting agent call "
                           "(the rollout loop hands it over with receive_completion)")
        turn, prompt_ids = self._completion
        call, self._completion = self._call, None
        req = call.request
        tok = self._chat.tokenizer
        ids = list(turn.completion_ids)
        # the text as sampled, special tokens kept (some formats mark calls with them:
        # mistral's [TOOL_CALLS], llama's <|python_tag|>), less the stop token that ended it
        body = ids[:-1] if ids and ids[-1] in self._chat.stop_token_ids else ids
        parsed = parse_tool_calls(tok.decode(body, skip_special_tokens=False), req.tools, parser=self.tool_parser,
                                  tool_choice=req.tool_choice, tokenizer=tok)
        finish = "length" if turn.finish_reason == "length" else ("tool_calls" if parsed.tool_calls else "stop")
        own_cap = req.max_tokens is not None and req.max_tokens < self._settings.max_new_tokens \
            and len(ids) >= req.max_tokens
        # cut by the run's budget (or the context): the rollout ends the episode after this
        # step, so the task's verifier scores it now; the agent is stopped first (its waiting
        # call gets a 409), so nothing it does changes what is scored
        scored_now = turn.finish_reason == "length" and not own_cap \
            and callable(getattr(self.inner.unwrapped, "score", None))
        if scored_now:
            self._end_session()
        call.answer(AgentReply(
            content=parsed.content, tool_calls=parsed.tool_calls, finish_reason=finish, prompt_ids=prompt_ids,
            completion_ids=ids, log_probs=list(turn.behavior_log_probs),
            tokens=[tok.decode([i], skip_special_tokens=False) for i in ids],
            policy_versions=list(turn.policy_versions)))
        assistant: dict[str, Any] = {"role": "assistant", "content": parsed.content}
        if parsed.tool_calls:
            assistant["tool_calls"] = parsed.tool_calls
        self._branches[self._call_branch].append(assistant)
        self._sampled_text[self._call_branch] = list(body)  # for the drift check of the next extension
        self._call = None
        counters = {"gateway/tool_parse_errors": 1.0} if parsed.error else {}
        if scored_now:
            return self._finish(None, tool_calls=len(parsed.tool_calls), invalid=parsed.error is not None,
                                counters=counters)
        return self._wait(first=False, tool_calls=len(parsed.tool_calls), invalid=parsed.error is not None,
                          counters=counters)

    @classmethod
    def task_env_of(cls, env_kwargs: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """The task env id and the keyword arguments an instance made with ``env_kwargs`` (a
        run's ``env.kwargs``) makes its task env with (the sandbox aside): what
        ``agentrl envs check`` checks in its place.

        Raises:
            ConfigError: no task env (neither the class nor ``env_kwargs`` names one).
        """
        kw = dict(env_kwargs or {})
        task_env = kw.get("task_env") or cls.task_env
        if not task_env:
            raise ConfigError(f"{cls.__name__} names no task_env; register it with agentrl.gateway.register_agent_env")
        return str(task_env), dict(cls.task_env_kwargs, **(kw.get("task_env_kwargs") or {}))

    @classmethod
    def sandbox_mounts(cls) -> tuple[tuple[str, str], ...]:
        """The read-only mounts this env's sandboxes need (``SandboxSpec.ro_mounts``): the
        gateway's socket directory for an agent command, none for an agent function. The
        sandboxes must run on this machine (the socket is a path of it)."""
        return (gateway().mount(),) if isinstance(cls.agent, AgentCommand) else ()

    def close(self) -> None:
        self._end_session()
        try:
            self.inner.close()
        finally:
            super().close()

    # --- internals -----------------------------------------------------------------------
    def _make_task(self, obs: str, info: StepInfo) -> AgentTask:
        messages: list[dict[str, Any]] = []
        if info.system_prompt:
            messages.append({"role": "system", "content": info.system_prompt})
        messages.extend({"role": m["role"], "content": m["content"]} for m in info.example_messages or ())
        messages.append({"role": "user", "content": obs})
        inner = self.inner.unwrapped
        runner = getattr(inner, "run_tool_calls", None)
        return AgentTask(task_id=str(self._task_id), messages=messages, tools=[dict(t) for t in info.tools or ()],
                         sandbox=self.sandbox, _run_tools=runner if callable(runner) else None)

    def _wait(self, *, first: bool, tool_calls: int = 0, invalid: bool = False,
              counters: dict[str, float] | None = None) -> Any:
        """The agent's next move as the reset or step result (None at reset when it ended
        without a call)."""
        assert self._session is not None
        counters = dict(counters or {})
        while True:
            try:
                event = self._session.next_event(self._wait_s)
            except TimeoutError as exc:
                raise EnvError(f"task {self._task_id!r}: {exc}") from None
            if event.kind == "reward":
                self._posted_reward = float(event.value)
            elif event.kind == "call":
                assert event.call is not None
                counters["gateway/calls"] = counters.get("gateway/calls", 0.0) + 1.0
                return self._take_call(event.call, first=first, tool_calls=tool_calls, invalid=invalid,
                                       counters=counters)
            elif event.kind == "failed":
                err = event.error
                raise EnvError(f"the agent of task {self._task_id!r} raised {type(err).__name__}: {err}") from err
            elif event.kind == "closed":
                raise EnvError(f"the gateway session of task {self._task_id!r} was closed")
            else:  # finished
                if first:
                    return None
                return self._finish(event.value, tool_calls=tool_calls, invalid=invalid, counters=counters)

    def _take_call(self, call: AgentCall, *, first: bool, tool_calls: int, invalid: bool,
                   counters: dict[str, float]) -> Any:
        call.taken_s = time.monotonic()
        msgs = call.request.messages
        tools = list(call.request.tools) if call.request.tools else None  # this call's own
        tools_key = json.dumps(tools, sort_keys=True)
        best, branch = None, -1
        for b, hist in enumerate(self._branches):
            n = is_extension(hist, msgs)
            # an extension keeps its branch's tools (a template that renders them writes
            # them before the history: other tools would be another prompt)
            if n is not None and n < len(msgs) and self._branch_tools[b] == tools_key and (best is None or n > best):
                best, branch = n, b
        # the task's own system prompt may describe its tools already (the in-process env
        # then adds no description either); any other system message gets one
        system = msgs[0].get("content") if msgs and msgs[0].get("role") == "system" else None
        first_task = self._task.messages[0] if self._task else {}
        task_system = first_task.get("content") if first_task.get("role") == "system" else None
        describe = self._describe_tools or system != task_system
        if best is None:  # the first call, or a history that extends no branch: a new branch
            branch = len(self._branches)
            new = template_messages(msgs, tools if describe else None, self._chat)
            if not first:
                counters["gateway/forks"] = counters.get("gateway/forks", 0.0) + 1.0
        else:
            new = template_messages(msgs[best:], None, self._chat)
            drift = self._drift_tokens(msgs[best - 1], branch)
            if drift:
                counters["gateway/drift_tokens"] = counters.get("gateway/drift_tokens", 0.0) + drift
        if branch == len(self._branches):
            self._branches.append(list(msgs))
            self._branch_tools.append(tools_key)
        else:
            self._branches[branch] = list(msgs)
        self._call, self._call_branch = call, branch
        obs = json.dumps([[m.get("role"), m.get("content")] for m in new], ensure_ascii=False)
        info = StepInfo(
            anchor=self._anchor(msgs),
            messages=tuple(new),
            tools=tuple(tools) if best is None and tools else None,  # a new branch's (the first one's too)
            branch=None if first else branch,
            tool_calls=None if first else tool_calls,
            invalid_action=invalid,
            counters=counters or None,
            max_new_tokens=call.request.max_tokens,
            stop_strings=tuple(call.request.stop) or None,
        ).to_info(task_id=self._task_id)
        if first:
            return obs, info
        return obs, 0.0, False, False, info

    def _anchor(self, msgs: list[dict[str, Any]]) -> str:
        """GiGPO's anchor state of the next turn: the conversation the call holds, roles and
        text with its tool calls written out, tool-call ids left out (they are drawn at
        random), hashed. Episodes of a group that reach the same conversation share it."""
        state = [(m.get("role"), m.get("content") or "") for m in template_messages(msgs, None, self._chat)]
        return hashlib.sha256(json.dumps(state, ensure_ascii=False).encode()).hexdigest()[:24]

    def _drift_tokens(self, sent_back: dict[str, Any], branch: int) -> int:
        """How many tokens re-rendering the assistant message the agent sent back would have
        changed against what was sampled (the tokens outside the longest matching blocks of
        the two sequences): ``gateway/drift_tokens``. Counted, never used: the branch keeps the
        sampled ids."""
        sampled = self._sampled_text.get(branch)
        if sampled is None or sent_back.get("role") != "assistant":
            return 0
        (rendered,) = template_messages([sent_back], None, self._chat)
        again = self._chat.tokenizer.encode(rendered.get("content") or "", add_special_tokens=False)
        same = sum(m.size for m in difflib.SequenceMatcher(None, again, sampled, autojunk=False).get_matching_blocks())
        return max(len(again), len(sampled)) - same

    def _finish(self, value: Any, *, tool_calls: int, invalid: bool, counters: dict[str, float]) -> Any:
        success = None
        if value is not None:
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise RewardError(f"the agent of task {self._task_id!r} returned {value!r}; expected a number or None")
            reward = float(value)
        elif self._posted_reward is not None:
            reward = self._posted_reward
        else:
            score = getattr(self.inner.unwrapped, "score", None)
            if not callable(score):
                raise RewardError(f"task {self._task_id!r}: the agent returned None, posted no reward, and "
                                  f"{self.task_env!r} has no verifier (score())")
            reward, success = score()
        self._done = True
        truncated = bool(self._task is not None and self._task.over)
        info = StepInfo(tool_calls=tool_calls, invalid_action=invalid, counters=counters or None,
                        success=success).to_info(task_id=self._task_id)
        return "", float(reward), not truncated, truncated, info

    def _end_session(self) -> None:
        if self._task is not None:
            self._task.close()  # waits for a tool call in progress; later ones are refused
        runner, self._runner = self._runner, None
        if runner is not None:
            runner.cancel()
        if self._session is not None:
            gateway().close_session(self._session)  # an agent command's lifeline ends: it is killed
            self._session = None
        if isinstance(runner, CommandRunner) and not runner.join(COMMAND_STOP_TIMEOUT_S):
            # it stopped its forwarder (the same user can): the sandbox goes, with it
            log.warning("the agent command of task %r still runs %g s after its episode ended; its sandbox is "
                        "closed (a pooled one replaced) so it cannot reach the next episode",
                        self._task_id, COMMAND_STOP_TIMEOUT_S)
            discard = getattr(self.sandbox, "discard", None)
            try:
                discard() if callable(discard) else self.sandbox.close()
            except Exception:  # noqa: BLE001 - already closed or broken: nothing left to stop
                log.exception("discarding the sandbox of task %r failed", self._task_id)


def register_agent_env(env_id: str, *, agent: Any = None, command: str | list[str] | None = None, task_env: str,
                       task_env_kwargs: dict[str, Any] | None = None,
                       max_episode_steps: int | None = None) -> type[AgentEnv]:
    """Register an agent over ``task_env`` as the environment ``env_id``; its task ids,
    splits and ``uses_sandbox`` are the task env's.

    Args:
        agent: the agent function, ``"module:function"``, or an ``AgentCommand``.
        command: shorthand for ``agent=AgentCommand(command)``: a command run inside the
            task's sandbox (``agentrl.gateway.agent_command``).

    Raises:
        ConfigError: both or neither of ``agent`` and ``command``; ``task_env`` is not
            registered; a command over a task env without a sandbox.
    """
    if (agent is None) == (command is None):
        raise ConfigError(f"register_agent_env({env_id!r}): give agent= (a function) or command= (run in the "
                          "task's sandbox), not both or neither")
    if command is not None:
        agent = AgentCommand(command)
    try:
        spec = gymnasium.spec(task_env)
    except Exception as exc:
        raise ConfigError(f"task_env={task_env!r} is not a registered environment ({exc})") from None
    inner_cls = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
    if isinstance(agent, AgentCommand) and not getattr(inner_cls, "uses_sandbox", True):
        raise ConfigError(f"register_agent_env({env_id!r}): an agent command runs in the task's sandbox, but "
                          f"{task_env!r} uses none")
    attrs: dict[str, Any] = {"agent": staticmethod(agent) if callable(agent) else agent, "task_env": task_env,
                             "task_env_kwargs": dict(task_env_kwargs or {}),
                             "uses_sandbox": getattr(inner_cls, "uses_sandbox", True)}
    for name in ("task_ids", "split_of", "get_task"):
        if hasattr(inner_cls, name):
            attrs[name] = classmethod(lambda cls, *a, _n=name, **k: getattr(inner_cls, _n)(*a, **k))
    cls = type(f"AgentEnv_{env_id.replace('/', '_').replace('-', '_')}", (AgentEnv,), attrs)
    gymnasium.register(id=env_id, entry_point=cls, max_episode_steps=max_episode_steps)
    return cls
