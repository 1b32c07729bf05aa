"""OpenEnv MCP environments as agentrl tools (``hub/OpenEnv-v0`` with ``action_format: mcp``).

An OpenEnv MCP environment (``openenv.core.env_server.mcp_environment.MCPEnvironment``, RFC 003
of OpenEnv) takes two actions besides its own: ``{"type": "list_tools"}``, answered with an
observation ``{"tools": [{"name", "description", "input_schema"}, ...]}``, and
``{"type": "call_tool", "tool_name": ..., "arguments": {...}}``, answered with
``{"tool_name", "result", "error"}`` (``result`` an MCP ``CallToolResult``:
``{"content": [{"type": "text", "text": ...}, ...], "structured_content", "data", "is_error"}``;
``error`` a framework error ``{"error_type", "message"}``), and the step's ``reward`` and
``done``. openenv's server accepts both on any environment's ``/ws`` (they are never checked
against the action schema).

Here the tools listed at ``reset`` become the episode's tools (OpenAI-style schemas in
``StepInfo.tools``, so the chat template shows them), each reply's Hermes tool calls
(``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``,
``environments.tools.HermesToolParser``, arguments checked against the tool's input schema)
become ``call_tool`` actions, one per call, and their results the tool messages of the next
turn. What the server sends that is off this protocol is an ``OpenEnvError`` (infrastructure),
never the model's fault.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from agentrl.errors import ConfigError
from agentrl.hubs.openenv_actions import ActionSchema
from agentrl.hubs.openenv_wire import OpenEnvError
from environments.tools import HermesToolParser

__all__ = ["INFRA_TOOL_ERRORS", "LIST_TOOLS", "call_tool_action", "is_mcp_schema", "mcp_tools", "tool_result_text",
           "transport_fault"]

LIST_TOOLS: dict[str, str] = {"type": "list_tools"}
"""The action that asks an MCP environment for its tools."""
_MCP_FIELDS = ("tool_name", "arguments")


def is_mcp_schema(schema: ActionSchema) -> bool:
    """Whether an action schema is OpenEnv's ``CallToolAction`` (fields ``tool_name`` and
    ``arguments``): what ``action_format: auto`` takes for an MCP environment."""
    return all(name in schema.fields for name in _MCP_FIELDS)


def mcp_tools(observation: Mapping[str, Any], base_url: str) -> list[dict[str, Any]]:
    """The tools of a ``list_tools`` observation as OpenAI-style tool schemas
    (``{"type": "function", "function": {"name", "description", "parameters"}}``), in the
    server's order.

    Raises:
        OpenEnvError: the observation has no ``tools`` list of ``{"name": str, ...}`` objects,
            two tools share a name, or an input schema is not a JSON object schema (the
            server's fault).
    """
    tools = observation.get("tools")
    if not isinstance(tools, list) or not tools:
        raise OpenEnvError(f"{base_url} answered list_tools with {str(dict(observation))[:300]}; expected an "
                           "observation with a non-empty 'tools' list (is it an MCP environment? else set "
                           "action_format to json or text)", base_url=base_url)
    out: list[dict[str, Any]] = []
    seen: set[str] = set()
    for tool in tools:
        name = tool.get("name") if isinstance(tool, dict) else None
        if not isinstance(name, str) or not name or name in seen:
            raise OpenEnvError(f"{base_url} listed the tool {str(tool)[:200]}; expected an object with a unique "
                               "non-empty str 'name'", base_url=base_url)
        seen.add(name)
        params = tool.get("input_schema") or tool.get("inputSchema") or {"type": "object", "properties": {}}
        if not isinstance(params, dict) or params.get("type", "object") != "object":
            raise OpenEnvError(f"{base_url} listed tool {name!r} with input_schema {str(params)[:200]}; expected a "
                               "JSON schema of type object", base_url=base_url)
        out.append({"type": "function", "function": {"name": name, "description": str(tool.get("description") or ""),
                                                      "parameters": params}})
    for tool in out:
        fn = tool["function"]
        bad = _unresolvable_ref(fn["parameters"])
        if bad is not None:
            raise OpenEnvError(f"{base_url} listed tool {fn['name']!r} whose input_schema has $ref {bad!r}, which "
                               "does not resolve within the schema", base_url=base_url)
    try:
        HermesToolParser(out)  # every input schema must be a valid JSON schema
    except ConfigError as exc:
        raise OpenEnvError(f"{base_url} listed tools agentrl cannot check calls against: {exc}",
                           base_url=base_url) from None
    return out


def _unresolvable_ref(schema: Mapping[str, Any]) -> str | None:
    """The first ``$ref`` of ``schema`` that is not a JSON pointer into ``schema`` itself that
    resolves (nothing is fetched), or None."""
    def points(ref: str) -> bool:
        if ref == "#":
            return True
        if not ref.startswith("#/"):
            return False
        node: Any = schema
        for part in ref[2:].split("/"):
            part = part.replace("~1", "/").replace("~0", "~")
            if isinstance(node, Mapping) and part in node:
                node = node[part]
            elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
                node = node[int(part)]
            else:
                return False
        return True

    stack: list[Any] = [schema]
    while stack:
        node = stack.pop()
        if isinstance(node, Mapping):
            ref = node.get("$ref")
            if ref is not None and not (isinstance(ref, str) and points(ref)):
                return str(ref)
            stack.extend(node.values())
        elif isinstance(node, list):
            stack.extend(node)
    return None


def call_tool_action(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    """The ``call_tool`` action of one parsed tool call."""
    return {"type": "call_tool", "tool_name": name, "arguments": dict(arguments)}


INFRA_TOOL_ERRORS = ("transport_error",)
"""openenv's framework error types that are the server's fault (its MCP transport failed), never
the tool's answer. The others (``execution_error``: the tool raised; ``timeout``; ``invalid_args``;
``tool_not_found``) are shown to the model, as a sandbox shows a failed or timed-out command."""


def transport_fault(observation: Mapping[str, Any]) -> str | None:
    """The message of a ``call_tool`` observation's framework error whose type is in
    ``INFRA_TOOL_ERRORS``, else None."""
    error = observation.get("error")
    if isinstance(error, dict) and error.get("error_type") in INFRA_TOOL_ERRORS:
        return f"{error.get('error_type')}: {error.get('message', '')}"
    return None


def tool_result_text(observation: Mapping[str, Any]) -> str:
    """The tool message of one ``call_tool`` observation: the framework error
    (``error (<type>): <message>``), else the result's text contents joined by newlines
    (other contents as JSON; a result flagged ``is_error`` prefixed ``error: ``), else the
    result itself (a str as it is, anything else as JSON)."""
    error = observation.get("error")
    if error:
        if isinstance(error, dict):
            return f"error ({error.get('error_type', 'error')}): {error.get('message', '')}"
        return f"error: {error}"
    result = observation.get("result")
    if isinstance(result, dict) and isinstance(result.get("content"), list):
        parts = [item["text"] if isinstance(item, dict) and item.get("type") == "text" and isinstance(item.get("text"), str)
                 else _json(item) for item in result["content"]]
        text = "\n".join(parts)
        if not parts:
            data = result.get("structured_content", result.get("data"))
            text = "" if data is None else (data if isinstance(data, str) else _json(data))
        return ("error: " + text) if result.get("is_error") or result.get("isError") else text
    if result is None:
        return ""
    return result if isinstance(result, str) else _json(result)


def _json(value: Any) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True, default=str)

