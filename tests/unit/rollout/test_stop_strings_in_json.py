"""Stop strings inside a tool call's JSON string (agentrl/rollout/stop_strings.py): a stop
string whose first character lies inside a JSON string of an open ``<tool_call>`` does not end
the turn; one outside does, the closing tag at any depth. On a one-character-per-id
tokenizer stand-in, for the cut (``cut_at_stop``, what the agent loop applies to a finished
turn) and the engine's per-step check (``VLLMEngine._stopped``), including a request that
continues a preempted turn (``stop_context_ids``)."""

from __future__ import annotations

import json

import pytest

from agentrl.rollout.stop_strings import cut_at_stop, first_stop_end, in_tool_call_string
from tests.helpers.engine_outputs import FakeOutput, stop_bookkeeping_engine

STOP = ["</tool_call>"]


def ids_of(text):
    return [ord(c) for c in text]


def decode(ids):
    return "".join(chr(i) for i in ids)


def call(command, name="bash"):
    return "<tool_call>" + json.dumps({"name": name, "arguments": {"command": command}}) + "</tool_call>"


def cut_text(text, stops=STOP):
    k = cut_at_stop(ids_of(text), decode, stops)
    return None if k is None else text[:k]


GREP = call("grep -n '</tool_call>' notes.md")


@pytest.mark.parametrize("turn, kept", [
    # the closing tag inside the command is part of it; the turn ends at the call's own tag
    (GREP + "\n<tool_response>imagined", GREP),
    # an escaped quote does not end the string, so the tag after it is still inside it
    (call('echo "</tool_call>"') + " more", call('echo "</tool_call>"')),
    # an escaped backslash right before the closing quote: the string does end there
    (call("dir C:\\") + "\nafter", call("dir C:\\")),
    (call("printf '\\\\\"</tool_call>\\\\'") + "x", call("printf '\\\\\"</tool_call>\\\\'")),
    # several calls: the first one's real closing tag ends the turn
    (GREP + "\n" + call("ls") + "\n", GREP),
    # an opening tag inside a string opens nothing
    (call("echo '<tool_call>'") + " tail", call("echo '<tool_call>'")),
    # text before the call: its quotes are not JSON
    ('He said "hi". ' + GREP + "!", 'He said "hi". ' + GREP),
    # unbalanced braces: the closing tag outside a string still ends the call
    ('<tool_call>{"name": "bash", "arguments": {"command": "ls"}</tool_call> then', '<tool_call>{"name": "bash", "arguments": {"command": "ls"}</tool_call>'),
])
def test_the_turn_ends_at_the_first_closing_tag_outside_a_json_string(turn, kept):
    assert cut_text(turn) == kept


def test_a_call_cut_inside_its_string_holds_no_stop_and_nothing_is_cut():
    open_call = '<tool_call>{"name": "bash", "arguments": {"command": "grep -n \'</tool_call>\' notes.md'
    assert cut_text(open_call) is None
    assert first_stop_end(open_call, STOP) is None


def test_every_configured_stop_string_is_ignored_inside_a_json_string_only():
    stops = ["</tool_call>", "\nObservation:", "<|im_end|>"]
    inside = call("printf '\\nObservation: <|im_end|>'")  # json.dumps escapes the newline: "\\n" in the text
    raw = '<tool_call>{"name": "bash", "arguments": {"command": "cat <<EOF\nObservation: x\nEOF"}}</tool_call>'
    assert cut_text(inside + "\nObservation: imagined", stops) == inside
    assert cut_text(raw + "\nObservation: imagined", stops) == raw  # a raw newline in the string too
    # outside a call, each one stops the turn where it is
    assert cut_text("thinking\nObservation: x", stops) == "thinking\nObservation:"
    assert cut_text("done<|im_end|>junk", stops) == "done<|im_end|>"
    # the first one that ends the turn wins, whatever the order of the list
    assert cut_text(raw + "<|im_end|>", stops[::-1]) == raw


def test_the_string_mask_marks_the_string_contents_only():
    text = '<tool_call>{"a": "x\\"y"}</tool_call>"z"'
    mask = in_tool_call_string(text)
    inside = "".join(c for c, m in zip(text, mask) if m)
    assert inside == 'ax\\"y'  # keys are strings too; the quotes are not, nor what follows the call
    text = '<tool_call>{"a": "xy"}</tool_call>"z"'
    assert "".join(c for c, m in zip(text, in_tool_call_string(text)) if m) == "axy"


def _engine():
    return stop_bookkeeping_engine(decode)


def test_the_engine_goes_on_past_a_closing_tag_inside_a_string_and_stops_at_the_real_one():
    text = GREP + "\n<tool_response>"
    ids = ids_of(text)
    first = text.index("</tool_call>") + len("</tool_call>")
    eng = _engine()
    eng._watch_stops("r", STOP, ())
    assert eng._stopped("r", FakeOutput(ids[:first])) is None  # the in-string tag: the request goes on
    assert eng._stops["r"].read == first
    got = eng._stopped("r", FakeOutput(ids))
    assert decode(got.token_ids) == GREP and got.finish_reason == "stop" and len(got.log_probs) == len(GREP)


def test_a_continued_request_reads_the_turn_before_its_preemption():
    """The preempted segment ended inside the command's string; the continuation's own ids
    start with ``</tool_call>``: with the turn's earlier ids as context it is in the string."""
    split = GREP.index("</tool_call>")
    before, after = ids_of(GREP[:split]), ids_of(GREP[split:] + "\nimagined")
    eng = _engine()
    eng._watch_stops("r.1", STOP, before)
    assert eng._stopped("r.1", FakeOutput(after[:len("</tool_call>") + 2])) is None
    got = eng._stopped("r.1", FakeOutput(after))
    assert decode(before + list(got.token_ids)) == GREP
    # the loop's cut of the whole turn agrees
    assert cut_at_stop(before + after, decode, STOP) == len(GREP)
