"""Parsing completions into actions: Hermes tool calls, fenced code, the parser registry and
the plain-text tool description (environments/tools.py)."""

from __future__ import annotations

import json

import pytest

from agentrl.errors import ConfigError, ModelOutputError, ToolParseError
from environments.tools import (
    FencedCodeParser,
    HermesToolParser,
    ToolCall,
    get_parser,
    python_tool_schema,
)
from agentrl.rollout.chat import render_tools_for_prompt

TOOLS = [python_tool_schema()]


@pytest.fixture
def hermes() -> HermesToolParser:
    return HermesToolParser(TOOLS)


def call(code: str, name: str = "python") -> str:
    return "<tool_call>" + json.dumps({"name": name, "arguments": {"code": code}}) + "</tool_call>"


def test_single_valid_call_with_text_around(hermes):
    text = "Let me check.\n" + call("print(1 + 1)") + "\nI will wait for the result."
    assert hermes.parse(text) == [ToolCall("python", {"code": "print(1 + 1)"})]


def test_two_calls_in_one_turn_keep_their_order(hermes):
    text = "First:\n" + call("print('a')") + "\nthen:\n" + call("print('b')")
    calls = hermes.parse(text)
    assert [c.arguments["code"] for c in calls] == ["print('a')", "print('b')"]
    assert all(c.name == "python" for c in calls)


def test_no_tool_call_gives_empty_list(hermes):
    assert hermes.parse("Here is my answer:\n```python\ndef f():\n    return 1\n```") == []
    assert hermes.has_tool_call("no call here") is False


def test_whitespace_and_newlines_inside_tags(hermes):
    text = '<tool_call>\n  {"name": "python",\n   "arguments": {"code": "x = 2\\nprint(x)"}}\n</tool_call>'
    assert hermes.parse(text)[0].arguments["code"] == "x = 2\nprint(x)"


def test_raw_newlines_inside_json_string_are_accepted(hermes):
    # Models often put the code's newlines in the JSON string unescaped.
    text = '<tool_call>{"name": "python", "arguments": {"code": "x = 2\nprint(x)"}}</tool_call>'
    assert hermes.parse(text)[0].arguments["code"] == "x = 2\nprint(x)"


def test_arguments_given_as_json_string_and_parameters_synonym(hermes):
    as_string = '<tool_call>{"name": "python", "arguments": "{\\"code\\": \\"print(3)\\"}"}</tool_call>'
    assert hermes.parse(as_string)[0].arguments == {"code": "print(3)"}
    synonym = '<tool_call>{"name": "python", "parameters": {"code": "print(4)"}}</tool_call>'
    assert hermes.parse(synonym)[0].arguments == {"code": "print(4)"}


def test_unclosed_final_call_accepted_when_it_is_one_json_object(hermes):
    # Generation stopped on the "</tool_call>" stop string, which is not in the text.
    text = 'Checking.\n<tool_call>\n{"name": "python", "arguments": {"code": "print(5)"}}\n'
    assert hermes.parse(text) == [ToolCall("python", {"code": "print(5)"})]


def test_unclosed_call_with_trailing_text_is_an_error(hermes):
    text = '<tool_call>{"name": "python", "arguments": {"code": "print(5)"}} and more words'
    with pytest.raises(ToolParseError, match="never closed"):
        hermes.parse(text)


def test_malformed_json_names_the_call_and_the_position(hermes):
    text = call("print(1)") + '<tool_call>{"name": "python", "arguments": {"code": "print(2)"</tool_call>'
    with pytest.raises(ToolParseError, match=r"tool call 2 is not valid JSON .*line 1 column") as info:
        hermes.parse(text)
    assert isinstance(info.value, ModelOutputError)  # the model's fault, not infra


def test_unknown_tool_lists_available_tools(hermes):
    with pytest.raises(ToolParseError, match=r"unknown tool 'bash'; available tools: \['python'\]"):
        hermes.parse(call("ls", name="bash"))


def test_missing_required_argument(hermes):
    text = '<tool_call>{"name": "python", "arguments": {"program": "print(1)"}}</tool_call>'
    with pytest.raises(ToolParseError, match="'code' is a required property"):
        hermes.parse(text)


def test_wrong_argument_type(hermes):
    text = '<tool_call>{"name": "python", "arguments": {"code": 42}}</tool_call>'
    with pytest.raises(ToolParseError, match=r"at \['code'\]: 42 is not of type 'string'"):
        hermes.parse(text)


def test_missing_arguments_object_and_name(hermes):
    with pytest.raises(ToolParseError, match='no "arguments" object'):
        hermes.parse('<tool_call>{"name": "python"}</tool_call>')
    with pytest.raises(ToolParseError, match='no string "name"'):
        hermes.parse('<tool_call>{"arguments": {"code": "1"}}</tool_call>')


def test_non_object_json_and_empty_call(hermes):
    with pytest.raises(ToolParseError, match="is a JSON list, expected an object"):
        hermes.parse('<tool_call>["python", "print(1)"]</tool_call>')
    with pytest.raises(ToolParseError, match="tool call 1 is empty"):
        hermes.parse("<tool_call>  </tool_call>")


def test_stray_closing_tag_and_nested_opening_tag(hermes):
    with pytest.raises(ToolParseError, match="without an opening <tool_call>"):
        hermes.parse('{"name": "python"}</tool_call>')
    with pytest.raises(ToolParseError, match="a new <tool_call> starts"):
        hermes.parse('<tool_call>{"name": "python", <tool_call>')


def test_parser_rejects_bad_tool_schemas():
    with pytest.raises(ConfigError, match="unique"):
        HermesToolParser([python_tool_schema(), python_tool_schema()])
    with pytest.raises(ConfigError, match="no function name"):
        HermesToolParser([{"type": "function", "function": {"description": "x"}}])
    bad = {"type": "function", "function": {"name": "f", "parameters": {"type": 3}}}
    with pytest.raises(ConfigError, match="invalid parameters schema"):
        HermesToolParser([bad])


def test_fenced_code_last_python_block_wins():
    parser = FencedCodeParser()
    text = (
        "Draft:\n```python\ndef f():\n    return 0\n```\n"
        "Some prose with `inline` code.\n```bash\nls\n```\n"
        "Final:\n```Python\ndef f():\n    return 1\n```\nDone."
    )
    assert parser.parse(text) == "def f():\n    return 1\n"
    assert len(parser.find_all(text)) == 2


def test_fenced_code_tags_unclosed_and_untagged():
    parser = FencedCodeParser()
    assert parser.parse("```py\nx = 1\n```") == "x = 1\n"
    assert parser.parse("```python3\nx = 2\n```") == "x = 2\n"
    assert parser.parse("```python\nx = 3\n") is None  # unclosed
    assert parser.parse("```\nx = 4\n```") is None  # untagged not accepted by default
    assert FencedCodeParser(allow_untagged=True).parse("```\nx = 4\n```") == "x = 4\n"
    assert parser.parse("just text") is None


def test_get_parser_registry():
    assert isinstance(get_parser("hermes", tools=TOOLS), HermesToolParser)
    assert isinstance(get_parser("fenced_code"), FencedCodeParser)
    expected = r"unknown parser 'xml'; expected one of \['fenced_code', 'hermes'\]"
    with pytest.raises(ConfigError, match=expected):
        get_parser("xml")


def test_render_tools_for_prompt_describes_arguments_and_call_format():
    text = render_tools_for_prompt(TOOLS)
    assert "Tool `python`: Run a Python 3 program" in text
    assert "- code (string, required): The complete Python program to run." in text
    example = text.splitlines()[-1]
    assert example == '<tool_call>{"name": "python", "arguments": {"code": "..."}}</tool_call>'
    # The example it shows parses with the parser the environment uses.
    assert HermesToolParser(TOOLS).parse(example) == [ToolCall("python", {"code": "..."})]
    assert render_tools_for_prompt([]) == ""


@pytest.mark.parametrize("tool, expected", [
    ({"type": "function"}, "has no function name"),
    ({"function": {"name": "x", "parameters": "oops"}}, "has parameters of type str, not a dict"),
    ({"function": {"name": "x", "parameters": {"properties": {"a": 1}}}}, "property 'a' whose schema is a int"),
])
def test_prompt_rendering_and_the_parser_refuse_a_bad_schema_with_the_one_shared_check(tool, expected):
    # agentrl.types.tool_function is the check both use (and StepInfo.from_info too).
    with pytest.raises(ConfigError, match=expected):
        render_tools_for_prompt([tool])
    with pytest.raises(ConfigError, match=expected):
        HermesToolParser([tool])


def test_tool_call_to_openai_message_entry():
    entry = ToolCall("python", {"code": "print(1)"}).to_openai("call_0")
    assert entry == {
        "id": "call_0",
        "type": "function",
        "function": {"name": "python", "arguments": {"code": "print(1)"}},
    }
