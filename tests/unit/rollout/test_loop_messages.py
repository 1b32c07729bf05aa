"""The agent loop with an environment that speaks chat messages, as the gateway's
env-rendezvous does (agentrl/rollout/loop.py): a scripted env and a scripted engine that
records every ``add``.

Shown: the reset's ``messages`` rendered as the first prompt; a step's ``messages`` delta-
tokenized onto the same branch; a fork (a new ``branch``) prompted with the full rendering
and nothing before it; a return to branch 0 prompted with branch 0's ids only (and the
context budget counted per branch); ``receive_completion(turn, prompt_ids)`` before each
``env.step``; ``max_new_tokens`` and ``stop_strings`` reaching ``engine.add`` for the next
turn only (and surviving a preemption); ``tool_calls`` and ``counters`` recorded; and the
refusals (``per_step`` mode, a new branch without messages)."""

from __future__ import annotations

import time

import gymnasium as gym
import pytest

from agentrl.rollout.chat import ChatTokenizer
from agentrl.rollout.engine import Completion
from agentrl.rollout.loop import RolloutLimits, RolloutWorker, rollout_metrics
from agentrl.rollout.session import RolloutSession, WeightLoad
from agentrl.types import EpisodeRequest, SamplingRecord, StepInfo, TerminationReason
from tests.helpers.char_tokenizer import STOP, CharTokenizer



class RecordingEngine:
    """One token per request per step (ids ``10, 11, ...``), ``STOP`` as the ``answer_len``-th."""

    def __init__(self, answer_len=3):
        self.answer_len = answer_len
        self.live: dict[str, dict] = {}
        self.adds: list[dict] = []

    def add(self, request_id, prompt_ids, *, sampling, max_tokens, stop_token_ids, seed=None, **stop_kwargs):
        self.adds.append({"id": request_id, "prompt": list(prompt_ids), "max_tokens": max_tokens, **stop_kwargs})
        self.live[request_id] = {"ids": [], "max": max_tokens}

    def has_unfinished(self):
        return bool(self.live)

    def step(self):
        time.sleep(0.002)
        done = []
        for rid, r in list(self.live.items()):
            n = len(r["ids"])
            r["ids"].append(STOP if n + 1 >= self.answer_len else 10 + n)
            if r["ids"][-1] == STOP or len(r["ids"]) >= r["max"]:
                del self.live[rid]
                reason = "stop" if r["ids"][-1] == STOP else "length"
                done.append(Completion(rid, tuple(r["ids"]), (-0.5,) * len(r["ids"]), reason, None))
        return done

    def abort(self, ids):
        for rid in ids:
            self.live.pop(rid, None)

    def preempt(self, ids):
        out = [Completion(rid, tuple(self.live[rid]["ids"]), (-0.5,) * len(self.live[rid]["ids"]), "abort", None)
               for rid in ids]
        self.abort(ids)
        return out


RESET = ({"role": "system", "content": "You are an agent."}, {"role": "user", "content": "Fix the bug."})
TOOL = ({"role": "tool", "content": "file.py: 3 lines", "tool_call_id": "c1"},)
FORK = (RESET[0], {"role": "user", "content": "A subagent's task, with a long description " + "." * 60})
BACK = ({"role": "user", "content": "The subagent is done."},)


class MessagesEnv(gym.Env):
    """Scripted: reset gives ``RESET``; steps give ``script[k]`` (a StepInfo), the last one ends
    the episode. ``receive_completion`` records what it was handed."""

    def __init__(self, reset_info: StepInfo, script: list[StepInfo]):
        self.reset_info, self.script, self.k = reset_info, script, 0
        self.received: list[tuple] = []
        self.actions: list[str] = []

    def reset(self, *, seed=None, options=None):
        self.k = 0
        return "", self.reset_info.to_info()

    def receive_completion(self, turn, prompt_ids):
        self.received.append((turn, prompt_ids))

    def step(self, action):
        self.actions.append(action)
        info, self.k = self.script[self.k], self.k + 1
        done = self.k == len(self.script)
        return "", float(done), done, False, info.to_info()


def run(env, *, prompt_mode="full_history", max_context_tokens=4096, max_new_tokens=8, wrap=False):
    engine = RecordingEngine()
    chat = ChatTokenizer(CharTokenizer(), (STOP,))
    factory = (lambda req: (gym.Wrapper(env) if wrap else env, None))
    worker = RolloutWorker(engine, chat, factory,
                           RolloutLimits(max_turns=8, max_new_tokens=max_new_tokens, max_context_tokens=max_context_tokens,
                                         prompt_mode=prompt_mode), SamplingRecord(), env_workers=1)
    ep, = worker.run([EpisodeRequest("x/Messages-v0", "t", 0, "g", sample_seed=1, run_id="r", iteration=1)], 0)
    return ep, engine, chat


def _script():
    reset = StepInfo(messages=RESET, max_new_tokens=3, stop_strings=("</answer>",), counters={"gateway/requests": 1})
    return reset, [
        StepInfo(messages=TOOL, tool_calls=2, counters={"gateway/requests": 1}),  # turn 0 -> delta on branch 0
        StepInfo(messages=FORK, branch=1, counters={"gateway/requests": 1, "gateway/forks": 1}),  # turn 1 -> fork
        StepInfo(messages=BACK, branch=0, tool_calls=0, counters={"gateway/requests": 1}),  # turn 2 -> back to 0
        StepInfo(tool_calls=1),  # turn 3 -> the end
    ]


def test_messages_delta_fork_and_return_to_branch_0():
    reset, script = _script()
    env = MessagesEnv(reset, script)
    fork_len = len(ChatTokenizer(CharTokenizer(), (STOP,)).prompt_ids(list(FORK)))
    ep, engine, chat = run(env, max_context_tokens=fork_len + 5, wrap=True)
    assert ep.termination_reason == TerminationReason.ENV_TERMINATED, ep.error
    ep.validate()
    t0, t1, t2, t3 = ep.turns
    assert [t.branch for t in ep.turns] == [0, 0, 1, 0]
    # reset: the messages are the whole first prompt
    assert t0.prompt_ids == chat.prompt_ids(list(RESET)) == engine.adds[0]["prompt"]
    # same branch: the delta after the completion, prefixed by the branch's ids
    assert t1.prompt_ids == chat.delta_ids(list(TOOL), completion_ended_with_stop=True)
    assert engine.adds[1]["prompt"] == t0.prompt_ids + t0.completion_ids + t1.prompt_ids
    # a fork: the full rendering, nothing before it
    assert t2.prompt_ids == chat.prompt_ids(list(FORK)) == engine.adds[2]["prompt"]
    # back to branch 0: branch 0's ids (turns 0 and 1) + the delta, never the fork's
    assert t3.prompt_ids == chat.delta_ids(list(BACK), completion_ended_with_stop=True)
    assert engine.adds[3]["prompt"] == ep.token_ids(0)[:-len(t3.completion_ids)]
    assert engine.adds[3]["prompt"] == t0.prompt_ids + t0.completion_ids + t1.prompt_ids + t1.completion_ids + t3.prompt_ids
    # the context budget is per branch: the fork has 5 tokens of room, branch 0 its own
    room = [fork_len + 5 - len(a["prompt"]) for a in engine.adds]
    assert [a["max_tokens"] for a in engine.adds] == [min(3, room[0]), min(8, room[1]), 5, min(8, room[3])]
    assert room[3] >= 8 and len(ep.token_ids()) + len(t3.prompt_ids) > fork_len + 5  # all turns would not fit
    # max_new_tokens and stop_strings of the reset apply to turn 0 only
    assert engine.adds[0]["stop_strings"] == ("</answer>",)
    assert all("stop_strings" not in a for a in engine.adds[1:])
    # receive_completion: each turn just sampled and its engine prompt, before its env.step
    assert [r[0] for r in env.received] == ep.turns
    assert [r[1] for r in env.received] == [a["prompt"] for a in engine.adds]
    assert len(env.actions) == 4
    # tool calls on the turn whose action made them; counters summed over reset and steps
    assert [t.tool_calls for t in ep.turns] == [2, 0, 0, 1]
    assert ep.counters == {"gateway/requests": 4.0, "gateway/forks": 1.0}
    rows = ep.rows()
    assert [r.key for r in rows] == [ep.episode_id, f"{ep.episode_id}:b1"]
    assert [[s.turn for s in r.turns] for r in rows] == [[0, 1, 3], [2]]
    m = rollout_metrics([ep])
    assert m["rollout/tool_calls"] == 3.0 and m["rollout/episodes_without_tool_calls"] == 0.0
    assert m["gateway/requests"] == 4.0 and m["gateway/forks"] == 1.0


def test_a_reply_cut_by_its_own_cap_is_a_short_turn_and_the_episode_goes_on():
    """A cut by the turn's own cap (an agent's max_tokens, below rollout.max_new_tokens) is a
    short answer it asked for: the env gets it and the episode goes on; a cut by the run's
    budget still ends the episode (C08a)."""
    env = MessagesEnv(StepInfo(messages=RESET, max_new_tokens=2), [StepInfo(messages=TOOL), StepInfo()])
    ep, engine, _ = run(env)
    assert engine.adds[0]["max_tokens"] == 2 and ep.turns[0].finish_reason == "length"
    assert len(env.actions) == 2 and len(ep.turns) == 2
    assert ep.termination_reason == TerminationReason.ENV_TERMINATED and ep.total_reward == 1.0
    env = MessagesEnv(StepInfo(messages=RESET), [StepInfo(messages=TOOL), StepInfo()])
    ep, _, _ = run(env, max_new_tokens=2)  # the run's own budget
    assert len(ep.turns) == 1 and ep.termination_reason == TerminationReason.LENGTH


def test_a_cap_above_rollout_max_new_tokens_is_held_to_it():
    env = MessagesEnv(StepInfo(messages=RESET, max_new_tokens=500), [StepInfo()])
    _, engine, _ = run(env)
    assert engine.adds[0]["max_tokens"] == 8


def test_metrics_count_episodes_without_tool_calls_and_sum_counters():
    env = MessagesEnv(StepInfo(messages=RESET, counters={"gateway/forks": 2}), [StepInfo(tool_calls=0)])
    ep, _, _ = run(env)
    other = MessagesEnv(StepInfo(messages=RESET, counters={"gateway/forks": 1}), [StepInfo(tool_calls=4)])
    ep2, _, _ = run(other)
    m = rollout_metrics([ep, ep2])
    assert m["rollout/tool_calls"] == 4.0 and m["rollout/episodes_without_tool_calls"] == 1.0
    assert m["gateway/forks"] == 3.0


@pytest.mark.parametrize("reset, script, where", [
    (StepInfo(messages=RESET), [StepInfo()], "messages"),
    (StepInfo(), [StepInfo(messages=TOOL), StepInfo()], "messages"),
    (StepInfo(), [StepInfo(branch=1), StepInfo()], "branch"),
])
def test_messages_or_a_branch_in_per_step_mode_end_the_episode_as_infra_error(reset, script, where):
    ep, engine, _ = run(MessagesEnv(reset, script), prompt_mode="per_step")
    assert ep.termination_reason == TerminationReason.INFRA_ERROR and ep.error["type"] == "EnvError"
    assert f"info['{where}']" in ep.error["message"] and "per_step" in ep.error["message"]
    assert "full_history" in ep.error["message"]
    assert len(engine.adds) == (0 if where == "messages" and not script[0].messages else 1)


def test_a_new_branch_without_messages_ends_the_episode_as_infra_error():
    ep, _, _ = run(MessagesEnv(StepInfo(messages=RESET), [StepInfo(branch=3), StepInfo()]))
    assert ep.termination_reason == TerminationReason.INFRA_ERROR and ep.error["type"] == "EnvError"
    assert "info['branch']=3 starts a new branch but gives no info['messages']" in ep.error["message"]


def test_a_turns_stop_strings_survive_a_preemption():
    env = MessagesEnv(StepInfo(messages=RESET, stop_strings=("</answer>",)), [StepInfo()])
    engine = RecordingEngine(answer_len=6)
    worker = RolloutWorker(engine, ChatTokenizer(CharTokenizer(), (STOP,)), lambda req: (env, None),
                           RolloutLimits(max_turns=4, max_new_tokens=8, max_context_tokens=4096, stop_strings=("<x>",)),
                           SamplingRecord(), env_workers=1)
    session = RolloutSession(worker, 0)
    try:
        session.submit([EpisodeRequest("x/Messages-v0", "t", 0, "g", sample_seed=1)])
        for _ in range(200):
            session.step_once(wait_s=0.05)
            if any(len(r["ids"]) >= 2 for r in engine.live.values()):
                break
        session.request_load(WeightLoad(apply=lambda: "in_place", policy_version=1, mode="continue"))
        done = []
        for _ in range(200):
            done += session.step_once(wait_s=0.05)
            if done:
                break
    finally:
        session.shutdown()
    assert done and done[0].termination_reason == TerminationReason.ENV_TERMINATED
    first, again = engine.adds[0], engine.adds[1]
    assert first["stop_strings"] == again["stop_strings"] == ("<x>", "</answer>")
    assert again["id"].endswith(".1") and again["stop_context_ids"] == again["prompt"][len(first["prompt"]):]
