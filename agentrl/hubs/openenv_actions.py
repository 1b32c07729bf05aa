"""The model's reply as an OpenEnv action, and an OpenEnv observation as text: pure functions
over the JSON schemas a server publishes at ``GET /schema`` (``agentrl.hubs.openenv``).

An OpenEnv action is a pydantic model (``extra="forbid"``) whose JSON schema is ``/schema``'s
``action``; every action has an optional ``metadata`` object, which the model never has to
fill. ``ActionSchema`` reads the schema once; ``parse_action`` turns one reply into the dict
sent as a ``{"type": "step", "data": ...}`` message, or says why it cannot (an invalid
action, the model's fault).

Reply formats (``action_format``):

``json``  the reply is one JSON object (the whole reply, surrounding white space aside), or
          holds one in a fenced block (```` ```json ... ``` ```` or ```` ``` ... ``` ````; the
          last fenced block that parses as an object is used). It must validate against the
          action schema (JSON Schema 2020-12, ``jsonschema``).
``text``  the raw reply is the value of the schema's one text field (a schema whose only
          field beside ``metadata`` is a string); nothing is parsed.
``auto``  (default) ``text`` where the schema has one text field, except that a reply that is
          (or fences) a JSON object valid against the schema is taken as that object; ``json``
          otherwise.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Literal, Mapping

import jsonschema

from agentrl.errors import ConfigError

__all__ = ["ACTION_FORMATS", "ActionFormat", "ActionSchema", "ParsedAction", "parse_action", "observation_text",
           "SchemaError"]

ActionFormat = Literal["auto", "json", "text", "mcp"]
ACTION_FORMATS: tuple[str, ...] = ("auto", "json", "text", "mcp")
"""``mcp``: the reply's tool calls, for an MCP environment (``agentrl.hubs.openenv_mcp``), never
parsed here."""
OPTIONAL_FIELDS = ("metadata",)
"""Fields every OpenEnv action and observation has that the model never fills."""
OBSERVATION_CONTROL_FIELDS = ("done", "reward", "metadata")
"""Fields of an observation that are not shown to the model (they go to reward, done, info)."""

_FENCE = re.compile(r"```[ \t]*([A-Za-z0-9_+-]*)[ \t]*\n(.*?)```", re.DOTALL)
_MAX_ERRORS_SHOWN = 3


class SchemaError(ValueError):
    """A ``/schema`` action schema agentrl cannot use (not an object schema, or not valid JSON
    Schema). ``agentrl.hubs.openenv`` raises it on as an infrastructure error."""


def _is_text(prop: Any) -> bool:
    """A property schema of type string (``{"type": "string"}``, or a union of string and null)."""
    if not isinstance(prop, Mapping):
        return False
    if prop.get("type") == "string":
        return True
    options = prop.get("anyOf")
    if isinstance(options, list):
        types = {o.get("type") for o in options if isinstance(o, Mapping)}
        return "string" in types and types <= {"string", "null"}
    return False


@dataclass(frozen=True)
class ActionSchema:
    """An action schema as read from ``/schema``.

    Attributes:
        schema: the JSON schema itself (an object schema).
        fields: the properties the model may fill, ``metadata`` left out, in schema order.
        required: the required ones among them.
        text_field: the one text field, when ``fields`` is exactly one string property; else None.
    """

    schema: Mapping[str, Any]
    fields: tuple[str, ...]
    required: tuple[str, ...]
    text_field: str | None

    @classmethod
    def from_schema(cls, schema: Any) -> "ActionSchema":
        """Read an action schema.

        Raises:
            SchemaError: ``schema`` is not a dict with ``type: object`` and a ``properties``
                dict, or is not valid JSON Schema 2020-12.
        """
        if not isinstance(schema, Mapping) or not isinstance(schema.get("properties"), Mapping):
            raise SchemaError(f"action schema {str(schema)[:200]!r} has no 'properties' object; expected the JSON "
                              "schema of a pydantic Action model")
        if schema.get("type", "object") != "object":
            raise SchemaError(f"action schema has type={schema.get('type')!r}; expected 'object'")
        try:
            jsonschema.Draft202012Validator.check_schema(schema)
        except jsonschema.SchemaError as exc:
            raise SchemaError(f"action schema is not valid JSON Schema: {exc.message}") from exc
        props = schema["properties"]
        fields = tuple(str(k) for k in props if k not in OPTIONAL_FIELDS)
        required = tuple(str(k) for k in schema.get("required", ()) if k in fields)
        text = fields[0] if len(fields) == 1 and _is_text(props[fields[0]]) else None
        return cls(schema=schema, fields=fields, required=required, text_field=text)

    def validator(self) -> jsonschema.Draft202012Validator:
        return jsonschema.Draft202012Validator(self.schema)

    def describe(self) -> str:
        """The schema as the model is told it: its fields, types and descriptions as JSON."""
        props = {k: v for k, v in self.schema["properties"].items() if k not in OPTIONAL_FIELDS}
        shown: dict[str, Any] = {"type": "object", "properties": props}
        if self.required:
            shown["required"] = list(self.required)
        if "$defs" in self.schema:
            shown["$defs"] = self.schema["$defs"]
        return json.dumps(shown, ensure_ascii=False)


@dataclass(frozen=True)
class ParsedAction:
    """What ``parse_action`` made of a reply.

    Attributes:
        action: the dict to send as the step's ``data``; None for an invalid action.
        source: ``"json"`` (the whole reply), ``"fenced"`` (a fenced block), ``"text"`` (the
            raw reply as the text field), or None (invalid).
        error: why the reply is not an action (for the model's next observation); None when valid.
    """

    action: dict[str, Any] | None
    source: str | None
    error: str | None = None

    @property
    def valid(self) -> bool:
        return self.action is not None


def _json_candidates(reply: str) -> list[tuple[str, Any]]:
    """``(source, value)`` of each JSON reading of ``reply``: the whole reply, then its fenced
    blocks from the last to the first. Texts that are not JSON are skipped."""
    out: list[tuple[str, Any]] = []
    texts = [("json", reply.strip())] + [("fenced", m.group(2).strip()) for m in reversed(list(_FENCE.finditer(reply)))]
    for source, text in texts:
        if not text.startswith(("{", "[")):
            continue
        try:
            out.append((source, json.loads(text)))
        except ValueError:
            continue
    return out


def _errors(validator: jsonschema.Draft202012Validator, value: Any) -> list[str]:
    errors = sorted(validator.iter_errors(value), key=lambda e: (list(e.absolute_path), e.message))
    out = []
    for e in errors[:_MAX_ERRORS_SHOWN]:
        where = "/".join(str(p) for p in e.absolute_path)
        out.append(f"{where}: {e.message}" if where else e.message)
    if len(errors) > _MAX_ERRORS_SHOWN:
        out.append(f"... {len(errors) - _MAX_ERRORS_SHOWN} more")
    return out


def parse_action(reply: str, schema: ActionSchema, action_format: str = "auto",
                 validator: jsonschema.Draft202012Validator | None = None) -> ParsedAction:
    """The action in ``reply`` (see the module docstring for the formats).

    Args:
        reply: the model's completion text.
        schema: the server's action schema.
        action_format: ``"auto"``, ``"json"`` or ``"text"``.
        validator: ``schema.validator()``, to reuse across calls (made here when None).

    Returns:
        A ``ParsedAction``; ``action`` None and ``error`` set when the reply is not a valid
        action. Never raises for the reply's content.

    Raises:
        ConfigError: an unknown ``action_format``, or ``"text"`` for a schema without one
            text field.
    """
    if action_format not in ACTION_FORMATS or action_format == "mcp":
        raise ConfigError(f"action_format={action_format!r} is not one of {ACTION_FORMATS[:3]} (mcp replies are "
                          "tool calls: agentrl.hubs.openenv_mcp)")
    if action_format == "text" and schema.text_field is None:
        raise ConfigError(f"action_format='text' needs an action schema with one text field; this one has fields "
                          f"{list(schema.fields)}: use 'json' or 'auto'")
    if not isinstance(reply, str):
        return ParsedAction(None, None, f"the reply is a {type(reply).__name__}, not text")
    validator = validator if validator is not None else schema.validator()
    if action_format == "text":
        return ParsedAction({schema.text_field: reply}, "text")
    candidates = _json_candidates(reply)
    problems: list[str] = []
    for source, value in candidates:
        if not isinstance(value, dict):
            problems.append(f"a JSON {type(value).__name__}, not an object")
            continue
        errors = _errors(validator, value)
        if not errors:
            return ParsedAction(value, source)
        problems.append("; ".join(errors))
    if action_format == "auto" and schema.text_field is not None:
        return ParsedAction({schema.text_field: reply}, "text")
    fields = ", ".join(schema.fields) or "(none)"
    if not candidates:
        error = (f"no JSON object in the reply; reply with one JSON object (fields: {fields}), alone or in a "
                 "```json fenced block")
    else:
        error = f"the JSON in the reply is not a valid action ({problems[0]}); fields: {fields}"
    return ParsedAction(None, None, error)


def observation_text(observation: Mapping[str, Any], field: str | None = None) -> str:
    """The text the model sees of an observation (the ``observation`` object of a ``/ws``
    response, ``done`` / ``reward`` / ``metadata`` left out).

    Args:
        observation: the observation's fields.
        field: show this field alone (``str()`` of a non-text value); None: the one text
            field when the observation has exactly one field and it is a str, else all the
            fields as one JSON object.

    Raises:
        KeyError: ``field`` is not a field of ``observation`` (the caller reports it as the
            server's fault or the config's).
    """
    shown = {k: v for k, v in observation.items() if k not in OBSERVATION_CONTROL_FIELDS}
    if field is not None:
        value = observation[field]
        return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    if len(shown) == 1:
        (value,) = shown.values()
        if isinstance(value, str):
            return value
    return json.dumps(shown, ensure_ascii=False)
