"""Registration of environments with Gymnasium: agentrl's own and those other packages bring.

Three ways an environment becomes available to ``make_env`` / ``gymnasium.make``:

1. agentrl's built-ins (``ENV_ENTRY_POINTS``), registered by ``register_envs()`` when
   ``environments`` is imported, under the ``agentrl/`` namespace (``agentrl/Name-vN``;
   a behaviour change bumps N, and the old id goes into ``RETIRED_ENV_IDS``).
2. Any code calling ``gymnasium.register(id="myns/MyEnv-v0", entry_point=...)`` before
   the env is made (any namespace).
3. An installed distribution advertising the entry-point group ``agentrl.environments``
   (``ENTRY_POINT_GROUP``) in its metadata, e.g. in ``pyproject.toml``::

       [project.entry-points."agentrl.environments"]
       mypkg = "mypkg.envs:register"       # a callable: called once, registers its envs
       # or  mypkg = "mypkg.envs"          # a module: importing it registers its envs

   ``load_entry_points()`` loads every such entry point once per process (so
   ``pip install mypkg`` is all a user does); ``make_env`` and ``import environments``
   call it.
4. Modules named at run time (``import_env_modules(["my_envs"])``, or the
   ``AGENTRL_ENV_MODULES`` environment variable, comma-separated, read by ``import
   environments``): for environments that live in a script or a module that is not an
   installed distribution (e.g. ``examples/custom_env.py``), so processes other than the
   driver (Ray actors) register them too.

``make_env(env_id, sandbox=...)`` makes an env with its sandbox injected. The sandbox is
never created or closed here: the caller owns it. An environment class that runs entirely
in-process sets the class attribute ``uses_sandbox = False``; the rollout then makes it
with no sandbox at all (none is started per episode). The default is ``True``.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import logging
import os
import threading
import types
from typing import Any, Iterable

import gymnasium

from agentrl.errors import ConfigError, EnvError

__all__ = [
    "ENV_ENTRY_POINTS",
    "RETIRED_ENV_IDS",
    "ENTRY_POINT_GROUP",
    "ENV_MODULES_VAR",
    "register_envs",
    "registered_env_ids",
    "load_entry_points",
    "import_env_modules",
    "make_env",
    "env_class",
]

ENV_ENTRY_POINTS: dict[str, str] = {
    "agentrl/HumanEval-v0": "environments.humaneval:HumanEvalEnv",
    "agentrl/ShellTasks-v0": "environments.shell_tasks:ShellTasksEnv",
    "agentrl/ShellLookup-v1": "environments.shell_lookup:ShellLookupEnv",
    "agentrl/GuessNumber-v0": "environments.guess_number:GuessNumberEnv",
    "agentrl/MathAnswer-v0": "environments.math_answer:MathAnswerEnv",
    "agentrl/Sokoban-v0": "environments.sokoban:SokobanEnv",
    "agentrl/TextWorld-v0": "environments.textworld_env:TextWorldEnv",  # needs `textworld`
}
"""Gymnasium id -> ``module:Class`` of each environment agentrl ships."""

RETIRED_ENV_IDS: dict[str, str] = {
    "agentrl/ShellLookup-v0": (
        "use agentrl/ShellLookup-v1: its tasks changed on 2026-12-03 (v0's families value, note, "
        "count, find, first_line and rename became five that create the directory a file names "
        "plus value; each task names the command that reads its file; the worked example is shown "
        "as chat turns), so results under v0 are not comparable with v1, and v0's tasks are not kept"
    ),
}
"""Ids agentrl no longer makes -> what replaced them and what changed. A behaviour change of
an environment bumps its version (Gymnasium's rule: results stay comparable by id);
``make_env``/``env_class`` refuse a retired id with ``ConfigError`` naming its successor,
and Gymnasium's own ``gymnasium.make`` raises ``DeprecatedEnv`` for it (a later version of
the same name is registered)."""

ENTRY_POINT_GROUP = "agentrl.environments"
"""The entry-point group through which installed packages advertise environments."""

ENV_MODULES_VAR = "AGENTRL_ENV_MODULES"
"""Environment variable: comma-separated module names that ``import environments`` imports."""

log = logging.getLogger(__name__)
_loaded_entry_points: set[tuple[str, str]] = set()  # (distribution, entry point name)
_lock = threading.Lock()


def register_envs() -> list[str]:
    """Register every environment of ``ENV_ENTRY_POINTS`` not yet in Gymnasium's registry.

    Returns:
        The ids registered by this call (``[]`` when all were already registered).
    """
    added = []
    for env_id, entry_point in ENV_ENTRY_POINTS.items():
        if env_id in gymnasium.registry:
            continue
        # No TimeLimit wrapper (max_episode_steps): the env and the rollout bound episodes.
        gymnasium.register(id=env_id, entry_point=entry_point)
        added.append(env_id)
    return added


def registered_env_ids() -> list[str]:
    """agentrl's environment ids currently in Gymnasium's registry."""
    return [env_id for env_id in ENV_ENTRY_POINTS if env_id in gymnasium.registry]


def load_entry_points(*, strict: bool = True) -> list[str]:
    """Load every not-yet-loaded entry point of the group ``agentrl.environments``.

    An entry point resolving to a module is imported (importing it registers its envs); one
    resolving to any other callable is called with no arguments. Each is loaded once per
    process (a failed one is retried by the next call). Distributions are found on
    ``sys.path`` as it is now (a path added later is scanned by the next call).

    Args:
        strict: raise on a failing entry point; ``False`` (what ``import environments``
            uses, so one broken package does not break every env): log a warning and go on.

    Returns:
        The Gymnasium ids that appeared in the registry during this call.

    Raises:
        EnvError: an entry point failed to import or its callable raised; the message names
            the distribution, the entry point and its value.
    """
    with _lock:
        before = set(gymnasium.registry)
        for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
            dist = ep.dist.name if ep.dist is not None else "?"
            key = (dist, ep.name)
            if key in _loaded_entry_points:
                continue
            try:
                target = ep.load()
                if not isinstance(target, types.ModuleType):
                    if not callable(target):
                        raise TypeError(f"{target!r} is neither a module nor a callable")
                    target()
            except Exception as exc:
                error = EnvError(
                    f"entry point {ep.name!r} = {ep.value!r} of distribution {dist!r} "
                    f"(group {ENTRY_POINT_GROUP!r}) failed to register its environments: "
                    f"{type(exc).__name__}: {exc}"
                )
                if strict:
                    raise error from exc
                log.warning("%s", error)
                continue
            _loaded_entry_points.add(key)
        return sorted(set(gymnasium.registry) - before)


def import_env_modules(names: Iterable[str] | None = None) -> list[str]:
    """Import modules that register environments when imported.

    Args:
        names: module names (``"my_envs"``, ``"mypkg.envs"``); ``None``: those in the
            environment variable ``AGENTRL_ENV_MODULES`` (comma-separated; unset or empty:
            none). Already-imported modules are not re-imported.

    Returns:
        The Gymnasium ids that appeared in the registry during this call.

    Raises:
        ConfigError: a module cannot be imported (the message names it and the error).
    """
    if names is None:
        names = [n.strip() for n in os.environ.get(ENV_MODULES_VAR, "").split(",") if n.strip()]
    before = set(gymnasium.registry)
    for name in names:
        if not isinstance(name, str) or not name:
            raise ConfigError(f"environment module name {name!r} must be a non-empty str")
        try:
            importlib.import_module(name)
        except Exception as exc:
            raise ConfigError(
                f"environment module {name!r} could not be imported ({type(exc).__name__}: {exc}); "
                "it must be importable (on sys.path / PYTHONPATH) in every process that makes envs"
            ) from exc
    return sorted(set(gymnasium.registry) - before)


def _refuse_retired(env_id: str) -> None:
    if env_id in RETIRED_ENV_IDS and env_id not in gymnasium.registry:
        raise ConfigError(f"env id {env_id!r} is retired: {RETIRED_ENV_IDS[env_id]}")


def env_class(env_id: str) -> Any:
    """The class (or creator callable) registered under ``env_id``, without making an env.

    Raises:
        ConfigError: ``env_id`` is not registered (after loading entry points), or is
            retired (``RETIRED_ENV_IDS``: the message names its successor).
    """
    load_entry_points()
    _refuse_retired(env_id)
    try:
        spec = gymnasium.spec(env_id)
    except gymnasium.error.Error as exc:
        raise ConfigError(f"env id {env_id!r} is not registered ({exc})") from None
    if isinstance(spec.entry_point, str):
        from gymnasium.envs.registration import load_env_creator

        return load_env_creator(spec.entry_point)
    return spec.entry_point


def make_env(env_id: str, sandbox: Any = None, **kwargs: Any) -> gymnasium.Env:
    """Make the environment registered as ``env_id`` with ``sandbox`` injected.

    Entry points of ``agentrl.environments`` are loaded first, so envs of installed
    packages are found. The env is built with ``gymnasium.make`` (no passive env checker:
    use ``environments.checker.check_env``), so ``env.unwrapped`` is the env itself.

    Args:
        env_id: a registered id, e.g. ``"agentrl/ShellTasks-v0"``.
        sandbox: passed as the ``sandbox`` keyword when not ``None`` (envs that need none,
            like ``agentrl/Sokoban-v0``, may be made without). Owned by the caller: the env
            never closes it.
        **kwargs: further constructor keywords (override the registration's kwargs).

    Raises:
        ConfigError: ``env_id`` is not registered or is retired (``RETIRED_ENV_IDS``: the
            message names its successor), or the constructor rejected the kwargs.
        EnvError: an entry point failed to load.
    """
    load_entry_points()
    _refuse_retired(env_id)
    if env_id not in gymnasium.registry:
        known = sorted(k for k in gymnasium.registry if "/" in k)
        raise ConfigError(
            f"env id {env_id!r} is not registered; registered namespaced ids: {known}. "
            f"Register it with gymnasium.register or the {ENTRY_POINT_GROUP!r} entry-point group"
        )
    if sandbox is not None:
        kwargs["sandbox"] = sandbox
    try:
        return gymnasium.make(env_id, disable_env_checker=True, **kwargs)
    except TypeError as exc:
        raise ConfigError(f"cannot make {env_id!r} with kwargs {sorted(kwargs)}: {exc}") from exc
