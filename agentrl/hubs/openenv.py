"""``hub/OpenEnv-v0``: an OpenEnv server (Meta/Hugging Face's ``openenv``, 0.10 wire
protocol) as a text Gymnasium environment, without importing ``openenv``.

Server
    ``server`` names it (``agentrl.hubs.openenv_servers``): an address (``"http://host:port"``),
    a local process (``{"command": [..., "{port}"]}``) or a Docker image run in agentrl's Docker
    sandbox backend (``{"image": "name:tag"}``). A started server serves the process's episodes
    together when it allows concurrent sessions, else one episode each (``concurrent_sessions``,
    asked of the server by default). Nothing is installed, pulled or reached beyond the named
    address, and nothing at all while the env is made: the server is started (or reached) at
    the first ``reset``.

Episode
    ``reset`` opens one ``/ws`` session (one environment instance on the server) and sends
    ``reset`` with the task's seed; ``step(reply)`` turns the reply into an action
    (``agentrl.hubs.openenv_actions``: a JSON object, a fenced JSON object, or the raw reply
    where the action schema, read from ``GET /schema``, has one text field) and sends it. The
    session is closed when the server says ``done``, at the next ``reset``, at ``close`` (what
    the rollout calls when an episode ends, is cancelled or fails) and by the server itself
    when this process dies (its socket closes with it); a started local server or container is
    stopped with its episode (or, shared, when idle and at exit) and is reaped by its run label
    after a crash (``sandboxes.reap_orphans``).

MCP environments
    With ``action_format="mcp"`` (or ``auto`` on openenv's ``CallToolAction`` schema) the
    tools the server lists at ``reset`` are the episode's tools, each Hermes tool call of a
    reply is one ``call_tool`` action, and the results are the next turn's tool messages
    (``agentrl.hubs.openenv_mcp``; docs/hubs/openenv.md).

Tasks
    ``openenv/<seed>``: ``train`` seeds 0..9999, ``test`` 1,000,000..1,000,499, ``all`` both
    (``environments.seeded.SeededTasks``). The seed is sent as the reset's ``seed_key``
    (default ``seed``) with ``reset_kwargs``; openenv passes on the keys its env's ``reset`` takes.

Step output
    The observation text is the server's observation (``done``, ``reward`` and ``metadata``
    left out): the one text field, ``observation_field``, or the fields as a JSON object. The
    reward is the server's per-step reward (a step without one: 0.0), so GiGPO's step groups
    see each step's own reward; ``terminated`` is the server's ``done``. ``info``: the anchor
    (``(task_id, <anchor_fields or all observation fields as JSON>)``), ``invalid_action``,
    ``metadata`` (the server's), ``task_id``, ``split``, ``server`` (its address).

Invalid actions (the model's fault)
    A reply that does not parse or validate against the action schema, or that the server
    refuses (``VALIDATION_ERROR``), is not sent: the step returns ``invalid_action_reward``, the
    reason and how to reply as the observation, ``info["invalid_action"] = True`` and a count
    in ``info["counters"]["openenv/invalid_actions"]``. After ``max_invalid_actions`` of them
    (None: no limit) the episode is truncated.

Failures (never the model's, never a score)
    Everything the server or its start does wrong raises ``OpenEnvError`` or ``SandboxError``
    (``agentrl.errors.InfraError``): the rollout ends the episode with ``infra_error``, excluded
    from the loss.
"""

from __future__ import annotations

import json
import time
from typing import Any, Hashable, Mapping, Sequence

from agentrl.errors import ConfigError, ToolParseError
from agentrl.hubs.openenv_actions import ACTION_FORMATS, ActionSchema, SchemaError, observation_text, parse_action
from agentrl.hubs.openenv_mcp import (
    LIST_TOOLS,
    call_tool_action,
    is_mcp_schema,
    mcp_tools,
    tool_result_text,
    transport_fault,
)
from agentrl.hubs.openenv_servers import ServerLease, ServerSpec, lease_server, stop_servers
from agentrl.hubs.openenv_wire import CapacityError, OpenEnvError, Rejected, Session, read_schema, require_websockets
from agentrl.types import StepInfo
from environments.core import TextEnv, clip_text
from environments.seeded import SeededTasks
from environments.tools import HermesToolParser

__all__ = ["ENV_ID", "TASKS", "OpenEnvEnv", "OpenEnvError", "INVALID_ACTIONS_COUNTER"]

ENV_ID = "hub/OpenEnv-v0"
TASKS = SeededTasks("openenv", "OpenEnv", range(0, 10_000), range(1_000_000, 1_000_500))
"""The task ids (``openenv/<seed>``) and their seeds."""
INVALID_ACTIONS_COUNTER = "openenv/invalid_actions"
_CAPACITY_RETRY_S = 0.25


class OpenEnvEnv(TextEnv):
    """An OpenEnv server's environment; see the module docstring.

    Args:
        sandbox: ignored (the env starts what it needs itself).
        server: the server (``ServerSpec.parse``): an address or a dict.
        action_format: ``"auto"``, ``"json"``, ``"text"`` (``agentrl.hubs.openenv_actions``) or
            ``"mcp"`` (``agentrl.hubs.openenv_mcp``).
        observation_field: show this observation field alone (None: see the module docstring).
        anchor_fields: the observation fields that make GiGPO's anchor (None: all of them).
        system_prompt: the episode's system message; ``{action_schema}`` in it is replaced by
            the action schema. None: one that says how to reply, made from the schema.
        reset_kwargs: further keys of every ``reset`` message (JSON values).
        seed_key: the reset key that carries the task's seed.
        split: the tasks ``reset`` draws from when ``options`` names none.
        max_invalid_actions: invalid actions after which the episode is truncated (None: no limit).
        invalid_action_reward: the reward of an invalid action.
        timeout_s: the longest wait for one server answer, seconds.
        session_wait_s: how long a session refused for capacity is tried again, seconds.
        max_observation_chars: observations are clipped to about this many characters.

    Raises:
        ConfigError: a bad argument, or the ``websockets`` package is missing.
    """

    uses_sandbox = False
    metadata = {"render_modes": []}

    def __init__(self, sandbox: Any = None, server: Any = None, action_format: str = "auto",
                 observation_field: str | None = None, anchor_fields: Sequence[str] | None = None,
                 system_prompt: str | None = None, reset_kwargs: Mapping[str, Any] | None = None,
                 seed_key: str = "seed", split: str = "train", max_invalid_actions: int | None = None,
                 invalid_action_reward: float = 0.0, timeout_s: float = 60.0, session_wait_s: float = 60.0,
                 max_observation_chars: int = 20_000) -> None:
        super().__init__()
        if server is None:
            raise ConfigError(f"{ENV_ID} needs server=: an http(s):// address, {{'command': [...]}} or "
                              "{'image': ...} (docs/hubs/openenv.md)")
        try:
            require_websockets()
        except ImportError as exc:
            raise ConfigError(str(exc)) from None
        self.server = ServerSpec.parse(server)
        if action_format not in ACTION_FORMATS:
            raise ConfigError(f"action_format={action_format!r} is not one of {ACTION_FORMATS}")
        for name, value in (("timeout_s", timeout_s), ("session_wait_s", session_wait_s)):
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
                raise ConfigError(f"{name}={value!r} must be a number of seconds > 0")
        if max_invalid_actions is not None and (isinstance(max_invalid_actions, bool) or
                                                not isinstance(max_invalid_actions, int) or max_invalid_actions < 1):
            raise ConfigError(f"max_invalid_actions={max_invalid_actions!r} must be None or an int >= 1")
        if isinstance(invalid_action_reward, bool) or not isinstance(invalid_action_reward, (int, float)):
            raise ConfigError(f"invalid_action_reward={invalid_action_reward!r} must be a number")
        if not isinstance(max_observation_chars, int) or max_observation_chars < 100:
            raise ConfigError(f"max_observation_chars={max_observation_chars!r} must be an int >= 100")
        if reset_kwargs is not None and not isinstance(reset_kwargs, Mapping):
            raise ConfigError(f"reset_kwargs={reset_kwargs!r} must be a dict")
        if not isinstance(seed_key, str) or not seed_key:
            raise ConfigError(f"seed_key={seed_key!r} must be a non-empty str")
        self._split_seeds = TASKS.seeds(split)  # validates the split
        self.split = split
        self.action_format = action_format
        self.observation_field = observation_field
        self.anchor_fields = tuple(anchor_fields) if anchor_fields is not None else None
        self.custom_system_prompt = system_prompt
        self.reset_kwargs = dict(reset_kwargs or {})
        self.seed_key = seed_key
        self.max_invalid_actions = max_invalid_actions
        self.invalid_action_reward = float(invalid_action_reward)
        self.timeout_s = float(timeout_s)
        self.session_wait_s = float(session_wait_s)
        self.max_observation_chars = max_observation_chars
        self._schemas: dict[str, ActionSchema] = {}  # base_url -> its action schema
        self._schema: ActionSchema | None = None
        self._validator: Any = None
        self._mcp = False  # the episode's server is an MCP environment: replies are tool calls
        self._tools: list[dict[str, Any]] = []
        self._parser: HermesToolParser | None = None
        self._lease: ServerLease | None = None
        self._session: Session | None = None
        self._invalid = 0
        self._last_anchor: Hashable = None

    @classmethod
    def task_ids(cls, split: str = "train") -> list[str]:
        """``openenv/<seed>`` for the seeds of ``split``. Raises ConfigError for an unknown split."""
        return TASKS.task_ids(split)

    @property
    def server_pid(self) -> int | None:
        """The pid of the local server process this episode uses, when it started one."""
        return self._lease.pid if self._lease is not None else None

    @property
    def base_url(self) -> str | None:
        """The address of the server of the episode in progress (None between episodes)."""
        return self._lease.base_url if self._lease is not None else None

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[str, dict[str, Any]]:
        """Open a session on a server and reset it with the task's seed.

        Raises:
            EnvError: after ``close``. ConfigError: unknown option or task id.
            OpenEnvError, SandboxError (``InfraError``): the server could not be started,
                reached or reset; nothing stays open.
        """
        task_id = TASKS.task_for_reset(self._start_reset(seed, options), self.np_random, self._split_seeds)
        self._end_episode()
        self._task_id, self._done, self._invalid = task_id, False, 0
        try:
            self._lease = lease_server(self.server)
            base_url = self._lease.base_url
            self._schema = self._action_schema(base_url)
            self._validator = self._schema.validator()
            self._mcp = self.action_format == "mcp" or (self.action_format == "auto" and is_mcp_schema(self._schema))
            self._session = self._open_session(base_url)
            data = {**self.reset_kwargs, self.seed_key: TASKS.seed_of(task_id)}
            result = self._session.reset(data)
            if result.done:
                raise OpenEnvError(f"{base_url} ended the episode at reset (done: true)", base_url=base_url)
            text = self._text(result.observation)
            if self._mcp:
                self._list_tools(base_url)
                if not result.observation:  # an MCP environment may show nothing until a tool is called
                    text = "The environment is ready. " + self._how_to_reply()
        except BaseException:
            self._done = True
            self._end_episode()
            raise
        info = self._info(result.observation, result.metadata, invalid=False,
                          system_prompt=self._system_prompt(), tools=tuple(self._tools) if self._mcp else ())
        info["split"] = TASKS.split_of(task_id)
        return text, info

    def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """Send the reply as an action; see the module docstring.

        Raises:
            EnvError: no episode running, or ``action`` is not a str.
            OpenEnvError (``InfraError``): the server failed; the session is closed.
        """
        self._check_step(action)
        assert self._schema is not None and self._session is not None
        if self._mcp:
            return self._mcp_step(action)
        parsed = parse_action(action, self._schema, self.action_format, self._validator)
        if not parsed.valid:
            return self._invalid_step(parsed.error or "not an action")
        try:
            result = self._session.step(parsed.action or {})
            if isinstance(result, Rejected):
                return self._invalid_step(f"the environment refused it: {result.message}")
            text = self._text(result.observation)
        except BaseException:
            self._done = True
            self._end_episode()
            raise
        info = self._info(result.observation, result.metadata, invalid=False)
        reward = 0.0 if result.reward is None else float(result.reward)
        if result.done:
            self._done = True
            self._end_episode()
        return text, reward, result.done, False, info

    def close(self) -> None:
        """Close the session and release the server. Idempotent."""
        self._end_episode()
        super().close()

    @classmethod
    def release_shared(cls) -> None:
        """Stop every server this process started (a shared one outlives its episodes by
        ``idle_s``); the next ``reset`` starts one again. Run at exit, and by ``check_env``
        before it counts what was left."""
        stop_servers()

    # --- internals ----------------------------------------------------------------------

    def _end_episode(self) -> None:
        session, self._session = self._session, None
        lease, self._lease = self._lease, None
        if session is not None:
            session.close()
        if lease is not None:
            lease.release()

    def _action_schema(self, base_url: str) -> ActionSchema:
        if base_url not in self._schemas:
            try:
                schema = ActionSchema.from_schema(read_schema(base_url, self.timeout_s)["action"])
            except SchemaError as exc:
                raise OpenEnvError(f"{base_url}/schema: {exc}", base_url=base_url) from exc
            if self.action_format == "text" and schema.text_field is None:
                raise ConfigError(f"action_format='text' but the action schema of {base_url} has fields "
                                  f"{list(schema.fields)}, not one text field; use 'auto' or 'json'")
            self._schemas = {base_url: schema}  # a server of its own per episode: keep the last only
        return self._schemas[base_url]

    def _list_tools(self, base_url: str) -> None:
        assert self._session is not None
        listed = self._session.step(LIST_TOOLS)
        if isinstance(listed, Rejected):
            raise OpenEnvError(f"{base_url} refused list_tools ({listed.message}); an MCP environment answers it "
                               "(else set action_format to json or text)", base_url=base_url)
        self._tools = mcp_tools(listed.observation, base_url)
        self._parser = HermesToolParser(self._tools)

    def _mcp_step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        """The reply's tool calls, one ``call_tool`` action each, in order, until the server
        says ``done``; their rewards summed. A reply without a tool call, or with one that does
        not parse or fit its tool's input schema, is an invalid action."""
        assert self._parser is not None and self._session is not None
        try:
            calls = self._parser.parse(action)
        except ToolParseError as exc:
            return self._invalid_step(f"a tool call could not be used ({exc})")
        except Exception as exc:  # a tool's input schema that cannot check arguments: the server's
            url = self.base_url or ""
            self._done = True
            self._end_episode()
            raise OpenEnvError(f"checking a tool call against the tools of {url} failed: {type(exc).__name__}: {exc}",
                               base_url=url) from exc
        if not calls:
            return self._invalid_step("it calls no tool")
        outputs: list[str] = []
        reward, done, last, meta = 0.0, False, None, {}
        try:
            for call in calls:
                result = self._session.step(call_tool_action(call.name, call.arguments))
                if isinstance(result, Rejected):
                    outputs.append(f"error: the environment refused the call: {result.message}")
                    continue
                fault = transport_fault(result.observation)
                if fault is not None:
                    raise OpenEnvError(f"{self.base_url} could not run tool {call.name!r}: {fault}",
                                       base_url=self.base_url or "")
                outputs.append(clip_text(tool_result_text(result.observation), self.max_observation_chars))
                reward += 0.0 if result.reward is None else float(result.reward)
                last, meta = result.observation, result.metadata
                if result.done:
                    done = True
                    break
        except BaseException:
            self._done = True
            self._end_episode()
            raise
        if len(calls) > 1:
            outputs = [f"Result of tool call {i + 1} of {len(calls)} ({c.name}):\n{o}"
                       for i, (c, o) in enumerate(zip(calls, outputs))]
        if last is None:  # every call refused: nothing on the server changed
            return self._invalid_step("; ".join(outputs))
        # GiGPO's state after an MCP step: the calls made and what they showed (the tool messages)
        shown = {"calls": [[c.name, c.arguments] for c in calls[:len(outputs)]], "outputs": outputs}
        info = self._info(shown, meta, invalid=False, observation_role="tool", tool_outputs=tuple(outputs),
                          tool_calls=len(outputs), anchor_fields=("calls", "outputs"))
        if done:
            self._done = True
            self._end_episode()
        return "\n\n".join(outputs), reward, done, False, info

    def _open_session(self, base_url: str) -> Session:
        deadline = time.monotonic() + self.session_wait_s
        while True:
            session = Session(base_url, self.timeout_s)
            try:
                session.open()
                return session
            except CapacityError as exc:
                if time.monotonic() >= deadline:
                    raise CapacityError(f"{exc} (tried for {self.session_wait_s} s: session_wait_s)",
                                        base_url=base_url, code=exc.code) from exc
                time.sleep(_CAPACITY_RETRY_S)

    def _text(self, observation: Mapping[str, Any]) -> str:
        try:
            text = observation_text(observation, self.observation_field)
        except KeyError:
            raise OpenEnvError(f"observation_field={self.observation_field!r} is not a field of the observation "
                               f"(fields: {sorted(observation)})", base_url=self.base_url or "") from None
        return clip_text(text, self.max_observation_chars)

    def _anchor(self, observation: Mapping[str, Any], fields: Sequence[str] | None = None) -> Hashable:
        fields = fields if fields is not None else self.anchor_fields
        shown = {k: observation.get(k) for k in fields} if fields is not None else observation
        return (self._task_id, json.dumps(shown, sort_keys=True, ensure_ascii=False, default=str))

    def _how_to_reply(self) -> str:
        schema = self._schema
        assert schema is not None
        if self._mcp:
            names = ", ".join(t["function"]["name"] for t in self._tools)
            return ("Act by calling the environment's tools (" + names + "), one or more per reply, each exactly "
                    'like this: <tool_call>{"name": "TOOL", "arguments": {...}}</tool_call>. Their results come '
                    "back in the next message.")
        if schema.text_field is not None and self.action_format != "json":
            desc = schema.schema["properties"][schema.text_field].get("description")
            return (f"Your whole reply is sent to the environment as the action's {schema.text_field!r} field"
                    + (f" ({desc})." if desc else "."))
        return ("Reply with one JSON object, the action, that matches this JSON schema (alone, or in a ```json "
                f"fenced block): {schema.describe()}")

    def _system_prompt(self) -> str:
        if self.custom_system_prompt is not None:
            assert self._schema is not None
            return self.custom_system_prompt.replace("{action_schema}", self._schema.describe())
        return "You act in an environment, one action per turn. " + self._how_to_reply()

    def _invalid_step(self, error: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        self._invalid += 1
        truncated = self.max_invalid_actions is not None and self._invalid >= self.max_invalid_actions
        text = f"Your reply is not a valid action: {error}. {self._how_to_reply()}"
        # The server's state did not change: the anchor stays the last observation's.
        info = StepInfo(anchor=self._last_anchor, invalid_action=True, counters={INVALID_ACTIONS_COUNTER: 1.0}).to_info(
            task_id=self._task_id, metadata={}, server=self.base_url)
        if truncated:
            text += f" That was invalid action {self._invalid} of {self.max_invalid_actions}: the episode ends."
            self._done = True
            self._end_episode()
        return clip_text(text, self.max_observation_chars), self.invalid_action_reward, False, truncated, info

    def _info(self, observation: Mapping[str, Any], metadata: Mapping[str, Any], *, invalid: bool,
              anchor_fields: Sequence[str] | None = None, **step_info: Any) -> dict[str, Any]:
        self._last_anchor = self._anchor(observation, anchor_fields)
        return StepInfo(anchor=self._last_anchor, invalid_action=invalid, **step_info).to_info(
            task_id=self._task_id, metadata=dict(metadata), server=self.base_url)

