"""Chat messages from a client, made ready for the model's chat template, and compared.

``template_messages(messages, tools, chat)`` turns a request's OpenAI messages into what the
model's template renders the way the model saw its prompt during the session:

* tools: when the template does not render ``tools=`` (``ChatTokenizer.renders_tools``),
  their plain-text description (``render_tools_for_prompt``) goes at the end of the system
  message, as the rollout loop's first prompt does (``ChatTokenizer.initial_messages``);
* an assistant message's ``tool_calls``: when the template does not render them (probed
  once per tokenizer), they are written into the content in the hermes format the model was
  asked to use, ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, one per line
  after the text, so a forked session's full prompt shows the model its own calls. When the
  template renders them, ``arguments`` is handed to it as a dict, as Hugging Face
  templates expect;
* content ``None`` becomes ``""`` (templates concatenate strings).

``messages_equal`` and ``is_extension`` tell whether a request continues a session: the
client sends back the assistant messages the gateway returned, possibly re-serialized
(content ``None`` or ``""``, new call ids, arguments re-encoded).
"""

from __future__ import annotations

import json
import weakref
from typing import Any, Sequence

from agentrl.rollout.chat import ChatTokenizer, render_tools_for_prompt

_PROBE_CALL_NAME = "agentrl_probe_call"
_PROBE_ARG_VALUE = "agentrl_probe_value_91"
_renders_tool_calls_cache: weakref.WeakKeyDictionary[Any, bool] = weakref.WeakKeyDictionary()


def renders_tool_calls(tokenizer: Any) -> bool:
    """Whether ``tokenizer``'s chat template writes an assistant message's ``tool_calls``
    (the call's name and argument value appear in the rendering). Probed once per tokenizer
    object; a template that raises on the probe does not render them."""
    try:
        return _renders_tool_calls_cache[tokenizer]
    except (KeyError, TypeError):
        pass
    probe = [
        {"role": "user", "content": "Probe question."},
        {"role": "assistant", "content": "", "tool_calls": [{
            "id": "call_probe", "type": "function",
            "function": {"name": _PROBE_CALL_NAME, "arguments": {"probe_arg": _PROBE_ARG_VALUE}}}]},
    ]
    try:
        text = tokenizer.apply_chat_template(probe, tokenize=False, add_generation_prompt=False)
        result = _PROBE_CALL_NAME in text and _PROBE_ARG_VALUE in text
    except Exception:  # a template that cannot take tool_calls at all
        result = False
    try:
        _renders_tool_calls_cache[tokenizer] = result
    except TypeError:  # not weak-referenceable: probed again next time
        pass
    return result


def _arguments(arguments: Any) -> Any:
    """A call's arguments as a dict when they are a JSON object (string or dict), else as given."""
    if isinstance(arguments, str):
        try:
            return json.loads(arguments)
        except json.JSONDecodeError:
            return arguments
    return arguments


def hermes_call_text(call: dict[str, Any]) -> str:
    """One OpenAI tool call as ``<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>``:
    the layout Hermes / Qwen chat templates write and agentrl's tool prompts show."""
    fn = call.get("function", {})
    return "<tool_call>\n" + json.dumps({"name": fn.get("name"), "arguments": _arguments(fn.get("arguments"))},
                                        ensure_ascii=False) + "\n</tool_call>"


def _calls_in_content(content: str, calls: Sequence[dict[str, Any]]) -> str:
    text = content
    for call in calls:
        if text and not text.endswith("\n"):
            text += "\n"
        text += hermes_call_text(call)
    return text


def template_messages(messages: Sequence[dict[str, Any]], tools: Sequence[dict[str, Any]] | None,
                      chat: ChatTokenizer) -> list[dict[str, Any]]:
    """The messages to hand ``chat``'s template (``ChatTokenizer.prompt_ids``).

    Args:
        messages: normalized request messages (``ChatRequest.messages``: str or ``None`` content).
        tools: the request's function tools, or ``None``.
        chat: the model's chat tokenizer.

    Returns:
        New message dicts (the input is not changed): roles kept (``"tool"`` included),
        content a str; tool descriptions in the system message when the template does not
        render ``tools=``; ``tool_calls`` written into the content when it does not render them.
    """
    native_calls = renders_tool_calls(chat.tokenizer)
    out: list[dict[str, Any]] = []
    for msg in messages:
        new = dict(msg)
        new["content"] = msg.get("content") or ""
        calls = msg.get("tool_calls") or []
        new.pop("tool_calls", None)
        if calls and native_calls:
            new["tool_calls"] = [
                {**call, "function": {**call["function"], "arguments": _arguments(call["function"].get("arguments"))}}
                for call in calls
            ]
        elif calls:
            new["content"] = _calls_in_content(new["content"], calls)
        out.append(new)
    if tools and not chat.renders_tools:
        description = render_tools_for_prompt(tools)
        if out and out[0]["role"] == "system":
            out[0]["content"] = (out[0]["content"] + "\n\n" + description).strip()
        else:
            out.insert(0, {"role": "system", "content": description})
    return out


def _text(content: Any) -> str:
    if content is None:
        return ""
    if isinstance(content, list):
        return "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in content)
    return str(content)


def _call_key(call: Any) -> tuple[Any, Any]:
    fn = call.get("function", {}) if isinstance(call, dict) else {}
    return fn.get("name"), _arguments(fn.get("arguments"))


def messages_equal(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two chat messages say the same: same role, same text (``None`` equals ``""``,
    text parts joined), same tool calls in order by name and parsed arguments (call ids,
    ``tool_call_id`` and other keys ignored)."""
    if a.get("role") != b.get("role") or _text(a.get("content")) != _text(b.get("content")):
        return False
    calls_a, calls_b = a.get("tool_calls") or [], b.get("tool_calls") or []
    return len(calls_a) == len(calls_b) and all(_call_key(x) == _call_key(y) for x, y in zip(calls_a, calls_b))


def is_extension(history: Sequence[dict[str, Any]], request: Sequence[dict[str, Any]]) -> int | None:
    """``len(history)`` when ``request`` starts with ``history`` (message by message,
    :func:`messages_equal`), else ``None``."""
    if len(request) < len(history):
        return None
    if all(messages_equal(h, r) for h, r in zip(history, request)):
        return len(history)
    return None
