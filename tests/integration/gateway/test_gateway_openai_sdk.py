"""Agents written with the official ``openai`` SDK, trained through the gateway: the real
SDK against the real HTTP server, with a real vLLM engine (tiny random model, SmolLM2's
tokenizer and chat template) stepped by the real rollout loop.

The tiny model never writes a tool call, so its completions are scripted
(tests/helpers/forced_tokens.py): every turn samples ``CALL`` (a ``bash`` call whose
command holds ``</tool_call>`` inside its JSON string) and the end-of-turn token.
"""

from __future__ import annotations

import json
import threading
from typing import Any

import gymnasium
import openai
import pytest

from agentrl.gateway import register_agent_env
from agentrl.gateway.server import SESSION_HEADER, gateway
from agentrl.rollout.loop import RolloutLimits, RolloutWorker
from agentrl.types import EpisodeRequest, SamplingRecord, TerminationReason
from environments.core import TextEnv
from tests.helpers.forced_tokens import ScriptedTokens
from tests.helpers.mid_turn_load import load_mid_turn
from tests.integration.gateway.conftest import COMMAND

pytestmark = pytest.mark.slow

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a bash command.", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
SYSTEM = "You are a test agent. Use the bash tool."


class EchoTask(TextEnv):
    """A task env without a sandbox: its tool answers with the command it got; its verifier
    scores 1 when a tool ran. Tasks ``t0``..``t3``."""

    uses_sandbox = False

    def __init__(self) -> None:
        super().__init__()
        self.ran: list[str] = []

    @classmethod
    def task_ids(cls, split: str = "train") -> list[str]:
        return [f"t{i}" for i in range(4)]

    def reset(self, *, seed=None, options=None):
        task_id = self._start_reset(seed, options)
        self._task_id, self._done, self.ran = task_id, False, []
        return f"Task {task_id}: find the closing tags in notes.md.", {
            "system_prompt": SYSTEM, "tools": [BASH], "task_id": task_id}

    def step(self, action):  # the in-process protocol is not used through the gateway
        raise NotImplementedError

    def run_tool_calls(self, calls):
        self.ran += [c.arguments["command"] for c in calls]
        return [f"ran: {c.arguments['command']}" for c in calls], False

    def score(self):
        self._done = True
        return (1.0 if self.ran else 0.0), bool(self.ran)


gymnasium.register(id="tests/GatewayEchoTask-v0", entry_point=EchoTask)

SEEN: dict[str, Any] = {}  # what the agents saw, by test
_LOCK = threading.Lock()


def _seen(key: str, value: Any) -> None:
    with _LOCK:
        SEEN.setdefault(key, []).append(value)


async def two_turn_agent(task, client: openai.AsyncOpenAI):
    """Call, run the tool calls with the task's tools, call again, stop (verifier reward)."""
    messages = list(task.messages)
    for _ in range(2):
        r = await client.chat.completions.create(model="policy", messages=messages, tools=task.tools,
                                                 logprobs=True, extra_body={"return_token_ids": True})
        _seen("two_turn", r)
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        if msg.tool_calls:
            messages.extend(task.call_tools(msg.tool_calls))
    return None


async def streaming_agent(task, client: openai.AsyncOpenAI):
    stream = await client.chat.completions.create(model="policy", messages=list(task.messages), tools=task.tools,
                                                  stream=True, stream_options={"include_usage": True},
                                                  extra_body={"return_token_ids": True})
    chunks = [c async for c in stream]
    _seen("stream", chunks)
    return 0.5


async def refusing_agent(task, client: openai.AsyncOpenAI):
    """Each refused parameter once (400 naming it), a wrong key, an unknown session, the
    header route; then one good call."""
    base = dict(model="policy", messages=list(task.messages))
    for extra in ({"n": 2}, {"top_logprobs": 2, "logprobs": True}, {"response_format": {"type": "json_object"}},
                  {"tool_choice": "required", "tools": task.tools}, {"temperature": 0.5}):
        try:
            await client.chat.completions.create(**base, **extra)
        except openai.BadRequestError as exc:
            _seen("refused", (sorted(extra)[0] if "logprobs" not in extra else "top_logprobs", exc.status_code,
                              exc.body))
    session_id = str(client.base_url).rstrip("/").split("/")[-2]
    root = str(client.base_url).split("/sessions/")[0]
    async with openai.AsyncOpenAI(base_url=str(client.base_url), api_key="wrong", max_retries=0) as bad:
        try:
            await bad.chat.completions.create(**base)
        except openai.AuthenticationError as exc:
            _seen("wrong_key", (exc.status_code, exc.body))
    async with openai.AsyncOpenAI(base_url=f"{root}/sessions/nope/v1", api_key=client.api_key, max_retries=0) as bad:
        try:
            await bad.chat.completions.create(**base)
        except openai.NotFoundError as exc:
            _seen("unknown_session", (exc.status_code, exc.body))
    async with openai.AsyncOpenAI(base_url=f"{root}/v1", api_key=client.api_key, max_retries=0,
                                  default_headers={SESSION_HEADER: session_id}) as by_header:
        models = await by_header.models.list()
        _seen("models", [m.id for m in models.data])
        r = await by_header.chat.completions.create(**base)
        _seen("by_header", r)
    return 1.0


async def compacting_agent(task, client: openai.AsyncOpenAI):
    """Two tool turns; at the third call it rewrites its history into a summary (as context
    compaction does), then goes on from the summary for one more turn."""
    messages = list(task.messages)
    for turn in range(4):
        if turn == 2:
            messages = [task.messages[0], {"role": "user", "content": "Summary so far: you ran grep twice. Go on."}]
        r = await client.chat.completions.create(model="policy", messages=messages, tools=task.tools)
        msg = r.choices[0].message
        messages.append(msg.model_dump(exclude_none=True))
        messages.extend(task.call_tools(msg.tool_calls))
    return None


async def sub_agent_agent(task, client: openai.AsyncOpenAI):
    """The main agent calls once, asks a sub-agent (a history of its own), then goes on with
    its own history and the sub-agent's answer as the tool result."""
    main = list(task.messages)
    r = await client.chat.completions.create(model="policy", messages=main, tools=task.tools)
    msg = r.choices[0].message
    main.append(msg.model_dump(exclude_none=True))
    sub = [{"role": "system", "content": "You are a sub-agent: answer in one line."},
           {"role": "user", "content": "Which file holds the notes?"}]
    answer = await client.chat.completions.create(model="policy", messages=sub)
    main += [{"role": "tool", "tool_call_id": tc.id, "content": "sub-agent: " + (answer.choices[0].message.content or "")}
             for tc in msg.tool_calls]
    await client.chat.completions.create(model="policy", messages=main, tools=task.tools)
    return 1.0


async def short_reply_agent(task, client: openai.AsyncOpenAI):
    """A short side call (max_tokens=4: e.g. a title) that is cut, then the real work."""
    title = await client.chat.completions.create(model="policy", messages=list(task.messages), max_tokens=4)
    _seen("short", title)
    messages = list(task.messages)
    r = await client.chat.completions.create(model="policy", messages=messages, tools=task.tools)
    _seen("short", r)
    return 1.0


register_agent_env("tests/ShortReplyAgent-v0", agent=short_reply_agent, task_env="tests/GatewayEchoTask-v0")
register_agent_env("tests/CompactingAgent-v0", agent=compacting_agent, task_env="tests/GatewayEchoTask-v0")
register_agent_env("tests/SubAgentAgent-v0", agent=sub_agent_agent, task_env="tests/GatewayEchoTask-v0")
register_agent_env("tests/TwoTurnAgent-v0", agent=two_turn_agent, task_env="tests/GatewayEchoTask-v0")
register_agent_env("tests/StreamingAgent-v0", agent=streaming_agent, task_env="tests/GatewayEchoTask-v0")
register_agent_env("tests/RefusingAgent-v0", agent=refusing_agent, task_env="tests/GatewayEchoTask-v0")


def run(scripted, env_id: str, n: int = 1, max_turns: int = 4, group: str = "g"):
    engine, chat = scripted
    worker = RolloutWorker(engine, chat, lambda req: (gymnasium.make(req.env_id, disable_env_checker=True), None),
                           RolloutLimits(max_turns=max_turns, max_new_tokens=96, max_context_tokens=2048),
                           SamplingRecord(temperature=1.0), env_timeout_s=120)
    reqs = [EpisodeRequest(env_id=env_id, task_id=f"t{i}", seed=i, group_id=group, sample_seed=i) for i in range(n)]
    return worker.run(reqs, policy_version=0), chat


def test_the_sdk_gets_tool_calls_token_ids_and_log_probs_and_the_episode_trains_on_them(scripted):
    SEEN.clear()
    (ep,), chat = run(scripted, "tests/TwoTurnAgent-v0")
    assert ep.error is None, ep.error
    assert ep.termination_reason == TerminationReason.ENV_TERMINATED and ep.total_reward == 1.0
    assert len(ep.turns) == 2
    r0, r1 = SEEN["two_turn"]
    for r, turn in zip((r0, r1), ep.turns):
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls"
        (tc,) = choice.message.tool_calls
        assert tc.function.name == "bash" and json.loads(tc.function.arguments) == {"command": COMMAND}
        assert choice.model_extra["token_ids"] == turn.completion_ids  # vLLM's field names
        assert [c.logprob for c in choice.logprobs.content] == pytest.approx(turn.behavior_log_probs)
        assert r.usage.completion_tokens == len(turn.completion_ids)
    # the whole prompt of turn 1 is turn 0's prompt and completion, then the tool message
    assert r1.model_extra["prompt_token_ids"] == ep.turns[0].prompt_ids + ep.turns[0].completion_ids + ep.turns[1].prompt_ids
    assert r0.model_extra["prompt_token_ids"] == ep.turns[0].prompt_ids
    assert ep.turns[0].tool_calls == 1 and ep.turns[1].tool_calls == 1
    assert ep.counters["gateway/calls"] == 2
    assert ep.counters.get("gateway/drift_tokens", 0) == 0  # the hermes rendering writes the call as sampled
    assert "ran: " + COMMAND in chat.tokenizer.decode(ep.turns[1].prompt_ids)
    (row,) = ep.rows()
    assert sum(row.loss_mask()) == sum(len(t.completion_ids) for t in ep.turns)


def test_streaming_carries_tool_calls_token_ids_and_usage(scripted):
    SEEN.clear()
    (ep,), _ = run(scripted, "tests/StreamingAgent-v0")
    assert ep.error is None, ep.error
    assert ep.total_reward == 0.5
    (chunks,) = SEEN["stream"]
    assert chunks[0].model_extra.get("prompt_token_ids") == ep.turns[0].prompt_ids
    ids = [i for c in chunks for ch in c.choices for i in (ch.model_extra.get("token_ids") or [])]
    assert ids == ep.turns[0].completion_ids
    calls = [tc for c in chunks for ch in c.choices for tc in (ch.delta.tool_calls or [])]
    assert calls and calls[0].function.name == "bash"
    assert json.loads("".join(tc.function.arguments or "" for tc in calls)) == {"command": COMMAND}
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == len(ep.turns[0].completion_ids)
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_refused_parameters_keys_and_sessions_answer_in_openais_error_schema(scripted):
    SEEN.clear()
    (ep,), _ = run(scripted, "tests/RefusingAgent-v0")
    assert ep.error is None, ep.error
    assert len(ep.turns) == 1 and ep.total_reward == 1.0  # the refused calls sampled nothing
    refused = {name: (status, body) for name, status, body in SEEN["refused"]}
    assert set(refused) == {"n", "top_logprobs", "response_format", "tool_choice", "temperature"}
    for name, (status, body) in refused.items():
        assert status == 400 and body["param"] == name and body["type"] == "invalid_request_error", (name, body)
    assert "1" in refused["temperature"][1]["message"]  # names the run's temperature
    ((status, body),) = SEEN["wrong_key"]
    assert status == 401 and body["type"] == "authentication_error"
    ((status, body),) = SEEN["unknown_session"]
    assert status == 404 and body["type"] == "not_found_error"
    assert SEEN["models"] == [["agentrl-policy"]]
    assert SEEN["by_header"][0].model_extra.get("prompt_token_ids") is None  # not asked for
    assert gateway().open_sessions == 0  # closed with their episodes


def test_a_compacted_history_and_a_sub_agent_fork_branches_that_train_as_rows_of_their_own(scripted):
    from agentrl.config import AlgorithmConfig
    from agentrl.credit import assign_credit

    (compacted, sub), chat = (run(scripted, "tests/CompactingAgent-v0", max_turns=6, group="c")[0][0],
                              run(scripted, "tests/SubAgentAgent-v0", group="s")[0][0]), scripted[1]
    for ep in (compacted, sub):
        assert ep.error is None, ep.error
    assert [t.branch for t in compacted.turns] == [0, 0, 1, 1]
    assert [t.branch for t in sub.turns] == [0, 1, 0]
    assert compacted.counters["gateway/forks"] == 1 and sub.counters["gateway/forks"] == 1
    # a branch's first turn is prompted with the whole rendering of its messages
    assert "Summary so far" in chat.tokenizer.decode(compacted.turns[2].prompt_ids)
    assert chat.tokenizer.decode(sub.turns[1].prompt_ids).count("sub-agent: answer in one line") == 1
    # the main agent's third call extends its own history: only the tool result is new
    assert "sub-agent: " in chat.tokenizer.decode(sub.turns[2].prompt_ids)
    assert SYSTEM not in chat.tokenizer.decode(sub.turns[2].prompt_ids)
    rows = sub.rows()
    assert [[s.turn for s in r.turns] for r in rows] == [[0, 2], [1]]
    assert [r.key for r in rows] == [sub.episode_id, f"{sub.episode_id}:b1"]
    res = assign_credit([compacted, sub], AlgorithmConfig(), SamplingRecord(temperature=1.0))
    assert res.batch.num_loss_tokens == sum(len(t.completion_ids) for e in (compacted, sub) for t in e.turns)
    assert len(res.batch.seq_lens) == 4  # two rows per episode


def test_a_call_cut_by_its_own_max_tokens_does_not_end_the_episode(scripted):
    SEEN.clear()
    (ep,), _ = run(scripted, "tests/ShortReplyAgent-v0", group="short")
    assert ep.error is None, ep.error
    title, work = SEEN["short"]
    assert title.choices[0].finish_reason == "length" and title.usage.completion_tokens == 4
    assert work.choices[0].finish_reason == "tool_calls"
    assert [t.finish_reason for t in ep.turns] == ["length", "stop"]
    assert ep.termination_reason == TerminationReason.ENV_TERMINATED and ep.total_reward == 1.0


def test_a_weight_load_during_a_session_keeps_it_alive_and_tokens_keep_their_versions(scripted):
    """``partial_rollout: continue``: the engine request of the agent's second call is
    preempted halfway, the weights load (version 1), the request goes on; the agent gets its
    whole reply, the episode trains with each token tagged with the version that sampled it."""
    from agentrl.rollout.session import RolloutSession

    SEEN.clear()
    engine, chat = scripted
    worker = RolloutWorker(engine, chat, lambda req: (gymnasium.make(req.env_id, disable_env_checker=True), None),
                           RolloutLimits(max_turns=4, max_new_tokens=96, max_context_tokens=2048),
                           SamplingRecord(temperature=1.0), env_timeout_s=120)
    req = EpisodeRequest(env_id="tests/TwoTurnAgent-v0", task_id="t0", seed=0, group_id="load", sample_seed=0)
    rid = f"{req.episode_id}:1"
    session = RolloutSession(worker, policy_version=0)
    try:
        session.submit([req])
        done, load, _ = load_mid_turn(session, engine, rid, 5)
    finally:
        session.shutdown()
    (ep,) = done
    assert ep.error is None, ep.error
    assert load.stats["preempted_requests"] == 1
    assert ep.turns[0].policy_versions == [0] * len(ep.turns[0].completion_ids)
    versions = ep.turns[1].policy_versions
    assert versions[0] == 0 and versions[-1] == 1 and sorted(versions) == versions
    r0, r1 = SEEN["two_turn"]
    assert r1.choices[0].model_extra["token_ids"] == ep.turns[1].completion_ids  # the whole turn, both versions
    assert r1.choices[0].message.tool_calls[0].function.name == "bash"


def test_a_call_written_unlike_the_templates_layout_counts_drift_and_keeps_the_sampled_ids(scripted):
    """The model writes its call compactly (no newlines, no spaces); the SDK sends it back as
    a parsed tool call, which a re-rendering gateway would write in the template's layout:
    ``gateway/drift_tokens`` counts the difference, and the next turn's prompt still starts
    with the ids as sampled."""
    engine, chat = scripted
    compact = '<tool_call>{"name":"bash","arguments":{"command":"ls"}}</tool_call>'
    saved = ScriptedTokens.script
    ScriptedTokens.script = tuple(chat.tokenizer.encode(compact, add_special_tokens=False)) + (2,)
    try:
        SEEN.clear()
        (ep,), _ = run(scripted, "tests/TwoTurnAgent-v0", group="drift")
    finally:
        ScriptedTokens.script = saved
    assert ep.error is None, ep.error
    assert ep.counters["gateway/drift_tokens"] > 0
    r1 = SEEN["two_turn"][1]
    assert r1.model_extra["prompt_token_ids"][: len(ep.turns[0].prompt_ids) + len(ep.turns[0].completion_ids)] == \
        ep.turns[0].prompt_ids + ep.turns[0].completion_ids


def test_episodes_of_a_group_that_reach_the_same_conversation_share_its_anchor(scripted):
    """GiGPO's anchor is the conversation the call holds; the random tool-call ids the gateway
    draws do not make two equal states differ."""
    engine, chat = scripted
    worker = RolloutWorker(engine, chat, lambda req: (gymnasium.make(req.env_id, disable_env_checker=True), None),
                           RolloutLimits(max_turns=4, max_new_tokens=96, max_context_tokens=2048),
                           SamplingRecord(temperature=1.0), env_timeout_s=120)
    reqs = [EpisodeRequest(env_id="tests/TwoTurnAgent-v0", task_id="t0", seed=0, group_id="anchor", index=i,
                           sample_seed=i) for i in range(2)]
    a, b = worker.run(reqs, policy_version=0)
    assert a.error is None and b.error is None
    assert [t.anchor for t in a.turns] == [t.anchor for t in b.turns]
    assert a.turns[0].anchor != a.turns[1].anchor
