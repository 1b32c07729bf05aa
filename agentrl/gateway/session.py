"""One gateway session: the meeting point of an agent's HTTP calls and the episode that
records them.

An agent talks HTTP (``agentrl.gateway.server``); the rollout loop steps a Gymnasium env
(``agentrl.gateway.agent_env``). A session joins the two: each chat request the agent sends
becomes an ``AgentCall`` on the session's queue, where the env picks it up (as the
observation of the next turn); the env answers it with an ``AgentReply`` once the engine has
sampled the turn, and the HTTP handler waiting on the call's future turns that into the
OpenAI response. The agent's end (its return value, an exception, a posted reward) arrives
on the same queue, so the env sees one ordered stream of what the agent did.

Thread safety: the HTTP side (the server's event loop) and the env side (a rollout env
thread) touch a session only through its queue, the calls' futures and ``close``.
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
import time
from concurrent.futures import Future
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl.gateway.errors import GatewayError
from agentrl.gateway.protocol import ChatRequest

log = logging.getLogger(__name__)

EventKind = Literal["call", "reward", "finished", "failed", "closed"]


@dataclass
class AgentReply:
    """The answer to one chat call, as sampled by the engine.

    Attributes:
        content: the assistant message's text (None with tool calls and no text).
        tool_calls: OpenAI ``tool_calls`` dicts parsed from the completion.
        finish_reason: ``stop``, ``length`` or ``tool_calls``.
        prompt_ids: ``[P]`` the whole prompt the engine saw (the branch's tokens so far).
        completion_ids: ``[C]`` the sampled ids (the stop token included when sampled).
        log_probs: ``[C]`` behaviour log-probs (nats) of ``completion_ids``.
        tokens: ``[C]`` each completion id decoded on its own (for ``logprobs.content``).
        policy_versions: ``[C]`` the weight version that sampled each id.
    """

    content: str | None
    tool_calls: list[dict[str, Any]]
    finish_reason: str
    prompt_ids: list[int]
    completion_ids: list[int]
    log_probs: list[float]
    tokens: list[str]
    policy_versions: list[int] = field(default_factory=list)


@dataclass
class AgentCall:
    """One chat request of the agent, waiting for its reply (``future``: an ``AgentReply``,
    or a ``GatewayError`` when the session ends first).

    Attributes:
        submitted_s, taken_s, answered_s: ``time.monotonic()`` seconds when the HTTP side
            queued it, when the env took it (its turn then goes to the engine), when the env
            answered it; None until then. ``answered_s - taken_s`` is the rollout's share of
            the call (the engine's sampling included); the rest of a client's round trip is
            the gateway's (HTTP, checks, rendering, hand-offs).
    """

    request: ChatRequest
    future: Future = field(default_factory=Future)
    submitted_s: float = field(default_factory=time.monotonic)
    taken_s: float | None = None
    answered_s: float | None = None

    def answer(self, reply: AgentReply) -> None:
        self.answered_s = time.monotonic()
        if not self.future.done():
            self.future.set_result(reply)

    def refuse(self, error: GatewayError) -> None:
        if not self.future.done():
            self.future.set_exception(error)


@dataclass(frozen=True)
class AgentEvent:
    """What the agent did, in order: a ``call`` (``call``), a posted ``reward`` (``value``),
    ``finished`` (its return value in ``value``), ``failed`` (``error``), or the session was
    ``closed``."""

    kind: EventKind
    call: AgentCall | None = None
    value: Any = None
    error: BaseException | None = None


@dataclass(frozen=True)
class SessionSettings:
    """What the gateway checks each request against: the run's sampling transform and the
    most new tokens a turn may have (``rollout.temperature``/``top_p``/``top_k``,
    ``rollout.max_new_tokens``), and the model name the agent sees."""

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    max_new_tokens: int = 512
    model_name: str = "agentrl-policy"


class AgentSession:
    """One episode's session (see the module docstring).

    Args:
        session_id: the id in the URL (``/sessions/{id}/v1``) or the ``X-Session-ID`` header.
        settings: what requests are checked against; ``configure`` may replace it before
            the first call.
        separate_reward_key: give ``POST /sessions/{id}/reward`` a key of its own
            (``reward_key``) instead of the chat key, for agents whose key the model's own
            actions can read (an agent command in the sandbox the model's tool calls run in).

    Attributes:
        key: the chat key (``Authorization: Bearer <key>``).
        reward_key: the key a reward must be posted with (``key`` unless separate).
    """

    def __init__(self, session_id: str, settings: SessionSettings | None = None, *,
                 separate_reward_key: bool = False) -> None:
        self.session_id = session_id
        self.key = secrets.token_urlsafe(24)
        self.reward_key = secrets.token_urlsafe(24) if separate_reward_key else self.key
        self.settings = settings or SessionSettings()
        self._events: queue.Queue[AgentEvent] = queue.Queue()
        self._calls: list[AgentCall] = []
        self._lock = threading.Lock()
        self.closed = False

    def configure(self, settings: SessionSettings) -> None:
        self.settings = settings

    # --- HTTP side -----------------------------------------------------------------------
    def submit(self, request: ChatRequest) -> AgentCall:
        """Queue a chat call; the returned call's future resolves with its reply.

        Raises:
            GatewayError: 409 when the session is already closed.
        """
        call = AgentCall(request)
        with self._lock:
            if self.closed:
                raise GatewayError(409, f"session {self.session_id!r} is closed: its episode has ended",
                                   type="invalid_request_error", code="session_closed")
            self._calls.append(call)
            self._events.put(AgentEvent("call", call=call))
        return call

    def post_reward(self, value: float) -> None:
        """The agent (or its harness) reports the episode's reward."""
        with self._lock:
            if self.closed:
                raise GatewayError(409, f"session {self.session_id!r} is closed: its episode has ended",
                                   type="invalid_request_error", code="session_closed")
            self._events.put(AgentEvent("reward", value=float(value)))

    # --- agent runner side ---------------------------------------------------------------
    def agent_finished(self, value: Any) -> None:
        self._events.put(AgentEvent("finished", value=value))

    def agent_failed(self, error: BaseException) -> None:
        self._events.put(AgentEvent("failed", error=error))

    # --- env side ------------------------------------------------------------------------
    def next_event(self, timeout_s: float | None) -> AgentEvent:
        """The agent's next event, waiting up to ``timeout_s`` seconds (None: no limit).

        Raises:
            TimeoutError: nothing came in time.
        """
        try:
            return self._events.get(timeout=timeout_s)
        except queue.Empty:
            raise TimeoutError(f"the agent of session {self.session_id!r} did nothing for {timeout_s:g} s") from None

    def close(self) -> None:
        """End the session: calls still waiting get a 409 in OpenAI's error schema, new ones
        are refused, and a waiting ``next_event`` returns ``closed``. Idempotent."""
        with self._lock:
            if self.closed:
                return
            self.closed = True
            calls, self._calls = self._calls, []
            self._events.put(AgentEvent("closed"))
        for call in calls:
            call.refuse(GatewayError(409, f"session {self.session_id!r} was closed: its episode ended "
                                          "before this call was answered", type="invalid_request_error",
                                     code="session_closed"))

    def forget(self, call: AgentCall) -> None:
        """Drop an answered call from the list ``close`` refuses."""
        with self._lock:
            if call in self._calls:
                self._calls.remove(call)
