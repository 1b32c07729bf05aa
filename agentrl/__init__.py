"""agentrl: multi-turn agentic RL (sandboxed gymnasium text environments, vLLM rollouts,
GRPO/GiGPO/critic credit assignment, an FSDP2 trainer, a Ray controller, a replay store).

The public API, for scripts and notebooks (the ``agentrl`` command line covers the same)::

    import agentrl

    agentrl.register_env("mine/Add-v0", "my_envs:AddEnv")       # or gymnasium.register
    cfg = agentrl.default_config(["env.id=mine/Add-v0", "env.import_modules=[my_envs]"])
    summary = agentrl.train(cfg)                                 # a RunSummary
    store = agentrl.open_replay_store(summary.run_dir)           # its replay.db

- ``load_config(path, overrides)``: a YAML file plus ``key.sub=value`` overrides
  (``path=None``: the config classes' defaults) → ``agentrl.config.Config``.
- ``default_config(overrides)``: the embedded default that ``agentrl train`` runs.
- ``train(cfg, resume=False)``: run it (``agentrl.cluster.controller.train``).
- ``register_env(env_id, entry_point, **kwargs)``: register an environment with Gymnasium.
- ``register_estimator(name, fn, ...)``: register an advantage estimator
  (``critics.register_estimator``), so ``algorithm.advantage: <name>`` trains with it.
- ``open_replay_store(url_or_run_dir)``: the ``agentrl.replay.ReplayStore`` of a run.
- ``__version__``: the installed distribution's version.

Every name is imported on first use (module ``__getattr__``), so ``import agentrl`` stays
cheap: it imports no torch, Ray, vLLM or environment.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from agentrl.errors import ConfigError

_LAZY: dict[str, tuple[str, str]] = {
    "load_config": ("agentrl.config", "load_config"),
    "default_config": ("agentrl.config", "load_default_config"),
    "Config": ("agentrl.config", "Config"),
    "train": ("agentrl.cluster.controller", "train"),
    "register_estimator": ("critics", "register_estimator"),
}
"""Public name -> (module, attribute) of what it forwards to, imported on first access."""

__all__ = ["__version__", "register_env", "open_replay_store", *_LAZY]


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


def open_replay_store(where: str | Path) -> Any:
    """Open a replay store: a SQLAlchemy URL (``sqlite:///runs/x/replay.db``,
    ``postgresql+psycopg://...``) or a run directory (its ``replay.db``).

    Returns:
        ``agentrl.replay.ReplayStore``.

    Raises:
        ConfigError: ``where`` is neither a URL nor a run directory holding ``replay.db``,
            or the URL cannot be used (see ``ReplayStore``).
        InfraError: the database cannot be reached or opened.
    """
    from agentrl.replay import ReplayStore

    text = str(where)
    if "://" not in text:
        db = Path(text) / "replay.db"
        if not db.is_file():
            raise ConfigError(f"{text!r} is not a run directory with a replay.db (and not a database URL)")
        text = f"sqlite:///{db.resolve()}"
    return ReplayStore(text)
