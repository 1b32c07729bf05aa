"""Tool-call parsing on real SmolLM2-135M-Instruct outputs (tests/fixtures/smollm2_tool_calls.json,
made by scripts/make_tool_call_fixtures.py with vLLM on CPU, fixed seeds): valid calls, two
calls in one turn, malformed JSON, unknown tools, wrong arguments, unclosed tags."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from agentrl.errors import ToolParseError
from environments.tools import HermesToolParser

FIXTURE = Path(__file__).resolve().parents[2] / "fixtures" / "smollm2_tool_calls.json"
TOOLS = [
    {"type": "function", "function": {"name": "python", "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}},
    {"type": "function", "function": {"name": "bash", "parameters": {"type": "object", "properties": {"cmd": {"type": "string"}}, "required": ["cmd"]}}},
]


@pytest.fixture(scope="module")
def completions():
    return [r["completion"] for r in json.loads(FIXTURE.read_text())["completions"]]


@pytest.fixture(scope="module")
def parser():
    return HermesToolParser(TOOLS)


def test_a_well_formed_call(completions, parser):
    (call,) = parser.parse(completions[1])
    assert call.name == "python" and call.arguments == {"code": "print(2 + 3)"}


def test_two_calls_in_one_turn(completions, parser):
    calls = parser.parse(completions[12])
    assert [(c.name, c.arguments) for c in calls] == [("python", {"code": "print(1, 2)"}), ("bash", {"cmd": "ls"})]


@pytest.mark.parametrize("index, needle", [
    (0, "not valid JSON"),            # unterminated string inside the JSON
    (36, "unknown tool 'math'"),      # a tool that does not exist
    (3, "invalid arguments"),         # python called with num1/num2 instead of code
    (10, "never closed"),             # <tool_call> with no closing tag
])
def test_malformed_real_outputs_raise_a_named_parse_error(completions, parser, index, needle):
    with pytest.raises(ToolParseError) as exc:
        parser.parse(completions[index])
    assert needle in str(exc.value)


def test_every_real_output_either_parses_or_names_its_problem(completions, parser):
    kinds = Counter()
    for text in completions:
        try:
            calls = parser.parse(text)
            assert calls and all(c.name in ("python", "bash") for c in calls)
            kinds[f"ok{len(calls)}"] += 1
        except ToolParseError as exc:
            assert str(exc).startswith("tool call ")
            kinds["error"] += 1
    assert kinds["ok1"] > 0 and kinds["ok2"] > 0 and kinds["error"] > 0
