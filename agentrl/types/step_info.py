"""Step info: the part of Gymnasium's ``info`` dict that the rollout reads beside the
observation (anchor, observation role, tool outputs, system prompt, tools, worked
examples, invalid action, success; and for an environment that speaks chat messages, such
as the gateway's: the messages, the branch, tool calls, counters, the next turn's token cap
and stop strings), parsed into the frozen ``StepInfo`` by one validator that the rollout
loop and ``environments.checker`` share. ``STEP_INFO_KEYS`` holds the key strings;
``tool_function`` checks one OpenAI-style tool schema.
"""

from __future__ import annotations

import copy
import math
import numbers
import operator
from dataclasses import dataclass
from typing import Any, Hashable, Literal, Mapping

from agentrl.errors import ConfigError, ContractError, StepInfoError

ObservationRole = Literal["user", "tool", "system"]
OBSERVATION_ROLES: tuple[str, ...] = ("user", "tool", "system")
EXAMPLE_ROLES: tuple[str, ...] = ("user", "assistant", "tool")
"""Roles a demonstration turn of ``StepInfo.example_messages`` may have."""
MESSAGE_ROLES: tuple[str, ...] = ("system", "user", "assistant", "tool")
"""Roles a chat message of ``StepInfo.messages`` may have."""
MESSAGE_OPTIONAL_KEYS: tuple[str, ...] = ("tool_call_id", "name", "tool_calls")
"""Keys a chat message of ``StepInfo.messages`` may have beside ``role`` and ``content``."""
_NO_ANCHOR: Any = None
STEP_INFO_KEYS: tuple[str, ...] = (
    "anchor", "observation_role", "tool_outputs", "system_prompt", "tools",
    "system_prompt_describes_tools", "example_messages", "invalid_action", "success",
    "messages", "branch", "tool_call_count", "counters", "max_new_tokens", "stop_strings",
    "reference_answer", "final_answer",
)
"""The ``info`` keys ``StepInfo`` owns; every other key is the env's own. Each is its field's
name, except ``StepInfo.tool_calls``, whose key is ``"tool_call_count"``: environments keep
their parsed calls under their own ``info["tool_calls"]``."""

_TOOL_SHAPE = '{"type": "function", "function": {"name": ..., "parameters": {"properties": {...}}}}'


def type_name(value: Any) -> str:
    """``value``'s type as ``module.qualname`` (``numpy.float64``), bare for builtins
    (``int``), for error messages: numpy 2 names its bool type plain ``bool``."""
    t = type(value)
    return t.__qualname__ if t.__module__ == "builtins" else f"{t.__module__}.{t.__qualname__}"


def _safe_repr(value: Any, limit: int = 200) -> str:
    """``repr(value)`` cut to ``limit`` characters; a ``repr`` that raises is described."""
    try:
        text = repr(value)
    except Exception as exc:
        return f"<{type_name(value)} whose repr raised {type_name(exc)}>"
    return text if len(text) <= limit else text[:limit] + "..."


def as_bool(value: Any) -> bool | None:
    """``value`` as a Python bool when it is one or numpy's bool scalar (``np.True_``,
    what ``reward >= 1.0`` gives for a numpy reward), else None. numpy is detected by
    ``type(value).__module__ == "numpy"`` and the type's name (``bool`` in numpy 2, ``bool_``
    in numpy 1), so this module never imports numpy; ints (0/1) and numpy ints are not bools."""
    if isinstance(value, bool):
        return value
    t = type(value)
    if t.__module__ == "numpy" and t.__name__ in ("bool", "bool_"):
        return bool(value)
    return None


def tool_function(tool: Any) -> Mapping[str, Any]:
    """The ``function`` part of an OpenAI tool schema (or the schema itself if flat),
    checked so everything that reads it (the prompt's tool description, the tool-call
    parser, ``StepInfo``) can index it without further checks: ``name`` a str; ``parameters``,
    if present and not None, a dict whose ``properties`` (if present) is a dict of dicts
    and whose ``required`` (if present) is a list of str. The one copy of this check.

    Raises:
        ConfigError: the schema breaks one of these; the message names the schema, the
            part that is wrong and the shape expected.
    """
    def bad(what: str) -> ConfigError:
        return ConfigError(f"tool schema {_safe_repr(tool)} {what}; expected {_TOOL_SHAPE}")

    if not isinstance(tool, Mapping):
        raise bad(f"is a {type_name(tool)}, not a dict")
    fn = tool.get("function", tool)
    if not isinstance(fn, Mapping) or not isinstance(fn.get("name"), str):
        raise bad("has no function name")
    params = fn.get("parameters")
    if params is None:
        return fn
    if not isinstance(params, Mapping):
        raise bad(f"has parameters of type {type_name(params)}, not a dict")
    props = params.get("properties")
    if props is not None:
        if not isinstance(props, Mapping):
            raise bad(f"has parameters.properties of type {type_name(props)}, not a dict")
        for pname, pschema in props.items():
            if not isinstance(pschema, Mapping):
                raise bad(f"has property {pname!r} whose schema is a {type_name(pschema)}, not a dict")
    required = params.get("required")
    if required is not None and not (isinstance(required, (list, tuple)) and all(isinstance(r, str) for r in required)):
        raise bad(f"has parameters.required={_safe_repr(required)}, not a list of str")
    return fn



@dataclass(frozen=True)
class StepInfo:
    """The part of Gymnasium's ``info`` dict that the rollout reads (docs/design.md, "Step
    info"). An env returns a plain dict (Gymnasium's API); build it with ``to_info()`` so
    the key strings live here only, and read it with ``from_info()``, the one validator the
    rollout loop and ``environments.checker`` share. Other keys of ``info`` (``task_id``,
    ``split``, counters) are the env's own and pass through untouched.

    Attributes:
        anchor: hashable key of the state before the next action (GiGPO's anchor state,
            Feng et al. 2025, arXiv:2505.10978). None (or absent): the observation text is
            the anchor.
        observation_role: chat role of the observation message: ``user`` (default),
            ``tool`` or ``system``.
        tool_outputs: with role ``tool``, one string per tool call run; each becomes its
            own tool message (chat templates expect one per call). None: absent.
        system_prompt: (reset) the system message of the episode; None: absent.
        tools: (reset; at a step, those of a new ``branch``) OpenAI-style function schemas
            offered to the model, as dicts, each
            passing ``tool_function``. None: absent; ``()``: no tools.
        system_prompt_describes_tools: (reset) the system prompt already explains the
            tools in words, so the rollout must not append a generated description.
        example_messages: (reset) a worked example as chat turns (few-shot prompting; Brown
            et al. 2020, "Language Models are Few-Shot Learners", Sec. 2), placed between the
            system message and the task: each a ``{"role": ..., "content": str}`` dict with a
            role of ``EXAMPLE_ROLES``. They are prompt tokens (``loss_mask`` 0), repeated in
            every per-step prompt. None: absent.
        invalid_action: the action could not be parsed (the model's format fault).
        success: whether the episode's task was achieved (on the step that ends it);
            None: the env does not say.
        messages: chat messages, each a dict with ``role`` (one of ``MESSAGE_ROLES``) and
            ``content`` (str), and optionally ``tool_call_id`` (str), ``name`` (str) and
            ``tool_calls`` (a list of dicts, OpenAI style); at least one. At reset: the whole
            first prompt, template-ready (``system_prompt``, ``example_messages`` and the
            observation are then not used; ``tools`` still are). At a step: the messages
            after the completion (``observation_role`` and ``tool_outputs`` are then not
            used). Needs ``rollout.prompt_mode: full_history``. None: absent.
        branch: (step) the branch the next turn extends (``Turn.branch``); None: the
            branch of the turn just taken. A branch id not seen before in the episode starts
            a new branch, whose first prompt is the full rendering of ``messages`` (a fork:
            the engine is prompted with nothing before it). ``>= 0``.
        tool_calls: (step; info key ``"tool_call_count"``) how many tool calls the action
            just taken made (``Turn.tool_calls``). ``>= 0``; None: the env does not say.
        counters: named counts added into ``Episode.counters`` (e.g. ``{"gateway/forks":
            1}``): str keys outside the ``rollout/`` namespace, finite numbers (stored as
            float). None: absent.
        max_new_tokens: a cap on the next turn's new tokens, applied below
            ``rollout.max_new_tokens`` (the smaller wins); ``>= 1``. None: no cap.
        stop_strings: extra stop strings of the next turn, on top of
            ``rollout.stop_strings``; non-empty strs. None: none.
        reference_answer: (reset) the task's reference answer, for a judge
            (``reward.judge``: the rubric's ``reference``); a str. None: the task has none.
        final_answer: (the step that ends the episode) the answer as the env parsed it
            from the action, for a judge (the rubric's ``answer``); a str. None: the judge
            reads the last action's text.
    """

    anchor: Hashable = _NO_ANCHOR
    observation_role: ObservationRole = "user"
    tool_outputs: tuple[str, ...] | None = None
    system_prompt: str | None = None
    tools: tuple[dict[str, Any], ...] | None = None
    system_prompt_describes_tools: bool = False
    example_messages: tuple[dict[str, str], ...] | None = None
    invalid_action: bool = False
    success: bool | None = None
    messages: tuple[dict[str, Any], ...] | None = None
    branch: int | None = None
    tool_calls: int | None = None
    counters: Mapping[str, float] | None = None
    max_new_tokens: int | None = None
    stop_strings: tuple[str, ...] | None = None
    reference_answer: str | None = None
    final_answer: str | None = None

    def anchor_or(self, observation: str) -> Hashable:
        """The anchor, or ``observation`` when the env gave none."""
        return observation if self.anchor is None else self.anchor

    def to_info(self, **extra: Any) -> dict[str, Any]:
        """The ``info`` dict an env returns: ``anchor``, ``observation_role`` and
        ``invalid_action`` always, the other fields when set (``system_prompt_describes_tools``
        when True), then the env's own keys ``extra``.

        Raises:
            ContractError: a key of ``extra`` is one of ``STEP_INFO_KEYS``.
        """
        clash = sorted(k for k in extra if k in STEP_INFO_KEYS)
        if clash:
            raise ContractError(f"info keys {clash} are StepInfo fields; pass them to StepInfo(...), not as extra keys")
        info: dict[str, Any] = {"anchor": self.anchor, "observation_role": self.observation_role,
                                "invalid_action": self.invalid_action}
        if self.tool_outputs is not None:
            info["tool_outputs"] = list(self.tool_outputs)
        if self.system_prompt is not None:
            info["system_prompt"] = self.system_prompt
        if self.tools is not None:
            info["tools"] = [dict(t) for t in self.tools]
        if self.system_prompt_describes_tools:
            info["system_prompt_describes_tools"] = True
        if self.example_messages is not None:
            info["example_messages"] = [dict(m) for m in self.example_messages]
        if self.success is not None:
            info["success"] = self.success
        if self.messages is not None:
            info["messages"] = [copy.deepcopy(dict(m)) for m in self.messages]
        for key, value in (("branch", self.branch), ("tool_call_count", self.tool_calls),
                           ("max_new_tokens", self.max_new_tokens)):
            if value is not None:
                info[key] = value
        if self.counters is not None:
            info["counters"] = dict(self.counters)
        if self.stop_strings is not None:
            info["stop_strings"] = list(self.stop_strings)
        for key, text in (("reference_answer", self.reference_answer), ("final_answer", self.final_answer)):
            if text is not None:
                info[key] = text
        info.update(extra)
        return info

    @classmethod
    def from_info(cls, info: Any, *, env_id: str, where: str = "step") -> "StepInfo":
        """Parse and validate the step-info keys of an env's ``info`` dict.

        Accepted beyond the plain types: ``tool_outputs`` and ``tools`` as a list or a
        tuple; numpy's bool (``np.True_``) for the flags, stored as a Python bool
        (``as_bool``).

        Args:
            info: what ``reset`` or ``step`` returned as ``info``.
            env_id: the env, for messages.
            where: ``"reset"`` or ``"step"`` (or e.g. ``"step 3"``), for messages.

        Raises:
            StepInfoError (a ContractError): ``info`` is not a dict, or a key has a value of
                the wrong type (an anchor whose ``hash`` raises anything, an
                ``observation_role`` that is not one of the role strings, a tool schema
                ``tool_function`` refuses, an example turn that is not a dict with a role of
                ``EXAMPLE_ROLES`` and str content, a message that is not a dict with a role of
                ``MESSAGE_ROLES``, str content and only ``MESSAGE_OPTIONAL_KEYS`` besides, a
                count that is not an int in range, a counter that is not a finite number,
                a stop string that is not a non-empty str), or ``branch`` / ``tool_call_count``
                at reset; the message names the env, the key, the value and what was
                expected. Nothing else is raised.
        """
        def bad(key: str, value: Any, expected: str) -> StepInfoError:
            return StepInfoError(f"{env_id} {where}: info[{key!r}]={_safe_repr(value)} {expected}",
                                 env_id=env_id, key=key, value=value)

        if not isinstance(info, dict):
            raise StepInfoError(f"{env_id} {where}: info of type {type_name(info)}; expected dict",
                                env_id=env_id, key="info", value=info)
        anchor = info.get("anchor")
        try:
            hash(anchor)
        except TypeError:
            raise bad("anchor", anchor, "is not hashable; use a tuple/str/int state key (GiGPO groups steps by it)") from None
        except Exception as exc:
            raise bad("anchor", anchor, f"is not hashable: hash() raised {type_name(exc)}: {exc}; "
                      "use a tuple/str/int state key (GiGPO groups steps by it)") from exc
        role = info.get("observation_role", "user")
        if not isinstance(role, str) or role not in OBSERVATION_ROLES:
            raise bad("observation_role", role, f"is not one of {OBSERVATION_ROLES}")
        outputs = info.get("tool_outputs")
        if outputs is not None and not (isinstance(outputs, (list, tuple)) and all(isinstance(o, str) for o in outputs)):
            raise bad("tool_outputs", outputs, "must be a list of str (one per tool call)")
        prompt = info.get("system_prompt")
        if prompt is not None and not isinstance(prompt, str):
            raise bad("system_prompt", prompt, f"must be str, got {type_name(prompt)}")
        tools = info.get("tools")
        if tools is not None:
            if not (isinstance(tools, (list, tuple)) and all(isinstance(t, dict) for t in tools)):
                raise bad("tools", tools, "must be a list of dict (OpenAI-style function schemas)")
            for i, tool in enumerate(tools):
                try:
                    tool_function(tool)
                except ConfigError as exc:
                    raise bad("tools", tools, f"has a bad tool {i}: {exc}") from exc
        examples = info.get("example_messages")
        if examples is not None:
            if not isinstance(examples, (list, tuple)):
                raise bad("example_messages", examples, "must be a list of {'role': ..., 'content': str} dicts")
            for i, m in enumerate(examples):
                if not (isinstance(m, dict) and set(m) == {"role", "content"} and m["role"] in EXAMPLE_ROLES
                        and isinstance(m["content"], str)):
                    raise bad("example_messages", examples,
                              f"has a bad turn {i} ({_safe_repr(m, 80)}): expected a dict with exactly 'role' (one of "
                              f"{EXAMPLE_ROLES}) and 'content' (str)")
        flags: dict[str, bool | None] = {}
        for key, default in (("system_prompt_describes_tools", False), ("invalid_action", False), ("success", None)):
            value = info.get(key, default)
            flag = as_bool(value)
            if flag is None and not (value is None and default is None):
                raise bad(key, value, f"must be bool, got {type_name(value)}")
            flags[key] = flag
        reset = where.startswith("reset")
        ints: dict[str, int | None] = {}
        for key, field_name, lo in (("branch", "branch", 0), ("tool_call_count", "tool_calls", 0),
                                    ("max_new_tokens", "max_new_tokens", 1)):
            value = info.get(key)
            if value is None:
                ints[field_name] = None
                continue
            if reset and key in ("branch", "tool_call_count"):
                raise bad(key, value, "is for step only (reset starts branch 0 and runs no action)")
            n = _as_int(value)
            if n is None or n < lo:
                raise bad(key, value, f"must be an int >= {lo}, got {type_name(value)}")
            ints[field_name] = n
        texts: dict[str, str | None] = {}
        for key in ("reference_answer", "final_answer"):
            value = info.get(key)
            if value is not None and not isinstance(value, str):
                raise bad(key, value, f"must be str, got {type_name(value)}")
            texts[key] = value
        if reset and texts["final_answer"] is not None:
            raise bad("final_answer", texts["final_answer"], "is for the step that ends the episode, not reset")
        return cls(anchor=anchor, observation_role=role,
                   tool_outputs=tuple(outputs) if outputs is not None else None,
                   system_prompt=prompt, tools=tuple(tools) if tools is not None else None,
                   example_messages=tuple(dict(m) for m in examples) if examples is not None else None,
                   messages=_messages(info.get("messages"), bad), counters=_counters(info.get("counters"), bad),
                   stop_strings=_stop_strings(info.get("stop_strings"), bad), **ints, **flags, **texts)


def _as_int(value: Any) -> int | None:
    """``value`` as a Python int when it is an int or a numpy integer (never a bool), else None."""
    if as_bool(value) is not None:
        return None
    try:
        return operator.index(value)
    except TypeError:
        return None


def _messages(value: Any, bad: Any) -> tuple[dict[str, Any], ...] | None:
    """``info["messages"]`` checked (``StepInfo.messages``), as a tuple of deep copies."""
    if value is None:
        return None
    shape = ("must be a non-empty list of {'role': ..., 'content': str} dicts (optional keys: "
             f"{', '.join(MESSAGE_OPTIONAL_KEYS)})")
    if not isinstance(value, (list, tuple)) or not value:
        raise bad("messages", value, shape)
    for i, m in enumerate(value):
        if not isinstance(m, dict):
            raise bad("messages", value, f"has a message {i} of type {type_name(m)}; expected a dict")
        if m.get("role") not in MESSAGE_ROLES:
            raise bad("messages", value, f"has a message {i} with role={_safe_repr(m.get('role'), 40)}; expected one "
                      f"of {MESSAGE_ROLES}")
        if not isinstance(m.get("content"), str):
            raise bad("messages", value, f"has a message {i} with content of type {type_name(m.get('content'))}; "
                      "expected str")
        extra = sorted(str(k) for k in m if k not in ("role", "content") + MESSAGE_OPTIONAL_KEYS)
        if extra:
            raise bad("messages", value, f"has a message {i} with keys {extra}; expected only 'role', 'content' "
                      f"and {MESSAGE_OPTIONAL_KEYS}")
        for key in ("tool_call_id", "name"):
            if key in m and not isinstance(m[key], str):
                raise bad("messages", value, f"has a message {i} with {key} of type {type_name(m[key])}; expected str")
        calls = m.get("tool_calls")
        if "tool_calls" in m and not (isinstance(calls, (list, tuple)) and all(isinstance(c, dict) for c in calls)):
            raise bad("messages", value, f"has a message {i} with tool_calls={_safe_repr(calls, 80)}; expected a list "
                      "of dicts")
    return tuple(copy.deepcopy(dict(m)) for m in value)


RESERVED_METRIC_NAMESPACES = frozenset({
    "actor", "advantages", "async", "cluster", "critic", "eval", "eval_before", "filter", "forward", "judge", "kl",
    "losses",
    "perf", "policy", "profile", "replay", "rollout", "rollout_corr", "sandbox", "shaping", "sync", "time",
    "timeline", "tokens", "train", "trainer",
})
"""Metric namespaces the run writes itself (docs/metrics.md); an env's counters
(``StepInfo.counters``) live outside them, so they never overwrite a run's metric."""


def _counters(value: Any, bad: Any) -> dict[str, float] | None:
    """``info["counters"]`` checked (``StepInfo.counters``), values as floats."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise bad("counters", value, "must be a dict of str -> finite number")
    out: dict[str, float] = {}
    for key, v in value.items():
        ns, slash, rest = key.partition("/") if isinstance(key, str) else ("", "", "")
        if not slash or not ns or not rest or ns in RESERVED_METRIC_NAMESPACES:
            raise bad("counters", value, f"has a key {_safe_repr(key, 80)}; expected '<namespace>/<name>' with a "
                      "namespace of the env's own (e.g. 'gateway/forks'), not one the run's own metrics use "
                      f"({', '.join(sorted(RESERVED_METRIC_NAMESPACES))})")
        if as_bool(v) is not None or not isinstance(v, numbers.Real) or not math.isfinite(float(v)):
            raise bad("counters", value, f"has {key!r}: {_safe_repr(v, 80)}; expected a finite number")
        out[key] = float(v)
    return out


def _stop_strings(value: Any, bad: Any) -> tuple[str, ...] | None:
    """``info["stop_strings"]`` checked (``StepInfo.stop_strings``)."""
    if value is None:
        return None
    if not (isinstance(value, (list, tuple)) and all(isinstance(x, str) and x for x in value)):
        raise bad("stop_strings", value, "must be a list of non-empty str")
    return tuple(value)
