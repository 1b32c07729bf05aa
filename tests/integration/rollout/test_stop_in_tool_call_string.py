"""Stop strings and cut replies on a real vLLM engine (tiny random model, SmolLM2's tokenizer).

The tiny model never writes a tool call, so its completions are scripted: a vLLM V1 logits
processor (tests/helpers/forced_tokens.py) leaves one id possible per step, and the engine
samples exactly ``<tool_call>{"name": "bash", "arguments": {"command": "grep -n
'</tool_call>' notes.md"}}</tool_call>`` followed by an imagined tool response. With the
stop string ``</tool_call>`` the turn goes on past the closing tag inside the JSON string
and ends at the real one: in the engine's own check, and in a turn preempted and continued
across a weight load with the split inside the string. The real Hermes parser reads the one
valid call. A closing tag in prose before the call does not end the turn either. A call
whose closing quote is missing runs to ``max_new_tokens`` in the engine and is cut at its
tag by the agent loop, then scored as an invalid call. Then a reply cut by the context
budget (termination ``context_limit``) is left out of the loss by overlong filtering, the
complete turn before it is not."""

from __future__ import annotations

import gymnasium as gym
import pytest

from agentrl.config import AlgorithmConfig
from agentrl.credit import assign_credit
from agentrl.rollout.chat import ChatTokenizer
from agentrl.rollout.loop import RolloutLimits, RolloutWorker
from agentrl.rollout.session import RolloutSession
from agentrl.types import EpisodeRequest, SamplingRecord, TerminationReason
from environments.tools import HermesToolParser
from tests.helpers.forced_tokens import ScriptedTokens
from tests.helpers.mid_turn_load import load_mid_turn

pytestmark = pytest.mark.slow

COMMAND = "grep -n '</tool_call>' notes.md"
CALL = '<tool_call>\n{"name": "bash", "arguments": {"command": "' + COMMAND + '"}}\n</tool_call>'
SCRIPT_TEXT = CALL + "\n<tool_response>\n3: the imagined output</tool_response>"
BASH = {"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
STOP_IDS = (2, 0)  # <|im_end|>, <|endoftext|>


class BashEnv(gym.Env):
    """Parses each action with the real Hermes parser; answers with the command it read.
    Reward 1 for a valid call on task ``t0``, 0 otherwise; ``turns`` steps."""

    def __init__(self, turns=1):
        self.turns, self.t = turns, 0
        self.parsed: list = []
        self.task = ""

    def reset(self, *, seed=None, options=None):
        self.t, self.task = 0, options["task_id"]
        return f"Task {self.task}: find the closing tags in notes.md.", {}

    def step(self, action):
        self.t += 1
        try:
            calls = HermesToolParser([BASH]).parse(action)
        except Exception as exc:  # the model's fault: shown as feedback, marked invalid
            self.parsed.append(exc)
            return f"error: {exc}", 0.0, self.t >= self.turns, False, {"invalid_action": True, "observation_role": "tool"}
        self.parsed.append(calls)
        reward = float(self.task == "t0")
        return calls[0].arguments["command"], reward, self.t >= self.turns, False, {"observation_role": "tool"}


@pytest.fixture(scope="module")
def tokenizer(tiny_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_path)


@pytest.fixture(scope="module")
def engine(tiny_model_path, tokenizer):
    from agentrl.rollout.engine import VLLMEngine

    ScriptedTokens.script = tuple(tokenizer.encode(SCRIPT_TEXT, add_special_tokens=False))
    ScriptedTokens.end_id = STOP_IDS[0]
    return VLLMEngine(tiny_model_path, dtype="float32", max_model_len=1024, seed=0, max_num_seqs=4,
                      kv_cache_gb=0.125, decode=tokenizer.decode, logits_processors=[ScriptedTokens])


class Spy:
    """The real engine, plus a record of what it returned and was asked."""

    def __init__(self, engine):
        self.engine, self.completions, self.adds = engine, [], []

    def add(self, request_id, prompt_ids, **kw):
        self.adds.append((request_id, list(prompt_ids), kw))
        self.engine.add(request_id, prompt_ids, **kw)

    def step(self):
        out = self.engine.step()
        self.completions.extend(out)
        return out

    def __getattr__(self, name):
        return getattr(self.engine, name)


def _worker(engine, tokenizer, envs, limits):
    it = iter(envs)
    spy = Spy(engine)
    return RolloutWorker(spy, ChatTokenizer(tokenizer, STOP_IDS), lambda req: (next(it), None), limits,
                         SamplingRecord(temperature=1.0), env_workers=2), spy


def _req(i=0):
    return EpisodeRequest("test/Bash", f"t{i}", seed=i, group_id="g0", sample_seed=5 + i, index=i)


def _real_stop(tokenizer):
    """Ids of the script up to and including the token completing the *second* closing tag
    (the call's own), and the index of the token that completes the first (in the string)."""
    script = list(ScriptedTokens.script)
    text = [tokenizer.decode(script[:k]) for k in range(len(script) + 1)]
    in_string = next(k for k in range(len(script) + 1) if text[k].count("</tool_call>") >= 1)
    real = next(k for k in range(len(script) + 1) if text[k].count("</tool_call>") >= 2)
    assert tokenizer.decode(script[:real]).endswith(CALL) and in_string < real
    return script[:real], in_string


def _check_turn(ep, tokenizer, env, kept):
    ep.validate()
    turn = ep.turns[0]
    assert turn.finish_reason == "stop" and turn.completion_ids == kept
    assert tokenizer.decode(turn.completion_ids) == CALL  # not cut at the tag inside the string
    assert len(turn.behavior_log_probs) == len(kept) and sum(ep.loss_mask()) == len(ep.behavior_log_probs())
    assert [c.arguments for c in env.parsed[0]] == [{"command": COMMAND}]  # one valid call
    assert not turn.invalid_action and turn.observation_text == COMMAND


def test_a_closing_tag_inside_the_argument_does_not_end_the_turn(engine, tokenizer):
    kept, in_string = _real_stop(tokenizer)
    env = BashEnv()
    worker, spy = _worker(engine, tokenizer, [env], RolloutLimits(1, 96, 1024, stop_strings=("</tool_call>",)))
    (ep,) = worker.run([_req()], policy_version=0)
    _check_turn(ep, tokenizer, env, kept)
    # the engine itself went on past the tag in the string and stopped at the real one
    (comp,) = spy.completions
    assert list(comp.token_ids) == kept and comp.finish_reason == "stop" and comp.stop_token_id is None
    assert len(kept) > in_string


def test_a_turn_preempted_inside_the_string_goes_on_past_the_tag_in_it(engine, tokenizer):
    """A weight load (``continue`` mode) preempts the request when its ids end right before
    the tag in the string; the continuation is a new engine request whose own first ids
    are ``</tool_call>``, read after the turn's earlier ids (``stop_context_ids``)."""
    kept, in_string = _real_stop(tokenizer)
    # the partial ends inside the string right before the tag: the continuation's own text
    # starts with the whole "</tool_call>"
    split = next(k for k in range(in_string, 0, -1) if tokenizer.decode(kept[k:]).startswith("</tool_call>'"))
    env = BashEnv()
    worker, spy = _worker(engine, tokenizer, [env], RolloutLimits(1, 96, 1024, stop_strings=("</tool_call>",)))
    session = RolloutSession(worker, policy_version=0)
    try:
        session.submit([_req()])
        rid = f"{_req().episode_id}:0"
        done, load, sampled = load_mid_turn(session, engine, rid, split, max_steps=200, wait_s=1.0)
        assert sampled == split
    finally:
        session.shutdown()
    (ep,) = done
    assert load.stats["preempted_requests"] == 1
    _check_turn(ep, tokenizer, env, kept)
    assert ep.turns[0].policy_versions == [0] * split + [1] * (len(kept) - split)
    cont = next(a for a in spy.adds if a[0] == f"{rid}.1")
    assert cont[2]["stop_context_ids"] == kept[:split] and cont[2]["max_tokens"] == 96 - split


def test_a_reply_cut_by_the_context_budget_leaves_the_loss_and_the_complete_turn_stays(engine, tokenizer):
    """Two turns: the first complete (the stop string), the second cut because the context
    has 5 tokens of room left (``max_new_tokens`` is 96): termination ``context_limit``,
    its last turn's ``finish_reason`` ``length``; overlong filtering takes that turn out."""
    stop = ("</tool_call>",)
    roomy_env, cut_env = BashEnv(turns=2), BashEnv(turns=2)
    worker, _ = _worker(engine, tokenizer, [roomy_env], RolloutLimits(2, 96, 1024, stop_strings=stop))
    (roomy,) = worker.run([_req(1)], policy_version=0)
    assert roomy.termination_reason == TerminationReason.ENV_TERMINATED and len(roomy.turns) == 2
    t0, t1 = roomy.turns
    budget = len(t0.prompt_ids) + len(t0.completion_ids) + len(t1.prompt_ids) + 5
    worker, spy = _worker(engine, tokenizer, [cut_env], RolloutLimits(2, 96, budget, stop_strings=stop))
    (cut,) = worker.run([_req(0)], policy_version=0)
    assert [t.finish_reason for t in cut.turns] == ["stop", "length"] and len(cut.turns[1].completion_ids) == 5
    assert cut.termination_reason == TerminationReason.CONTEXT_LIMIT and cut.truncated
    assert spy.adds[-1][2]["max_tokens"] == 5

    eps = [cut, roomy]  # one group: rewards 1 (t0) and 0 (t1)
    plain = assign_credit(eps, AlgorithmConfig(), SamplingRecord(temperature=1.0))
    res = assign_credit(eps, AlgorithmConfig(overlong_filtering=True), SamplingRecord(temperature=1.0))
    assert plain.turn_advantages[cut.episode_id][1] > 0  # the cut reply would have been reinforced
    assert res.turn_advantages[cut.episode_id] == [plain.turn_advantages[cut.episode_id][0], None]
    assert res.turn_advantages[roomy.episode_id] == plain.turn_advantages[roomy.episode_id]
    assert res.batch.num_loss_tokens == plain.batch.num_loss_tokens - 5
    assert res.metrics["filter/overlong_filtered_turns_context_limit"] == 1.0


def _scripted_run(tokenizer, engine, text, max_new_tokens):
    """One turn of ``BashEnv`` on the engine scripted to sample ``text`` (then the stop token)."""
    saved = ScriptedTokens.script
    ScriptedTokens.script = tuple(tokenizer.encode(text, add_special_tokens=False))
    try:
        env = BashEnv()
        limits = RolloutLimits(1, max_new_tokens, 1024, stop_strings=("</tool_call>",))
        worker, spy = _worker(engine, tokenizer, [env], limits)
        (ep,) = worker.run([_req()], policy_version=0)
    finally:
        ScriptedTokens.script = saved
    ep.validate()
    assert sum(ep.loss_mask()) == len(ep.behavior_log_probs())
    return ep, env, spy


def test_a_closing_tag_in_prose_before_the_call_does_not_end_the_turn(engine, tokenizer):
    prose = "I'll grep for the literal `</tool_call>` tag.\n"
    ep, env, spy = _scripted_run(tokenizer, engine, prose + SCRIPT_TEXT, 96)
    (turn,) = ep.turns
    assert turn.finish_reason == "stop" and tokenizer.decode(turn.completion_ids) == prose + CALL
    assert [c.arguments for c in env.parsed[0]] == [{"command": COMMAND}] and not turn.invalid_action
    (comp,) = spy.completions  # the engine itself went on past the tag in the prose
    assert comp.finish_reason == "stop" and list(comp.token_ids) == turn.completion_ids


def test_a_call_with_a_missing_quote_that_runs_to_the_limit_is_cut_at_its_tag_and_scored_invalid(engine, tokenizer):
    """The closing quote of the command is missing, so the call's ``</tool_call>`` lies in the
    open string: the engine does not stop there and runs into the imagined response until
    ``max_new_tokens``; the agent loop cuts the turn at that tag and ends it as stopped, and
    the environment's parser scores the call as invalid (not a cut reply earning 0)."""
    unterminated = '<tool_call>\n{"name": "bash", "arguments": {"command": "cat notes.md}}\n</tool_call>'
    text = unterminated + "\n<tool_response>\n3: the imagined output, on and on and on</tool_response>"
    n = len(tokenizer.encode(text, add_special_tokens=False))
    ep, env, spy = _scripted_run(tokenizer, engine, text, n - 2)
    (comp,) = spy.completions
    assert comp.finish_reason == "length" and len(comp.token_ids) == n - 2  # the engine ran to the limit
    (turn,) = ep.turns
    kept = tokenizer.decode(turn.completion_ids)
    assert turn.finish_reason == "stop" and kept.startswith(unterminated) and len(kept) < len(unterminated) + 4
    assert list(comp.token_ids[:len(turn.completion_ids)]) == turn.completion_ids  # a prefix of the sampled ids
    assert turn.behavior_log_probs == list(comp.log_probs[:len(turn.completion_ids)])
    assert isinstance(env.parsed[0], Exception) and "not valid JSON" in str(env.parsed[0])
    assert turn.invalid_action and ep.termination_reason == TerminationReason.ENV_TERMINATED
