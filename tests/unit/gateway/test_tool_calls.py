"""A completion's text as an OpenAI assistant message (agentrl.gateway.tool_calls, hermes)."""

import json
import re

import pytest

from agentrl.errors import ConfigError
from agentrl.gateway.tool_calls import ParsedMessage, parse_tool_calls

BASH = {"type": "function", "function": {"name": "bash", "description": "Run a shell command.",
        "parameters": {"type": "object", "properties": {"command": {"type": "string"}}, "required": ["command"]}}}
PY = {"type": "function", "function": {"name": "python",
      "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}
TOOLS = [BASH, PY]
GREP_CLOSING_TAG = ("I'll search the notes.\n<tool_call>{\"name\": \"bash\", \"arguments\": "
                    "{\"command\": \"grep -n '</tool_call>' notes.md\"}}</tool_call>")


def args(call):
    return json.loads(call["function"]["arguments"])


def test_text_without_calls_is_content():
    assert parse_tool_calls("The answer is 4.", TOOLS) == ParsedMessage(content="The answer is 4.")


def test_two_calls_with_text_before_them():
    text = ('Running both.\n<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>\n'
            '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>')
    msg = parse_tool_calls(text, TOOLS)
    assert msg.content == "Running both.\n" and msg.error is None
    assert [c["function"]["name"] for c in msg.tool_calls] == ["python", "bash"]
    assert [args(c) for c in msg.tool_calls] == [{"code": "print(1)"}, {"command": "ls"}]
    for call in msg.tool_calls:
        assert re.fullmatch(r"call_[0-9a-f]{24}", call["id"]) and call["type"] == "function"
        assert isinstance(call["function"]["arguments"], str)
    assert msg.tool_calls[0]["id"] != msg.tool_calls[1]["id"]


def test_a_call_alone_has_no_content():
    msg = parse_tool_calls('<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>', TOOLS)
    assert msg.content is None and len(msg.tool_calls) == 1


def test_closing_tag_inside_a_string_argument_belongs_to_the_argument():
    msg = parse_tool_calls(GREP_CLOSING_TAG, TOOLS)
    assert msg.error is None and msg.content == "I'll search the notes.\n"
    (call,) = msg.tool_calls
    assert args(call) == {"command": "grep -n '</tool_call>' notes.md"}


def test_non_ascii_arguments_stay_readable():
    msg = parse_tool_calls('<tool_call>{"name": "bash", "arguments": {"command": "echo héllo"}}</tool_call>', TOOLS)
    assert "héllo" in msg.tool_calls[0]["function"]["arguments"]


@pytest.mark.parametrize("text, says", [
    ('<tool_call>{"name": "bash", "arguments": {"command": "ls"</tool_call>', "not valid JSON"),
    ('<tool_call>{"name": "rm_rf", "arguments": {}}</tool_call>', "unknown tool 'rm_rf'"),
    ('<tool_call>{"name": "bash", "arguments": {"command": 5}}</tool_call>', "invalid arguments"),
    ('{"name": "bash", "arguments": {"command": "ls"}}</tool_call>', "without an opening"),
])
def test_a_malformed_call_returns_the_whole_text_and_the_parsers_message(text, says):
    msg = parse_tool_calls(text, TOOLS)
    assert msg.content == text and msg.tool_calls == []
    assert says in msg.error


def test_no_tools_or_tool_choice_none_is_no_parsing():
    text = '<tool_call>{"name": "bash", "arguments": {"command": "ls"}}</tool_call>'
    assert parse_tool_calls(text, None) == ParsedMessage(content=text)
    assert parse_tool_calls(text, []) == ParsedMessage(content=text)
    assert parse_tool_calls(text, TOOLS, tool_choice="none") == ParsedMessage(content=text)


def test_a_bad_tool_schema_is_a_config_error():
    with pytest.raises(ConfigError, match="unique"):
        parse_tool_calls("x", [BASH, BASH])


def test_a_vllm_parser_needs_the_tokenizer():
    with pytest.raises(ConfigError, match="tokenizer"):
        parse_tool_calls("x", TOOLS, parser="llama3_json")
