"""Loading the run config: from a mapping, a YAML file or the embedded default, plus
``key.sub=value`` overrides; a pydantic ``ValidationError`` becomes one ``ConfigError``
that names each bad key, its value and what was expected (an unknown key with the close
names)."""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from importlib import resources
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from agentrl.config.run_config import Config
from agentrl.errors import ConfigError


def _section_keys(loc: Sequence[Any]) -> list[str] | None:
    """The keys the config section at ``loc`` accepts (``()``: the top level), or None when
    ``loc`` is not a section (e.g. inside ``env.kwargs``, which takes any key)."""
    model: Any = Config
    for part in loc:
        field = model.model_fields.get(part) if isinstance(part, str) else None
        model = field.annotation if field is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
    return list(model.model_fields)


def _unknown_key(loc: Sequence[Any]) -> str:
    """``unknown key 'run.iteratons'; did you mean 'run.iterations'?`` (close names by
    difflib, as Gymnasium suggests env ids), else the section's keys."""
    key = ".".join(str(p) for p in loc)
    keys = _section_keys(loc[:-1])
    if not keys:
        return f"unknown key '{key}'"
    prefix = "".join(f"{p}." for p in loc[:-1])
    close = difflib.get_close_matches(str(loc[-1]), keys, n=3, cutoff=0.6)
    if close:
        return f"unknown key '{key}'; did you mean " + " or ".join(f"'{prefix}{c}'" for c in close) + "?"
    where = f"section '{prefix[:-1]}'" if prefix else "the top level"
    return f"unknown key '{key}'; {where} has: {', '.join(keys)}"


def _short_repr(value: Any, limit: int = 200) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _format_validation_error(exc: ValidationError) -> str:
    """One line per pydantic error: ``key=value: what was expected``; an unknown key with the
    close names; a cross-field check (a model validator, whose ``input`` is the whole section
    or config) by its own message alone, which names the fields and values it compared."""
    lines = []
    for err in exc.errors():
        loc = tuple(err["loc"])
        key = ".".join(str(p) for p in loc) or "<config>"
        if err["type"] == "extra_forbidden":
            lines.append(_unknown_key(loc))
        elif err["type"] == "value_error" and isinstance(err.get("input"), dict):
            # A model validator (cross-field check): pydantic hands the whole section (or, at
            # the top level, the whole config with an empty loc) as input; never dump it.
            msg = str(err["ctx"]["error"]) if "error" in err.get("ctx", {}) else err["msg"]
            lines.append(msg if not loc or key in msg else f"{key}: {msg}")
        else:
            lines.append(f"{key}={_short_repr(err.get('input'))}: {err['msg']}")
    return "invalid config: " + "; ".join(lines)


def _parse_override(item: str) -> tuple[list[str], Any]:
    if "=" not in item:
        raise ConfigError(f"override {item!r} is not of the form key.sub=value")
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not p for p in key.split(".")):
        raise ConfigError(f"override {item!r} has an empty key")
    try:
        value = yaml.safe_load(raw) if raw.strip() else ""
    except yaml.YAMLError as exc:
        raise ConfigError(f"override {item!r}: value is not valid YAML ({exc})") from exc
    return key.split("."), value


def config_from_dict(data: dict[str, Any], overrides: Sequence[str] = ()) -> Config:
    """Build a validated ``Config`` from a mapping plus ``key.sub=value`` overrides.

    Raises:
        ConfigError: unknown key, wrong type or out-of-range value (the message names each).
    """
    data = _deep_copy(data)
    for item in overrides:
        path, value = _parse_override(item)
        node = data
        for p in path[:-1]:
            nxt = node.setdefault(p, {})
            if not isinstance(nxt, dict):
                raise ConfigError(f"override {item!r}: '{p}' is not a section")
            node = nxt
        node[path[-1]] = value
    try:
        return Config.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(exc)) from None


DEFAULT_CONFIG_RESOURCE = "defaults/shell_lookup.yaml"
"""The embedded default run config, package data of ``agentrl`` (read with
``importlib.resources``, so it works from any install); ``examples/shell_lookup.yaml`` is the
same file for users to copy."""


def _yaml_mapping(text: str, where: str) -> dict[str, Any]:
    try:
        loaded = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file {where!r} is not valid YAML: {exc}") from None
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config file {where!r} must hold a mapping, got {type(loaded).__name__}")
    return loaded


def code_defaults(overrides: Sequence[str] = ()) -> Config:
    """The config classes' own field defaults (each field's documented default) plus
    ``overrides``: a config built from scratch in code. Not what ``agentrl train`` runs
    without a file; that is the embedded default, ``load_default_config``
    (``agentrl.default_config``), whose rollout, eval and env sections differ.

    Raises:
        ConfigError: an override is malformed or invalid.
    """
    return config_from_dict({}, overrides)


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> Config:
    """Load the YAML file at ``path`` and apply ``overrides`` (``key.sub=value``).

    ``path=None`` gives ``code_defaults(overrides)``, the config classes' defaults, *not*
    the embedded default that ``agentrl train`` runs without a file
    (``load_default_config``). It stays for the scripts and tests that call it so (it is
    public API as ``agentrl.load_config``); new code names what it means with
    ``code_defaults`` or ``load_default_config``.

    Raises:
        ConfigError: the file is missing or not a YAML mapping, or validation fails.
    """
    data: dict[str, Any] = {}
    if path is not None:
        p = Path(path)
        if not p.is_file():
            raise ConfigError(f"config file {str(p)!r} does not exist")
        data = _yaml_mapping(p.read_text(), str(p))
    return config_from_dict(data, overrides)


def default_config_text() -> str:
    """The text of the embedded default config (``agentrl/defaults/shell_lookup.yaml``)."""
    return resources.files("agentrl").joinpath(DEFAULT_CONFIG_RESOURCE).read_text(encoding="utf-8")


def load_default_config(overrides: Sequence[str] = ()) -> Config:
    """The embedded default (what ``agentrl train`` runs without a config file): one CPU
    machine, SmolLM2-135M-Instruct, ShellLookup (look-up jobs with a bash tool in a sandbox),
    GRPO, held-out eval before and after training; plus ``overrides``.

    Raises:
        ConfigError: an override is malformed or invalid.
    """
    return config_from_dict(_yaml_mapping(default_config_text(), f"agentrl/{DEFAULT_CONFIG_RESOURCE}"), overrides)


def _deep_copy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deep_copy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deep_copy(v) for v in d]
    return d
