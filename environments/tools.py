"""Parsing the policy's completion text into actions: tool calls and fenced code answers.

Two named parsers and a registry:

* ``HermesToolParser`` ("hermes"): Hermes / Qwen-style tool calls,
  ``<tool_call>{"name": "python", "arguments": {"code": "print(1)"}}</tool_call>``, any
  number per completion, validated against OpenAI-style JSON-schema tool definitions.
* ``FencedCodeParser`` ("fenced_code"): the last Markdown code block tagged as Python.

``get_parser(name, **kwargs)`` builds one by name. Describing the tools in the prompt is
the chat layer's job (``agentrl.rollout.chat.render_tools_for_prompt``).

A malformed tool call is the *model's* fault: it raises ``agentrl.errors.ToolParseError``
(a ``ModelOutputError``) whose message says what is wrong and what was expected, so an
environment can show it to the model as feedback.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import jsonschema

from agentrl.errors import ConfigError, ToolParseError
from agentrl.types import tool_function

__all__ = [
    "ToolCall",
    "HermesToolParser",
    "FencedCodeParser",
    "PARSERS",
    "get_parser",
    "python_tool_schema",
]

_SNIPPET_CHARS = 120
_DECODER = json.JSONDecoder(strict=False)  # raw newlines and tabs in strings: models write code that way
_SPACE = re.compile(r"\s*")


def _skip_space(text: str, pos: int) -> int:
    """The first index at or after ``pos`` that is not whitespace."""
    return _SPACE.match(text, pos).end()  # type: ignore[union-attr]  # \s* always matches


def _snippet(text: str, limit: int = _SNIPPET_CHARS) -> str:
    """``text`` shortened for an error message (repr, so whitespace shows)."""
    if len(text) > limit:
        text = text[:limit] + "..."
    return repr(text)


@dataclass(frozen=True)
class ToolCall:
    """One parsed tool call.

    Attributes:
        name: the tool's name, e.g. ``"python"``.
        arguments: the call's arguments, already validated against the tool's JSON schema.
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)

    def to_openai(self, call_id: str) -> dict[str, Any]:
        """The call as an OpenAI / Hugging Face chat-message ``tool_calls`` entry."""
        return {
            "id": call_id,
            "type": "function",
            "function": {"name": self.name, "arguments": dict(self.arguments)},
        }


def python_tool_schema(description: str | None = None) -> dict[str, Any]:
    """The OpenAI-style schema of the ``python`` tool (one required string ``code``)."""
    return {
        "type": "function",
        "function": {
            "name": "python",
            "description": description
            or (
                "Run a Python 3 program in a sandbox with no network and return its "
                "stdout, stderr and exit code. Print what you want to see."
            ),
            "parameters": {
                "type": "object",
                "properties": {
                    "code": {
                        "type": "string",
                        "description": "The complete Python program to run.",
                    }
                },
                "required": ["code"],
                "additionalProperties": False,
            },
        },
    }


class HermesToolParser:
    """Parse Hermes-style tool calls: ``<tool_call>{json}</tool_call>``, several per turn.

    The JSON object must have a string ``name`` naming one of ``tools`` and an ``arguments``
    object (``parameters`` is accepted as a synonym, as Llama-3-style models write it; a
    JSON *string* holding an object is decoded). Arguments are validated with the tool's
    JSON schema (``jsonschema``, draft 2020-12): required keys, types, no unknown keys
    when the schema says ``additionalProperties: false``.

    Lenient on purpose, where the intent is unambiguous:

    * raw newlines and tabs inside JSON strings (models write code that way) are accepted
      (``json.loads(strict=False)``);
    * a final ``<tool_call>`` without ``</tool_call>`` is accepted when the rest of the text
      is exactly one JSON object (generation stopped on the ``</tool_call>`` stop string).

    Each call is read as JSON from its opening tag on (``json.JSONDecoder.raw_decode``), so
    the string state is known: a ``</tool_call>`` (or ``<tool_call>``) inside a JSON string,
    as in ``{"name": "bash", "arguments": {"command": "grep -n '</tool_call>' notes.md"}}``,
    is part of the argument, and the call ends at the first closing tag after its object.
    A ``</tool_call>`` outside any call, in prose or reasoning before a call ("I'll grep for
    the literal `</tool_call>` tag."), is text: the call after it is read as usual, and text
    with no call and such a tag is no call (a closing tag right after a JSON object with no
    opening tag is a call that lost its tag: an error). The rollout's stop strings follow the
    same rules (``agentrl.rollout.stop_strings``).

    Args:
        tools: OpenAI-style tool schemas (``{"type": "function", "function": {...}}``).

    Raises:
        ConfigError: a tool schema fails ``agentrl.types.tool_function`` (no name, a
            parameters or property schema that is not a dict), two tools share a name, or a
            parameters schema is not a valid JSON schema.
    """

    name = "hermes"
    open_tag = "<tool_call>"
    close_tag = "</tool_call>"

    def __init__(self, tools: Sequence[Mapping[str, Any]]) -> None:
        self._validators: dict[str, jsonschema.protocols.Validator] = {}
        for tool in tools:
            fn = tool_function(tool)
            tool_name = fn["name"]
            if tool_name in self._validators:
                raise ConfigError(f"two tools are named {tool_name!r}; tool names must be unique")
            schema = fn.get("parameters") or {"type": "object"}
            try:
                jsonschema.Draft202012Validator.check_schema(schema)
            except jsonschema.SchemaError as exc:
                raise ConfigError(
                    f"tool {tool_name!r} has an invalid parameters schema: {exc.message}"
                ) from exc
            self._validators[tool_name] = jsonschema.Draft202012Validator(schema)

    @property
    def tool_names(self) -> list[str]:
        return list(self._validators)

    def has_tool_call(self, text: str) -> bool:
        """Whether ``text`` contains an opening ``<tool_call>`` tag at all."""
        return self.open_tag in text

    def parse(self, text: str) -> list[ToolCall]:
        """All tool calls in ``text``, in order; ``[]`` when it has no ``<tool_call>`` tag.

        Each call is the JSON object right after its ``<tool_call>`` (whitespace around it
        allowed) followed by ``</tool_call>``, or by the end of the text for the last call;
        tags inside the object's strings belong to the strings.

        Raises:
            ToolParseError: a call is not valid JSON, not an object, names an unknown tool,
                or its arguments do not match the tool's schema. The message says which
                call (1-based), what is wrong, and what was expected.
        """
        calls: list[ToolCall] = []
        pos = 0
        index = 0
        while True:
            start = text.find(self.open_tag, pos)
            if start < 0:
                break
            index += 1
            body_start = start + len(self.open_tag)
            obj_start = _skip_space(text, body_start)
            try:
                obj, obj_end = _DECODER.raw_decode(text, obj_start)
            except json.JSONDecodeError as exc:
                failed_at = exc.pos
            else:
                after = _skip_space(text, obj_end)
                if text.startswith(self.close_tag, after):
                    calls.append(self._call_from(obj, index))
                    pos = after + len(self.close_tag)
                    continue
                if after == len(text):  # the last call, unclosed: one JSON object
                    calls.append(self._call_from(obj, index))
                    break
                failed_at = obj_end  # text other than the closing tag after the object
            # Not one JSON object and a closing tag: the call ends at the first closing tag
            # after where reading it failed (past any string it read), and the error says why.
            end = text.find(self.close_tag, failed_at)
            if end < 0:
                body = text[body_start:]
                if self.open_tag in text[failed_at:]:
                    raise ToolParseError(
                        f"tool call {index}: <tool_call> is never closed (a new <tool_call> "
                        f"starts before any </tool_call>); write each call as "
                        f"<tool_call>{{...}}</tool_call>"
                    )
                self._parse_body(body, index, unclosed=True)
            else:
                self._parse_body(text[body_start:end], index, unclosed=False)
            raise ToolParseError(  # pragma: no cover - _parse_body raises for a body raw_decode refused
                f"tool call {index} is not one JSON object followed by </tool_call>: "
                f"{_snippet(text[body_start:])}"
            )
        if not calls and self._headless_call(text):
            raise ToolParseError(
                "found </tool_call> without an opening <tool_call>; write each call as "
                '<tool_call>{"name": ..., "arguments": {...}}</tool_call>'
            )
        return calls

    def _headless_call(self, text: str) -> bool:
        """Whether ``text`` (which has no ``<tool_call>``) holds a call that lost its opening
        tag: a ``</tool_call>`` right after a ``}`` (whitespace between allowed). A closing
        tag elsewhere, in prose or reasoning (``search for '</tool_call>' in notes``), is
        text, as it is for the rollout's stop strings."""
        end = text.find(self.close_tag)
        while end >= 0:
            if text[:end].rstrip().endswith("}"):
                return True
            end = text.find(self.close_tag, end + 1)
        return False

    def _parse_body(self, body: str, index: int, *, unclosed: bool) -> ToolCall:
        """The call whose text between the tags is ``body`` (the error paths of ``parse``)."""
        stripped = body.strip()
        where = f"tool call {index}"
        if not stripped:
            raise ToolParseError(
                f"{where} is empty; expected a JSON object like "
                '{"name": "python", "arguments": {"code": "print(1)"}} between the tags'
            )
        try:
            obj = json.loads(stripped, strict=False)
        except json.JSONDecodeError as exc:
            if unclosed:
                raise ToolParseError(
                    f"{where}: <tool_call> is never closed with </tool_call> and the text "
                    f"after it is not one JSON object ({exc.msg} at line {exc.lineno} "
                    f"column {exc.colno}): {_snippet(stripped)}"
                ) from exc
            raise ToolParseError(
                f"{where} is not valid JSON ({exc.msg} at line {exc.lineno} column "
                f"{exc.colno}): {_snippet(stripped)}"
            ) from exc
        return self._call_from(obj, index)

    def _call_from(self, obj: Any, index: int) -> ToolCall:
        """The call that the decoded JSON value ``obj`` of call ``index`` (1-based) describes.

        Raises:
            ToolParseError: not an object, no known tool name, arguments that are not an
                object or do not match the tool's schema.
        """
        where = f"tool call {index}"
        if not isinstance(obj, dict):
            raise ToolParseError(
                f"{where} is a JSON {type(obj).__name__}, expected an object with keys "
                '"name" and "arguments"'
            )
        tool_name = obj.get("name")
        if not isinstance(tool_name, str):
            raise ToolParseError(
                f'{where} has no string "name" (got {tool_name!r}); expected one of '
                f"{self.tool_names}"
            )
        if tool_name not in self._validators:
            raise ToolParseError(
                f"{where} names unknown tool {tool_name!r}; available tools: {self.tool_names}"
            )
        key = "arguments" if "arguments" in obj else "parameters" if "parameters" in obj else None
        if key is None:
            raise ToolParseError(
                f'{where} ({tool_name}) has no "arguments" object; expected '
                f'{{"name": "{tool_name}", "arguments": {{...}}}}'
            )
        args = obj[key]
        if isinstance(args, str):
            try:
                args = json.loads(args, strict=False)
            except json.JSONDecodeError as exc:
                raise ToolParseError(
                    f'{where} ({tool_name}): "{key}" is a string that is not valid JSON '
                    f"({exc.msg}); expected a JSON object"
                ) from exc
        if not isinstance(args, dict):
            raise ToolParseError(
                f'{where} ({tool_name}): "{key}" is a JSON {type(args).__name__}, expected '
                "an object"
            )
        errors = sorted(self._validators[tool_name].iter_errors(args), key=lambda e: list(e.path))
        if errors:
            first = errors[0]
            path = "".join(f"[{p!r}]" for p in first.path)
            raise ToolParseError(
                f"{where} ({tool_name}) has invalid arguments{' at ' + path if path else ''}: "
                f"{first.message}"
            )
        return ToolCall(name=tool_name, arguments=args)


class FencedCodeParser:
    """Extract the code of the last fenced Markdown code block tagged as Python.

    A block is ````` ```python ````` (or ``py``, ``python3``; case-insensitive) up to the next
    ````` ``` `````. Only closed blocks count. With ``allow_untagged=True`` a block with no
    language tag is accepted when no tagged block exists.
    """

    name = "fenced_code"
    _TAGGED = re.compile(r"```[ \t]*(?:python3?|py)[ \t]*\r?\n(.*?)```", re.DOTALL | re.IGNORECASE)
    _UNTAGGED = re.compile(r"```[ \t]*\r?\n(.*?)```", re.DOTALL)

    def __init__(self, allow_untagged: bool = False) -> None:
        self.allow_untagged = allow_untagged

    def find_all(self, text: str) -> list[str]:
        """Code of every Python-tagged block, in order (untagged ones as the fallback)."""
        blocks = self._TAGGED.findall(text)
        if not blocks and self.allow_untagged:
            blocks = self._UNTAGGED.findall(text)
        return blocks

    def parse(self, text: str) -> str | None:
        """The code of the last block, or ``None`` when there is none."""
        blocks = self.find_all(text)
        return blocks[-1] if blocks else None


PARSERS: dict[str, Callable[..., Any]] = {
    HermesToolParser.name: HermesToolParser,
    FencedCodeParser.name: FencedCodeParser,
}
"""Parser classes by name (``get_parser`` builds them)."""


def get_parser(name: str, **kwargs: Any) -> Any:
    """Build the parser registered as ``name`` with ``kwargs`` (e.g. ``tools=[...]``).

    Raises:
        ConfigError: no parser is registered under ``name``.
    """
    try:
        cls = PARSERS[name]
    except KeyError:
        raise ConfigError(f"unknown parser {name!r}; expected one of {sorted(PARSERS)}") from None
    return cls(**kwargs)
