"""A completion's text as an OpenAI assistant message: content and ``tool_calls``.

``parse_tool_calls(text, tools, parser)`` reads the tool calls a model wrote in its own
format and returns them as OpenAI's ``tool_calls`` entries
(``{"id": "call_<hex>", "type": "function", "function": {"name", "arguments": <JSON str>}}``).

* ``"hermes"`` (``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, the format
  ``agentrl.rollout.chat.render_tools_for_prompt`` asks models to use) is read by our own
  ``environments.tools.HermesToolParser``: it reads each call as JSON, so a ``</tool_call>``
  inside a string argument (``grep '</tool_call>' notes.md``) belongs to the argument. vLLM's
  hermes parser cuts the call at that tag with a regex and returns the whole text as
  content (``tests/unit/gateway/test_tool_calls_vllm.py`` shows both). It also validates
  the arguments against the tool's JSON schema, as environments do.
* Any other name is one of vLLM's parsers (``vllm.tool_parsers.ToolParserManager``:
  ``llama3_json``, ``mistral``, ``pythonic``, ...), built with the model's tokenizer, so
  models with other call formats work through the gateway too; ``"vllm:<name>"`` names
  vLLM's parser even where we have one of that name (``"vllm:hermes"``). Importing vLLM's
  parsers takes seconds (it loads torch), so it happens on the first such call only.

A malformed call is the model's fault, and the client sees it as the model wrote it: the
whole text is the content, ``tool_calls`` is empty, and ``ParsedMessage.error`` says what
the parser found wrong.
"""

from __future__ import annotations

import json
import logging
import secrets
from dataclasses import dataclass, field
from typing import Any, Sequence

from agentrl.errors import ConfigError, ToolParseError
from environments.tools import HermesToolParser

HERMES = "hermes"
VLLM_PREFIX = "vllm:"


@dataclass(frozen=True)
class ParsedMessage:
    """An assistant message read from a completion's text.

    Attributes:
        content: the text outside the tool calls (for hermes: the text before the first
            ``<tool_call>``, verbatim), or ``None`` when calls were found and there is no
            text; the whole text when no call was found or a call was malformed.
        tool_calls: OpenAI ``tool_calls`` entries, in the order written;
            ``function.arguments`` is a JSON string.
        error: the parser's message for a malformed call, else ``None``.
    """

    content: str | None
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None


def new_call_id() -> str:
    """A fresh tool call id, ``"call_"`` and 24 hex digits."""
    return f"call_{secrets.token_hex(12)}"


def openai_tool_call(name: str, arguments: Any, call_id: str | None = None) -> dict[str, Any]:
    """One OpenAI ``tool_calls`` entry; ``arguments`` (a dict, or a JSON string kept as
    it is) becomes a JSON string."""
    args = arguments if isinstance(arguments, str) else json.dumps(arguments, ensure_ascii=False)
    return {"id": call_id or new_call_id(), "type": "function", "function": {"name": name, "arguments": args}}


def parse_tool_calls(text: str, tools: Sequence[dict[str, Any]] | None, parser: str = HERMES, *,
                     tool_choice: str = "auto", tokenizer: Any = None) -> ParsedMessage:
    """Read the tool calls in ``text`` (a completion decoded without its stop token).

    Args:
        text: the completion's text.
        tools: the request's OpenAI function tools; ``None`` or empty: no parsing.
        parser: ``"hermes"`` (ours), the name of a vLLM tool parser, or ``"vllm:<name>"``
            for vLLM's parser of that name.
        tool_choice: ``"auto"`` or ``"none"``; ``"none"``: no parsing, the text is content.
        tokenizer: the model's Hugging Face tokenizer; needed by vLLM's parsers only.

    Returns:
        The message; see :class:`ParsedMessage` for malformed calls.

    Raises:
        ConfigError: ``tools`` break the tool schema (``agentrl.types.tool_function``, an
            invalid JSON schema, two tools of one name); ``parser`` is neither ``"hermes"``
            nor a registered vLLM parser; a vLLM parser was named without ``tokenizer``, or
            does not fit it (it lacks the parser's special tokens).
    """
    if not tools or tool_choice == "none":
        return ParsedMessage(content=text)
    if parser == HERMES:
        return _parse_hermes(text, tools)
    return _parse_vllm(text, tools, parser.removeprefix(VLLM_PREFIX), tokenizer)


def _parse_hermes(text: str, tools: Sequence[dict[str, Any]]) -> ParsedMessage:
    hermes = HermesToolParser(tools)
    try:
        calls = hermes.parse(text)
    except ToolParseError as exc:
        return ParsedMessage(content=text, error=str(exc))
    if not calls:
        return ParsedMessage(content=text)
    before = text[: text.find(HermesToolParser.open_tag)]
    return ParsedMessage(content=before if before.strip() else None,
                         tool_calls=[openai_tool_call(c.name, c.arguments) for c in calls])


class _ErrorRecords(logging.Handler):
    """Collects the ERROR records vLLM's parsers log (they log a malformed call and
    return the text as content rather than raise)."""

    def __init__(self) -> None:
        super().__init__(level=logging.ERROR)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        msg = record.getMessage()
        if record.exc_info and record.exc_info[1] is not None:
            msg = f"{msg} {type(record.exc_info[1]).__name__}: {record.exc_info[1]}"
        self.messages.append(msg)


def _parse_vllm(text: str, tools: Sequence[dict[str, Any]], parser: str, tokenizer: Any) -> ParsedMessage:
    if tokenizer is None:
        raise ConfigError(f"tool parser {parser!r} is vLLM's and needs the model's tokenizer (tokenizer=None)")
    from vllm.entrypoints.openai.chat_completion.protocol import ChatCompletionRequest  # heavy: vllm
    from vllm.tool_parsers import ToolParserManager  # heavy: vllm

    try:
        parser_cls = ToolParserManager.get_tool_parser(parser)
    except KeyError:
        raise ConfigError(
            f"unknown tool parser {parser!r}; expected {HERMES!r} or one of vLLM's: "
            f"{sorted(ToolParserManager.list_registered())}"
        ) from None
    request = ChatCompletionRequest(messages=[{"role": "user", "content": ""}], tools=list(tools), tool_choice="auto")
    try:
        instance = parser_cls(tokenizer, request.tools)
    except Exception as exc:  # vLLM's parsers look up their model's special tokens here
        raise ConfigError(f"vLLM's tool parser {parser!r} does not fit this model's tokenizer: "
                          f"{type(exc).__name__}: {exc}") from exc
    handler = _ErrorRecords()
    vllm_logger = logging.getLogger("vllm.tool_parsers")
    vllm_logger.addHandler(handler)
    try:
        info = instance.extract_tool_calls(text, request)
    except Exception as exc:  # a parser that raises instead of logging
        return ParsedMessage(content=text, error=f"{type(exc).__name__}: {exc}")
    finally:
        vllm_logger.removeHandler(handler)
    if not info.tools_called or not info.tool_calls:
        return ParsedMessage(content=text, error="; ".join(handler.messages) or None)
    calls = [openai_tool_call(c.function.name, c.function.arguments) for c in info.tool_calls]
    return ParsedMessage(content=info.content if info.content and info.content.strip() else None, tool_calls=calls)
