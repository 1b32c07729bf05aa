"""agentrl: multi-turn agentic RL (sandboxed gymnasium text environments, vLLM rollouts,
GRPO/GiGPO/critic credit assignment, an FSDP2 trainer, a Ray controller, a replay store).

The public API, for scripts and notebooks (the ``agentrl`` command line covers the same)::

    import agentrl

    agentrl.register_env("mine/Add-v0", "my_envs:AddEnv")       # or gymnasium.register
    cfg = agentrl.default_config(["env.id=mine/Add-v0", "env.import_modules=[my_envs]"])
    summary = agentrl.train(cfg)                                 # a RunSummary
    agentrl.train(cfg, resume=True)                              # continue it (more run.iterations)
    store = agentrl.open_replay_store(summary.run_dir)           # its replay.db

Three ways to a ``Config`` (``agentrl.config.Config``), each plus ``key.sub=value`` overrides:

- ``default_config(overrides)``: the embedded default, what ``agentrl train`` runs without a
  config file (ShellLookup, SmolLM2-135M-Instruct, GRPO, held-out eval before and after).
- ``code_defaults(overrides)``: the config classes' own field defaults (what every field's
  documentation calls its default; no eval during training), for building a config from
  scratch in code.
- ``load_config(path, overrides)``: a YAML file. ``path=None`` gives ``code_defaults``, not
  the embedded default (kept for the scripts that call it so; prefer the two names above).

Then:

- ``train(cfg, resume=False)``: run it, or with ``resume=True`` continue the run in
  ``cfg``'s run directory from its latest checkpoint (``agentrl.driver.controller.train``);
  returns a ``RunSummary``.
- ``RunSummary``: what ``train`` returns (run directory, run id, iterations done, policy
  version, metrics history, status).
- ``register_env(env_id, entry_point, **kwargs)``: register an environment with Gymnasium.
- ``register_estimator(name, fn, ...)``: register an advantage estimator
  (``critics.register_estimator``), so ``algorithm.advantage: <name>`` trains with it.
- ``open_replay_store(url_or_run_dir)``: the ``agentrl.replay.ReplayStore`` of a run
  (``agentrl.replay.open_replay_store``).
- ``__version__``: the installed distribution's version.

Every name is imported on first use (module ``__getattr__``), so ``import agentrl`` stays
cheap: it imports no torch, Ray, vLLM or environment.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from agentrl.errors import ConfigError

if TYPE_CHECKING:  # what type checkers see for the lazily forwarded names (never imported at run time)
    from agentrl.driver.controller import RunSummary, train
    from agentrl.config import Config, code_defaults, load_config
    from agentrl.config import load_default_config as default_config
    from agentrl.replay import open_replay_store
    from critics import register_estimator

_LAZY: dict[str, tuple[str, str]] = {
    "load_config": ("agentrl.config", "load_config"),
    "default_config": ("agentrl.config", "load_default_config"),
    "code_defaults": ("agentrl.config", "code_defaults"),
    "Config": ("agentrl.config", "Config"),
    "train": ("agentrl.driver.controller", "train"),
    "RunSummary": ("agentrl.driver.controller", "RunSummary"),
    "register_estimator": ("critics", "register_estimator"),
    "open_replay_store": ("agentrl.replay", "open_replay_store"),
}
"""Public name -> (module, attribute) of what it forwards to, imported on first access."""

__all__ = ["__version__", "register_env", *_LAZY]


def _version() -> str:
    from importlib import metadata  # ~30 ms (email parsing): only when asked

    try:
        return metadata.version("agentrl")
    except metadata.PackageNotFoundError:  # a source tree that is not installed
        return "0+unknown"


def __getattr__(name: str) -> Any:
    if name == "__version__":
        globals()[name] = value = _version()
        return value
    if name in _LAZY:
        module, attr = _LAZY[name]
        value = getattr(importlib.import_module(module), attr)
        globals()[name] = value  # later accesses skip __getattr__
        return value
    raise AttributeError(f"module 'agentrl' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


def register_env(env_id: str, entry_point: Any, **kwargs: Any) -> None:
    """Register an environment with Gymnasium (``gymnasium.register``), once.

    Args:
        env_id: a versioned id, e.g. ``"mine/Add-v0"`` (your own namespace).
        entry_point: ``"module:Class"`` (importable in every process that makes the env:
            list the module in ``env.import_modules``) or the class itself.
        **kwargs: further ``gymnasium.register`` arguments (e.g. ``kwargs={...}``).

    Raises:
        ConfigError: ``env_id`` is already registered with another entry point.
    """
    import gymnasium

    if env_id in gymnasium.registry:
        existing = gymnasium.registry[env_id].entry_point
        if existing == entry_point:
            return
        raise ConfigError(f"env id {env_id!r} is already registered with entry point {existing!r}, "
                          f"not {entry_point!r}; pick another id or version")
    gymnasium.register(id=env_id, entry_point=entry_point, **kwargs)

