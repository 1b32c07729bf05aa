"""Where stop strings end a turn (agentrl/rollout/stop_strings.py), on a one-character-per-id
tokenizer stand-in:

* the closing tag ``</tool_call>`` ends a turn only where it closes an open call: one in
  prose or reasoning before the call is text, and the Hermes parser reads the call after it;
* a turn that ran to its token limit with a stop string inside a JSON string of an open call
  (a missing closing quote) is cut there and ends as stopped, so the agent loop hands the
  malformed call to the environment, which scores it invalid;
* the engine's per-step check keeps the string state (``ToolCallScanner`` / ``StopWatch``)
  and equals a full scan of the text read so far, however the text is split.
"""

from __future__ import annotations

import json

import gymnasium as gym
from hypothesis import given, settings
from hypothesis import strategies as st

from agentrl.rollout.chat import ChatTokenizer
from agentrl.rollout.engine import Completion
from agentrl.rollout.loop import RolloutLimits, RolloutWorker
from agentrl.rollout.stop_strings import (
    StopCheck,
    StopWatch,
    ToolCallScanner,
    cut_at_stop,
    cut_at_stop_in_string,
    first_stop_end,
    in_tool_call_string,
)
from agentrl.types import EpisodeRequest, SamplingRecord, TerminationReason
from environments.tools import HermesToolParser, ToolCall

STOP = ["</tool_call>"]
BASH = {"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}


def ids_of(text):
    return [ord(c) for c in text]


def decode(ids, skip_special_tokens=False):
    return "".join(chr(i) for i in ids)


def call(command):
    return "<tool_call>" + json.dumps({"name": "bash", "arguments": {"command": command}}) + "</tool_call>"


GREP = "grep -n '</tool_call>' notes.md"
PROSE = "I'll grep for the literal `</tool_call>` tag.\n" + call(GREP)
THINK = "<think>search for '</tool_call>' in notes</think>" + call(GREP)
IMAGINED = "\n<tool_response>3: imagined</tool_response>"


def test_a_closing_tag_before_the_call_is_text_and_the_call_after_it_ends_the_turn():
    parser = HermesToolParser([BASH])
    for turn in (PROSE, THINK):
        k = cut_at_stop(ids_of(turn + IMAGINED), decode, STOP)
        assert k == len(turn) and first_stop_end(turn + IMAGINED, STOP) == len(turn)
        assert parser.parse(turn) == [ToolCall("bash", {"command": GREP})]  # parser and stop rule agree
    # no call at all: the tag in prose ends nothing, and the parser sees no call (not an error)
    prose = "The closing tag is </tool_call>. Done."
    assert cut_at_stop(ids_of(prose), decode, STOP) is None
    assert parser.parse(prose) == []
    # other stop strings keep their rule: outside a call's JSON strings they end the turn
    assert first_stop_end("say </tool_call> then\nObservation: x", STOP + ["\nObservation:"]) == len(
        "say </tool_call> then\nObservation:")


def test_the_engine_goes_on_past_a_closing_tag_in_prose():
    from agentrl.rollout.engine import VLLMEngine

    eng = object.__new__(VLLMEngine)  # only the stop-string bookkeeping, no vLLM
    eng.decode, eng._stops = decode, {}
    eng._watch_stops("r", STOP, ())
    ids = ids_of(PROSE + IMAGINED)
    first = PROSE.index("</tool_call>") + len("</tool_call>")

    class Out:
        def __init__(self, n):
            self.token_ids = ids[:n]
            self.logprobs = [{t: type("L", (), {"logprob": -0.5})()} for t in ids[:n]]
            self.finish_reason = None

    for n in range(1, first + 3):
        assert eng._stopped("r", Out(n)) is None
    got = next(c for n in range(first + 3, len(ids) + 1) if (c := eng._stopped("r", Out(n))) is not None)
    assert decode(got.token_ids) == PROSE and got.finish_reason == "stop"


UNTERMINATED = '<tool_call>{"name": "bash", "arguments": {"command": "cat notes.md}}</tool_call>'


def test_a_length_cut_turn_with_a_stop_string_inside_a_call_string_is_cut_there():
    text = "Let me read it. " + UNTERMINATED + IMAGINED + " and on and on"
    assert cut_at_stop(ids_of(text), decode, STOP) is None  # the tag is inside the open string
    assert cut_at_stop_in_string(ids_of(text), decode, STOP) == len("Let me read it. " + UNTERMINATED)
    # a closing tag in prose is not in a string: no such cut
    assert cut_at_stop_in_string(ids_of("about </tool_call> and more"), decode, STOP) is None


class ScriptedEngine:
    """Answers each request with ``script`` (one id per character), ``finish_reason`` length,
    as an engine without stop strings that ran to ``max_tokens`` would."""

    def __init__(self, script):
        self.script, self.queued = ids_of(script), []

    def add(self, request_id, prompt_ids, *, max_tokens, **kw):
        self.queued.append((request_id, max_tokens))

    def has_unfinished(self):
        return bool(self.queued)

    def step(self):
        out = [Completion(r, tuple(self.script[:m]), tuple(-0.25 for _ in self.script[:m]), "length", None)
               for r, m in self.queued]
        self.queued = []
        return out

    def abort(self, ids):
        self.queued = [q for q in self.queued if q[0] not in ids]


class CharChat:
    chat_template = "char"

    def apply_chat_template(self, msgs, tokenize=False, add_generation_prompt=False, tools=None):
        text = "".join(f"<{m['role']}>{m['content']}|" for m in msgs)
        return text + ("<assistant>" if add_generation_prompt else "")

    def encode(self, text, add_special_tokens=False):
        return ids_of(text)

    decode = staticmethod(decode)


class HermesEnv(gym.Env):
    def reset(self, *, seed=None, options=None):
        return "read notes.md", {}

    def step(self, action):
        try:
            HermesToolParser([BASH]).parse(action)
        except Exception as exc:  # the model's fault: an invalid action
            return f"error: {exc}", -0.5, False, False, {"invalid_action": True}
        return "ran", 1.0, True, False, {}


def test_the_agent_loop_scores_a_call_with_a_missing_quote_as_an_invalid_action():
    script = UNTERMINATED + IMAGINED + " more imagined output" * 4
    chat = ChatTokenizer(CharChat(), (ord("|"),))
    worker = RolloutWorker(ScriptedEngine(script), chat, lambda req: (HermesEnv(), None),
                           RolloutLimits(max_turns=1, max_new_tokens=len(script) - 3, max_context_tokens=4096,
                                         stop_strings=tuple(STOP)),
                           SamplingRecord(), env_workers=1)
    (ep,) = worker.run([EpisodeRequest("x/Hermes-v0", "t", 0, "g", 1)], 0)
    ep.validate()
    (turn,) = ep.turns
    assert turn.finish_reason == "stop" and decode(turn.completion_ids) == UNTERMINATED
    assert turn.invalid_action and turn.reward == -0.5 and "not valid JSON" in turn.observation_text
    assert len(turn.behavior_log_probs) == len(turn.completion_ids)
    assert sum(ep.loss_mask()) == len(ep.behavior_log_probs())
    assert ep.termination_reason == TerminationReason.MAX_TURNS


# texts built from the pieces that change the state, so random texts reach every branch
PIECES = ["<tool_call>", "</tool_call>", "<tool", "</tool_c", "<", "{", "}", "[", "]", '"', "\\", "\\\\",
          '\\"', "a", " ", "\n", ":", ",", "<|im_end|>", "Obs"]
TEXTS = st.lists(st.sampled_from(PIECES), max_size=40).map("".join)
STOPS = ["</tool_call>", "<|im_end|>", "\nObs", '"}']


@settings(max_examples=400, deadline=None)
@given(TEXTS, st.lists(st.integers(0, 60), max_size=8))
def test_the_incremental_scan_equals_the_full_scan_however_the_text_is_split(text, cuts):
    bounds = sorted({min(c, len(text)) for c in cuts} | {0, len(text)})
    scanner, watch, full = ToolCallScanner(), StopWatch(STOPS), ToolCallScanner()
    full.feed(text, final=True)
    stop_at = None
    for a, b in zip(bounds, bounds[1:]):
        final = b == len(text)
        scanner.feed(text[a:b], final=final)
        # the state after each piece is the full scan's state at the characters read
        part = ToolCallScanner()
        part.feed(text[:scanner.pos], final=True)
        assert part.state()[:4] == scanner.state()[:4] and part.flags == scanner.flags
        hit = watch.feed(text[a:b], final=final)
        # the watch reports exactly where first_stop_end of the text read so far first says
        expected = first_stop_end(text[:b], STOPS)
        if stop_at is None:
            assert hit == expected
            stop_at = hit
    assert scanner.state() == full.state() and scanner.flags == full.flags
    assert bytes(in_tool_call_string(text)) == bytes(f & 1 for f in full.flags)


@settings(max_examples=200, deadline=None)
@given(TEXTS, st.lists(st.integers(1, 60), max_size=8))
def test_the_engine_check_on_ids_equals_the_exact_cut(text, cuts):
    """Fed the ids in steps, ``StopCheck`` says "stop" at the first step whose ids hold the
    exact cut (``cut_at_stop`` of all ids)."""
    ids = ids_of(text)
    k = cut_at_stop(ids, decode, STOPS)
    check = StopCheck(STOPS)
    steps = sorted({min(c, len(ids)) for c in cuts} | {len(ids)})
    fired = next((n for n in steps if check.advance(decode, ids[:n], finished=n == len(ids))), None)
    assert fired == (None if k is None else next(n for n in steps if n >= k))
