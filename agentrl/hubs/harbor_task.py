"""Harbor task folders, read without ``harbor``: the task set under a path, one task's
``task.toml`` as the settings ``hub/Harbor-v0`` honours, and the verifier's reward files.

A task is a folder holding ``task.toml`` (Harbor's task config), ``instruction.md`` (the
prompt), ``environment/Dockerfile`` (unless ``[environment] docker_image`` names an image),
``tests/test.sh`` (the verifier; it writes ``/logs/verifier/reward.txt`` or ``reward.json``)
and, optionally, ``solution/solve.sh`` (the oracle). Its task id is the folder's name.

The keys read (Harbor's names; every other key is ignored, as Harbor ignores keys it does not
use, e.g. ``[metadata]``, ``[task]``, ``version``, ``schema_version``):

========================================  ==================================================
``[agent] timeout_sec``                   the agent's time, seconds (default 600)
``[verifier] timeout_sec``                ``tests/test.sh``'s time, seconds (default 600)
``[verifier] env``, ``[solution] env``    variables of the verifier, of the oracle (as
                                          written: no ``${VAR}`` is expanded from the host)
``[environment] build_timeout_sec``       the image build's time, seconds (default 600)
``[environment] docker_image``            run this image (already on the daemon) instead of
                                          building ``environment/Dockerfile``
``[environment] cpus``, ``memory_mb``     the container's limits (``memory = "4G"``, the
                                          older spelling, is read too)
``[environment] network_mode``            ``public``, ``no-network`` or ``allowlist``; the
                                          older ``allow_internet`` (bool) is read when
                                          ``network_mode`` is absent; default ``public``
``[agent]/[verifier] network_mode``       phase overrides: refused unless equal to the
                                          environment's (one container, one network)
========================================  ==================================================

Refused (``HarborError``, an infrastructure error; never a score): a GPU or TPU request,
``os`` other than linux, a separate verifier environment (``[verifier.environment]``),
multi-step tasks (``steps/``), multi-container tasks (``environment/docker-compose.yaml``),
and any value of the wrong type, each named with its file and key. ``storage_mb`` and the
``user`` keys are ignored: commands run as the sandbox user (uid 1000, no capabilities).

Splits: every task is in every split (``train``, ``test``, ``all``) unless the path holds
``splits.json``, ``{"<split>": ["<task id>", ...], ...}``: then its splits, and ``all``
(every task).
"""

from __future__ import annotations

import json
import math
import os
import re
import tomllib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from agentrl.errors import ConfigError, InfraError

__all__ = ["HarborError", "HarborTask", "TaskConfig", "TaskSet", "DEFAULT_SPLITS", "NETWORK_MODES",
           "PATH_ENV", "container_network", "load_task", "parse_reward", "parse_task_config"]

TASK_FILE = "task.toml"
INSTRUCTION_FILE = "instruction.md"
SPLITS_FILE = "splits.json"
PATH_ENV = "AGENTRL_HARBOR_PATH"
"""The task path when neither ``env.kwargs.path`` nor a registered default names one
(``agentrl envs check hub/Harbor-v0`` passes no kwargs)."""
DEFAULT_SPLITS = ("train", "test", "all")
DEFAULT_TIMEOUT_S = 600.0
"""Harbor's default agent, verifier and build timeouts, seconds."""
NETWORK_MODES = ("public", "no-network", "allowlist")
REWARD_KEY = "reward"


class HarborError(InfraError):
    """A Harbor task, its image, its container or its verifier failed: a bad ``task.toml``, a
    build that failed or ran past its time, a ``test.sh`` past the verifier timeout or without
    a readable reward. Never the model's fault: the episode ends with ``infra_error``, never a
    score of 0. ``task_id`` names the task."""

    def __init__(self, message: str, *, task_id: str = "") -> None:
        super().__init__(message)
        self.task_id = task_id


@dataclass(frozen=True)
class TaskConfig:
    """What ``hub/Harbor-v0`` uses of one ``task.toml`` (module docstring).

    Attributes:
        agent_timeout_s, verifier_timeout_s, build_timeout_s: seconds.
        network: ``public``, ``no-network`` or ``allowlist`` (Harbor's network modes).
        allowed_hosts: the hosts of an ``allowlist``.
        cpus: CPU cores, or None (the env's default).
        memory_mb: MiB, or None (the env's default).
        docker_image: a prebuilt image to run, or None (build ``environment/Dockerfile``).
        verifier_env, solution_env: variables of ``test.sh`` and ``solve.sh``.
    """

    agent_timeout_s: float = DEFAULT_TIMEOUT_S
    verifier_timeout_s: float = DEFAULT_TIMEOUT_S
    build_timeout_s: float = DEFAULT_TIMEOUT_S
    network: str = "public"
    allowed_hosts: tuple[str, ...] = ()
    cpus: float | None = None
    memory_mb: int | None = None
    docker_image: str | None = None
    verifier_env: Mapping[str, str] = field(default_factory=dict)
    solution_env: Mapping[str, str] = field(default_factory=dict)


def _table(data: Mapping[str, Any], key: str, where: str) -> dict[str, Any]:
    value = data.get(key, {})
    if not isinstance(value, dict):
        raise HarborError(f"{where}: [{key}] is a {type(value).__name__}; expected a table")
    return value


def _seconds(section: Mapping[str, Any], key: str, where: str) -> float:
    value = section.get(key, DEFAULT_TIMEOUT_S)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise HarborError(f"{where}: {key}={value!r} must be a number of seconds > 0")
    return float(value)


def _env(section: Mapping[str, Any], key: str, where: str) -> dict[str, str]:
    value = section.get("env", {})
    if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
        raise HarborError(f"{where}: [{key}] env={value!r} must be a table of strings")
    return dict(value)


def _memory_mb(env: Mapping[str, Any], where: str) -> int | None:
    if "memory_mb" in env:
        value = env["memory_mb"]
        if isinstance(value, bool) or not isinstance(value, int) or value < 16:
            raise HarborError(f"{where}: [environment] memory_mb={value!r} must be an integer >= 16 (MiB)")
        return value
    if "memory" not in env:
        return None
    value = env["memory"]
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*", value, re.IGNORECASE) if isinstance(value, str) else None
    if m is None:
        raise HarborError(f"{where}: [environment] memory={value!r}; expected e.g. '4G' or '512M' (or memory_mb)")
    scale = {"": 1 / 2**20, "K": 1 / 1024, "M": 1, "G": 1024, "T": 1024**2}[m.group(2).upper()]
    mb = int(float(m.group(1)) * scale)
    if mb < 16:
        raise HarborError(f"{where}: [environment] memory={value!r} is below 16 MiB")
    return mb


def _network(data: Mapping[str, Any], env: Mapping[str, Any], where: str) -> tuple[str, tuple[str, ...]]:
    if "network_mode" in env:
        mode = env["network_mode"]
    elif "allow_internet" in env:
        allow = env["allow_internet"]
        if not isinstance(allow, bool):
            raise HarborError(f"{where}: [environment] allow_internet={allow!r} must be true or false")
        mode = "public" if allow else "no-network"
    else:
        mode = "public"
    if mode not in NETWORK_MODES:
        raise HarborError(f"{where}: [environment] network_mode={mode!r}; expected one of {NETWORK_MODES}")
    hosts = env.get("allowed_hosts", [])
    if not isinstance(hosts, list) or not all(isinstance(h, str) for h in hosts):
        raise HarborError(f"{where}: [environment] allowed_hosts={hosts!r} must be a list of host names")
    for phase in ("agent", "verifier"):
        other = _table(data, phase, where).get("network_mode")
        if other is not None and other != mode:
            raise HarborError(f"{where}: [{phase}] network_mode={other!r} differs from the environment's {mode!r}; "
                              "a phase of its own needs a provider that switches networks mid-episode (Harbor's "
                              "Docker environment does not either)")
    return mode, tuple(hosts)


def parse_task_config(text: str, where: str = TASK_FILE) -> TaskConfig:
    """The settings of one ``task.toml``'s text (module docstring); ``where`` names it in errors.

    Raises:
        HarborError: not TOML, a refused setting, or a value of the wrong type (named).
    """
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise HarborError(f"{where} is not valid TOML: {exc}") from None
    agent, verifier = _table(data, "agent", where), _table(data, "verifier", where)
    solution, env = _table(data, "solution", where), _table(data, "environment", where)
    if "environment" in verifier:
        raise HarborError(f"{where}: [verifier.environment] (a separate verifier container) is not supported; "
                          "the verifier runs in the agent's container")
    gpus = env.get("gpus", 0)
    if gpus or "tpu" in env:
        raise HarborError(f"{where}: [environment] asks for accelerators (gpus={gpus!r}, tpu={env.get('tpu')!r}), "
                          "which the Docker sandbox backend does not give")
    if str(env.get("os", "linux")).lower() != "linux":
        raise HarborError(f"{where}: [environment] os={env['os']!r}; only linux tasks run")
    cpus = env.get("cpus")
    if cpus is not None and (isinstance(cpus, bool) or not isinstance(cpus, (int, float)) or not math.isfinite(cpus)
                             or cpus <= 0):
        raise HarborError(f"{where}: [environment] cpus={cpus!r} must be a number of cores > 0")
    image = env.get("docker_image")
    if image is not None and (not isinstance(image, str) or not image.strip()):
        raise HarborError(f"{where}: [environment] docker_image={image!r} must be an image name")
    network, hosts = _network(data, env, where)
    return TaskConfig(
        agent_timeout_s=_seconds(agent, "timeout_sec", f"{where} [agent]"),
        verifier_timeout_s=_seconds(verifier, "timeout_sec", f"{where} [verifier]"),
        build_timeout_s=_seconds(env, "build_timeout_sec", f"{where} [environment]"),
        network=network, allowed_hosts=hosts,
        cpus=float(cpus) if cpus is not None else None, memory_mb=_memory_mb(env, where),
        docker_image=image, verifier_env=_env(verifier, "verifier", where), solution_env=_env(solution, "solution", where),
    )


def container_network(config: TaskConfig, policy: str, task_id: str = "") -> str:
    """The Docker network of a task's container (``SandboxSpec.network``): ``"none"`` for a
    ``no-network`` task, and for every task when ``policy`` (the env's ``network`` kwarg) is
    ``"none"``; ``"bridge"`` for a ``public`` task under ``policy="task"``.

    Raises:
        HarborError: an ``allowlist`` task under ``policy="task"`` (the Docker backend cannot
            limit the hosts; ``network: none`` runs it offline).
    """
    if policy == "none" or config.network == "no-network":
        return "none"
    if config.network == "allowlist":
        raise HarborError(f"task {task_id!r} allows the hosts {list(config.allowed_hosts)} only (network_mode "
                          "'allowlist'), which the Docker sandbox backend cannot enforce; set env.kwargs.network: "
                          "none to run it offline", task_id=task_id)
    return "bridge"


@dataclass(frozen=True)
class HarborTask:
    """One task folder.

    Attributes:
        task_id: the folder's name.
        path: the folder (absolute).
        instruction: ``instruction.md``'s text.
        config: its ``task.toml`` settings.
    """

    task_id: str
    path: Path
    instruction: str
    config: TaskConfig

    @property
    def environment_dir(self) -> Path:
        return self.path / "environment"

    @property
    def tests_dir(self) -> Path:
        return self.path / "tests"

    @property
    def solution_dir(self) -> Path:
        return self.path / "solution"


def load_task(path: str | os.PathLike[str]) -> HarborTask:
    """Read the task folder ``path``.

    Raises:
        HarborError: a missing or unreadable file the task needs (``task.toml``,
            ``instruction.md``, ``tests/test.sh``, ``environment/Dockerfile`` without
            ``docker_image``), a multi-step or multi-container task, or a bad ``task.toml``.
    """
    root = Path(path).resolve()
    task_id = root.name
    try:
        config = parse_task_config((root / TASK_FILE).read_text(encoding="utf-8"), str(root / TASK_FILE))
        instruction = (root / INSTRUCTION_FILE).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise HarborError(f"task {task_id!r} ({root}): {exc}", task_id=task_id) from None
    if (root / "steps").is_dir():
        raise HarborError(f"task {task_id!r} ({root}) is a multi-step task (steps/), which is not supported",
                          task_id=task_id)
    env_dir = root / "environment"
    for name in ("docker-compose.yaml", "docker-compose.yml"):
        if (env_dir / name).exists():
            raise HarborError(f"task {task_id!r}: environment/{name} (several containers) is not supported",
                              task_id=task_id)
    if not (root / "tests" / "test.sh").is_file():
        raise HarborError(f"task {task_id!r} ({root}) has no tests/test.sh", task_id=task_id)
    if config.docker_image is None and not (env_dir / "Dockerfile").is_file():
        raise HarborError(f"task {task_id!r} ({root}) has no environment/Dockerfile and task.toml names no "
                          "[environment] docker_image", task_id=task_id)
    return HarborTask(task_id, root, instruction, config)


@dataclass(frozen=True)
class TaskSet:
    """The tasks under one path: a folder of task folders, or one task folder.

    Attributes:
        root: the path (absolute).
        task_ids: the task folders' names, sorted.
        splits: split -> its task ids (sorted), ``all`` included.
    """

    root: Path
    task_ids: tuple[str, ...]
    splits: Mapping[str, tuple[str, ...]]

    @classmethod
    def from_path(cls, path: Any) -> TaskSet:
        """The task set of ``path`` (a folder holding ``task.toml``: one task; else every
        direct sub-folder holding one; other folders are not tasks).

        Raises:
            ConfigError: ``path`` is not a str or path, does not exist, holds no task, or
                has a bad ``splits.json``.
        """
        if not isinstance(path, (str, os.PathLike)) or not str(path):
            raise ConfigError(f"path={path!r}; expected a folder of Harbor task folders, or one task folder")
        root = Path(path).expanduser().resolve()
        if not root.is_dir():
            raise ConfigError(f"path={str(path)!r} is not a folder")
        if (root / TASK_FILE).is_file():
            return cls(root.parent, (root.name,), {s: (root.name,) for s in DEFAULT_SPLITS})
        ids = tuple(sorted(p.name for p in root.iterdir() if p.is_dir() and (p / TASK_FILE).is_file()))
        if not ids:
            raise ConfigError(f"path={str(path)!r} holds no Harbor task (no sub-folder with a {TASK_FILE})")
        return cls(root, ids, _splits(root, ids))

    def task_dir(self, task_id: Any) -> Path:
        """The folder of ``task_id``. Raises ConfigError when it is not one of ``task_ids``."""
        if task_id not in self.task_ids:
            raise ConfigError(f"task_id={task_id!r} is not a task of {self.root}; e.g. {self.task_ids[0]!r}")
        return self.root / task_id

    def ids(self, split: str) -> list[str]:
        """The task ids of ``split``. Raises ConfigError for a split the set does not have."""
        if split not in self.splits:
            raise ConfigError(f"split={split!r} is not one of {sorted(self.splits)} (tasks of {self.root})")
        return list(self.splits[split])

    def split_of(self, task_id: str) -> str:
        """The first split (other than ``all``) holding ``task_id``, else ``all``."""
        return next((s for s, ids in self.splits.items() if s != "all" and task_id in ids), "all")


def _splits(root: Path, ids: tuple[str, ...]) -> dict[str, tuple[str, ...]]:
    file = root / SPLITS_FILE
    if not file.exists():
        return {s: ids for s in DEFAULT_SPLITS}
    try:
        data = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise ConfigError(f"{file}: {exc}") from None
    if not isinstance(data, dict) or not data:
        raise ConfigError(f"{file} holds {data!r:.80}; expected {{\"<split>\": [\"<task id>\", ...]}}")
    out: dict[str, tuple[str, ...]] = {}
    for split, names in data.items():
        if split == "all":
            raise ConfigError(f"{file}: split 'all' is every task; leave it out")
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise ConfigError(f"{file}: {split!r} is {names!r:.80}; expected a list of task ids")
        unknown = sorted(set(names) - set(ids))
        if unknown:
            raise ConfigError(f"{file}: {split!r} names {unknown}, which are not tasks of {root}")
        out[split] = tuple(sorted(set(names)))
    out["all"] = ids
    return out


def _number(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        return None
    return float(value)


def parse_reward(reward_txt: str | None, reward_json: str | None, task_id: str = "") -> tuple[float, dict[str, float]]:
    """The verifier's reward, as Harbor reads it: ``reward.txt`` (one number) when the
    verifier wrote it, else ``reward.json`` (an object of named numbers; its ``reward`` key,
    or its only key). Pass each file's text, or None when it was not written.

    Returns:
        ``(reward, rewards)``: the episode's reward and every named value
        (``{"reward": r}`` for ``reward.txt``).

    Raises:
        HarborError: neither file, or a file that does not hold what it should (its text,
            clipped, in the message): not a finite number, not a JSON object of finite
            numbers, or several keys and no ``reward``.
    """
    if reward_txt is not None:
        try:
            value = _number(float(reward_txt.strip()))
        except ValueError:
            value = None
        if value is None:
            raise HarborError(f"task {task_id!r}: /logs/verifier/reward.txt holds {reward_txt[:200]!r}; expected "
                              "one finite number", task_id=task_id)
        return value, {REWARD_KEY: value}
    if reward_json is None:
        raise HarborError(f"task {task_id!r}: tests/test.sh wrote neither /logs/verifier/reward.txt nor "
                          "reward.json", task_id=task_id)
    try:
        data = json.loads(reward_json)
    except ValueError:
        data = None
    values = {k: _number(v) for k, v in data.items()} if isinstance(data, dict) else {}
    if not values or None in values.values():
        raise HarborError(f"task {task_id!r}: /logs/verifier/reward.json holds {reward_json[:200]!r}; expected "
                          'a JSON object of finite numbers, e.g. {"reward": 1.0}', task_id=task_id)
    rewards = {k: float(v) for k, v in values.items() if v is not None}
    if REWARD_KEY in rewards:
        return rewards[REWARD_KEY], rewards
    if len(rewards) == 1:
        return next(iter(rewards.values())), rewards
    raise HarborError(f"task {task_id!r}: /logs/verifier/reward.json has keys {sorted(rewards)} and no "
                      f"{REWARD_KEY!r}; which one is the reward?", task_id=task_id)
