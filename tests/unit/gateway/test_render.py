"""Messages for the model's chat template, and the session-prefix test (agentrl.gateway.render),
with SmolLM2's real template (no ``tools=``, no ``tool_calls``) and a ChatML one that renders both."""

import json

import pytest

from agentrl.gateway.protocol import parse_request
from agentrl.gateway.render import (
    hermes_call_text,
    is_extension,
    messages_equal,
    renders_tool_calls,
    template_messages,
)
from agentrl.gateway.tool_calls import parse_tool_calls
from agentrl.rollout.chat import ChatTokenizer, render_tools_for_prompt

PY = {"type": "function", "function": {"name": "python", "description": "Run Python.",
      "parameters": {"type": "object", "properties": {"code": {"type": "string"}}, "required": ["code"]}}}
RUN = {"temperature": 1.0, "top_p": 1.0, "top_k": -1, "max_new_tokens": 64}
CALL_TEXT = 'Running it.\n<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>'
# ChatML that renders tools= and an assistant's tool_calls (as Qwen-style templates do)
NATIVE_TEMPLATE = (
    "{% if tools %}<|im_start|>system\nTOOLS:{% for t in tools %} {{ t.function.name }}{% endfor %}"
    "<|im_end|>\n{% endif %}"
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}"
    "{% for tc in m.tool_calls or [] %}\n<call>{{ tc.function.name }} {{ tc.function.arguments | tojson }}</call>"
    "{% endfor %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


@pytest.fixture(scope="module")
def chat(smollm2_tokenizer):
    return ChatTokenizer(smollm2_tokenizer, (2, 0))


@pytest.fixture(scope="module")
def native_chat(smollm2_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm2_path)
    tok.chat_template = NATIVE_TEMPLATE
    return ChatTokenizer(tok, (2, 0))


def conversation():
    """A session as a client sends it back: the assistant's call, then the tool's result."""
    call = parse_tool_calls(CALL_TEXT, [PY])
    body = {"messages": [
        {"role": "system", "content": "You solve tasks."},
        {"role": "user", "content": "What does print(1) print?"},
        {"role": "assistant", "content": call.content, "tool_calls": call.tool_calls},
        {"role": "tool", "tool_call_id": call.tool_calls[0]["id"], "content": "1\n"},
    ], "tools": [PY]}
    return parse_request(body, **RUN)


def test_smollm2_renders_neither_tools_nor_tool_calls(chat, smollm2_tokenizer):
    assert not chat.renders_tools and not renders_tool_calls(smollm2_tokenizer)
    assert renders_tool_calls(smollm2_tokenizer) is False  # cached


def test_tools_and_calls_go_into_the_text_for_smollm2(chat, smollm2_tokenizer):
    req = conversation()
    msgs = template_messages(req.messages, req.tools, chat)
    assert [m["role"] for m in msgs] == ["system", "user", "assistant", "tool"]
    assert msgs[0]["content"] == "You solve tasks.\n\n" + render_tools_for_prompt([PY])
    assert msgs[2] == {"role": "assistant", "content": CALL_TEXT}  # the model's own text, reproduced
    assert msgs[3] == {"role": "tool", "content": "1\n", "tool_call_id": req.messages[3]["tool_call_id"]}
    assert req.messages[2]["tool_calls"] and req.messages[0]["content"] == "You solve tasks."  # input unchanged
    rendered = smollm2_tokenizer.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True)
    assert "<|im_start|>assistant\n" + CALL_TEXT + "<|im_end|>\n<|im_start|>tool\n1\n<|im_end|>" in rendered
    assert chat.prompt_ids(msgs, req.tools)  # the ChatTokenizer renders them


def test_tool_descriptions_become_the_system_message_when_there_is_none(chat):
    msgs = template_messages([{"role": "user", "content": "hi"}], [PY], chat)
    assert msgs == [{"role": "system", "content": render_tools_for_prompt([PY])}, {"role": "user", "content": "hi"}]
    assert template_messages([{"role": "user", "content": "hi"}], None, chat) == [{"role": "user", "content": "hi"}]


def test_several_calls_one_per_line_and_none_content(chat):
    calls = parse_tool_calls(CALL_TEXT + "\n" + CALL_TEXT.split("\n", 1)[1], [PY]).tool_calls
    msgs = template_messages([{"role": "assistant", "content": None, "tool_calls": calls}], None, chat)
    call = '<tool_call>\n{"name": "python", "arguments": {"code": "print(1)"}}\n</tool_call>'
    assert msgs[0]["content"] == call + "\n" + call
    assert template_messages([{"role": "assistant", "content": None}], None, chat)[0]["content"] == ""


def test_a_native_template_gets_tool_calls_with_dict_arguments(native_chat):
    assert native_chat.renders_tools and renders_tool_calls(native_chat.tokenizer)
    req = conversation()
    msgs = template_messages(req.messages, req.tools, native_chat)
    assert msgs[0]["content"] == "You solve tasks."  # the template renders tools= itself
    (call,) = msgs[2]["tool_calls"]
    assert msgs[2]["content"] == "Running it.\n" and call["function"]["arguments"] == {"code": "print(1)"}
    assert isinstance(req.messages[2]["tool_calls"][0]["function"]["arguments"], str)  # input unchanged
    rendered = native_chat.tokenizer.apply_chat_template(msgs, tools=req.tools, tokenize=False)
    assert 'TOOLS: python' in rendered and '<call>python {"code": "print(1)"}</call>' in rendered


def test_hermes_call_text_keeps_a_non_json_argument_string():
    call = {"function": {"name": "f", "arguments": "not json"}}
    assert hermes_call_text(call) == '<tool_call>\n{"name": "f", "arguments": "not json"}\n</tool_call>'


def test_messages_equal_ignores_ids_and_serialization():
    ours = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "python", "arguments": '{"code": "x", "n": 1}'}}]}
    back = {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_2", "type": "function", "function": {"name": "python", "arguments": '{"n":1,"code":"x"}'}}]}
    assert messages_equal(ours, back) and messages_equal(back, ours)
    assert messages_equal({"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
                          {"role": "user", "content": "ab"})
    assert messages_equal({"role": "tool", "tool_call_id": "a", "content": "1"},
                          {"role": "tool", "tool_call_id": "b", "content": "1"})


@pytest.mark.parametrize("other", [
    {"role": "user", "content": None},
    {"role": "assistant", "content": "x"},
    {"role": "assistant", "content": None, "tool_calls": []},
    {"role": "assistant", "content": None, "tool_calls": [
        {"function": {"name": "bash", "arguments": '{"code": "x", "n": 1}'}}]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"function": {"name": "python", "arguments": '{"code": "y", "n": 1}'}}]},
    {"role": "assistant", "content": None, "tool_calls": [
        {"function": {"name": "python", "arguments": '{"code": "x", "n": 1}'}},
        {"function": {"name": "python", "arguments": '{"code": "x", "n": 1}'}}]},
])
def test_messages_that_differ(other):
    ours = {"role": "assistant", "content": None, "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "python", "arguments": '{"code": "x", "n": 1}'}}]}
    assert not messages_equal(ours, other)


def test_is_extension():
    req = conversation().messages
    history = [dict(m) for m in req[:3]]
    history[2] = {**history[2], "content": history[2]["content"], "tool_calls": [
        {**c, "id": "call_other", "function": {**c["function"], "arguments": json.dumps(
            json.loads(c["function"]["arguments"]), separators=(",", ":"))}} for c in history[2]["tool_calls"]]}
    assert is_extension(history, req) == 3
    assert is_extension([], req) == 0
    assert is_extension(req, req) == len(req)
    assert is_extension(req, req[:2]) is None
    changed = [*req[:1], {"role": "user", "content": "another question"}, *req[2:]]
    assert is_extension(history, changed) is None
