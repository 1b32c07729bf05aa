"""The Hermes parser (environments/tools.py) reads each call as JSON, so tags inside a JSON
string belong to the string: a call whose argument holds ``</tool_call>`` is one valid call,
with escaped quotes, backslashes, several calls, and a closing tag after the object."""

from __future__ import annotations

import json

import pytest

from agentrl.errors import ToolParseError
from environments.tools import HermesToolParser, ToolCall

BASH = {"type": "function", "function": {"name": "bash", "parameters": {
    "type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"],
    "additionalProperties": False}}}


@pytest.fixture
def hermes() -> HermesToolParser:
    return HermesToolParser([BASH])


def call(command: str, *, pad: str = "") -> str:
    return f"<tool_call>{pad}" + json.dumps({"name": "bash", "arguments": {"command": command}}) + f"{pad}</tool_call>"


@pytest.mark.parametrize("command", [
    "grep -n '</tool_call>' notes.md",
    'echo "</tool_call>"',  # escaped quotes around the tag
    "printf '\\\\</tool_call>\\\\'",  # backslashes next to it
    "echo '<tool_call>' '</tool_call>' '<tool_call>{}</tool_call>'",  # both tags, a whole fake call
    "dir C:\\",  # a string that ends with a backslash, right before the closing tag
])
def test_a_tag_inside_an_argument_string_is_part_of_the_argument(hermes, command):
    for pad in ("", "\n"):
        assert hermes.parse("Let me look.\n" + call(command, pad=pad) + "\nwaiting") == [ToolCall("bash", {"command": command})]


def test_several_calls_with_tags_in_their_strings_keep_their_order(hermes):
    cmds = ["grep -c '</tool_call>' a.md", "ls", "sed -n '/<tool_call>/p' b.md"]
    text = "\n".join(call(c) for c in cmds)
    assert [c.arguments["command"] for c in hermes.parse(text)] == cmds


def test_a_raw_newline_and_a_tag_in_one_string(hermes):
    text = '<tool_call>{"name": "bash", "arguments": {"command": "cat <<EOF\n</tool_call>\nEOF"}}</tool_call>'
    assert hermes.parse(text)[0].arguments["command"] == "cat <<EOF\n</tool_call>\nEOF"


def test_the_last_call_cut_before_its_closing_tag_is_accepted_when_its_object_is_whole(hermes):
    whole = call("grep -n '</tool_call>' notes.md")[:-len("</tool_call>")]
    assert hermes.parse(whole + "\n") == [ToolCall("bash", {"command": "grep -n '</tool_call>' notes.md"})]


def test_a_call_cut_inside_its_string_is_still_an_error(hermes):
    cut = '<tool_call>{"name": "bash", "arguments": {"command": "grep -n \'</tool_call>'
    with pytest.raises(ToolParseError, match="tool call 1 is not valid JSON .*Unterminated string"):
        hermes.parse(cut)


def test_text_between_the_object_and_the_closing_tag_is_an_error_naming_it(hermes):
    text = call("ls")[:-len("</tool_call>")] + " please</tool_call>"
    with pytest.raises(ToolParseError, match=r"tool call 1 is not valid JSON \(Extra data"):
        hermes.parse(text)


def test_a_missing_brace_after_a_string_with_a_tag_names_the_real_fault(hermes):
    text = '<tool_call>{"name": "bash", "arguments": {"command": "grep \'</tool_call>\' x"}</tool_call>'
    with pytest.raises(ToolParseError, match=r"tool call 1 is not valid JSON \(Expecting ',' delimiter"):
        hermes.parse(text)
