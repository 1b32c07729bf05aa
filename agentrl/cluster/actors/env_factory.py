"""The environments a rollout actor makes: ``EnvFactory`` (one fresh environment per episode,
with its own sandbox where the environment class uses one) and the env registry questions
the driver and the commands ask (``env_task_ids``: the task ids of a split).

Environments are reached only through the gymnasium registry (``environments`` registers
the built-ins, entry points and ``env.import_modules``); sandboxes through ``sandboxes``'
``choose_sandboxes`` / ``make_sandbox``, or on the run's sandbox hosts
(``agentrl.cluster.actors.remote_sandbox``).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import logging
from typing import Any, Mapping, Sequence

import gymnasium
from gymnasium.envs.registration import load_env_creator

import environments
import sandboxes
from agentrl.cluster.actors.remote_sandbox import HostBalancer, SandboxHostRef, make_remote_sandbox
from agentrl.cluster.actors.sandbox_host import sandbox_spec
from agentrl.config import Config
from agentrl.errors import ConfigError
from agentrl.types import EpisodeRequest
from environments.checker import task_ids_of
from sandboxes.pool import SandboxPool

log = logging.getLogger(__name__)


def close_env_ids(env_id: str) -> str:
    """``"; did you mean 'agentrl/HumanEval-v0'?"`` for an unregistered ``env_id`` (registered
    ids close to it by difflib, as Gymnasium suggests names), or ``""`` when none is close."""
    close = difflib.get_close_matches(env_id, list(gymnasium.registry), n=3, cutoff=0.75)
    return "; did you mean " + " or ".join(repr(c) for c in close) + "?" if close else ""


def env_task_ids(env_id: str, split: str, import_modules: Sequence[str] = (),
                 env_kwargs: Mapping[str, Any] | None = None) -> list[str]:
    """Task ids of a registered environment's split (its class's ``task_ids(split)``), after
    importing ``import_modules`` (the modules that register user environments). An env whose
    tasks depend on its kwargs (``hub/ReasoningGym-v0``: families, size) gets ``env_kwargs``
    (``env.kwargs``) where its ``task_ids`` accepts them (``environments.checker.task_ids_of``).

    Raises:
        ConfigError: ``env_id`` is not registered, its class lists no tasks, ``split`` is
            not one of its splits, or its ``task_ids`` refused ``env_kwargs``.
    """
    environments.import_env_modules(list(import_modules))
    try:
        spec = gymnasium.spec(env_id)
    except Exception as exc:
        raise ConfigError(f"env.id={env_id!r} is not a registered environment ({exc}){close_env_ids(env_id)}") from None
    creator = load_env_creator(spec.entry_point) if isinstance(spec.entry_point, str) else spec.entry_point
    fn = getattr(creator, "task_ids", None)
    if fn is None:
        raise ConfigError(f"environment {env_id!r} does not list its tasks (no task_ids(split) on {creator!r})")
    try:
        ids = list(task_ids_of(fn, split, env_kwargs))
    except (KeyError, ValueError) as exc:
        raise ConfigError(f"{env_id!r} cannot list the tasks of env.split={split!r}: {exc}") from None
    return ids


def env_sandbox_mounts(env_cls: Any) -> tuple[tuple[str, str], ...]:
    """The read-only mounts an environment class asks of its sandboxes
    (``sandbox_mounts()``, e.g. an agent command's gateway socket; ``SandboxSpec.ro_mounts``),
    ``()`` when it asks none."""
    fn = getattr(env_cls, "sandbox_mounts", None)
    return tuple((str(h), str(i)) for h, i in fn()) if callable(fn) else ()


class EnvFactory:
    """What the rollout worker calls per episode: ``factory(request) -> (env, sandbox)``, a
    fresh environment with its own sandbox (the worker closes both), or with none
    (``sandbox`` None) when the environment class says ``uses_sandbox = False`` (Sokoban and
    GuessNumber run in-process; TextWorld in a child process of its own).

    ``sandbox.backend`` is resolved once, here (``sandboxes.choose_sandboxes`` with
    ``sandbox.docker_host``), logged as ``sandboxes: ...`` (the driver announced its own
    choice on the console: ``agentrl.cluster.actors.sandbox_choice``), and used for every
    sandbox of the run, on the daemon chosen (``sandbox.docker_host``, ``DOCKER_HOST`` or the
    one agentrl's scripts started). With ``sandbox.pool_size > 0`` a ``SandboxPool`` keeps
    warm sandboxes (``pool``).

    With ``sandbox_hosts`` (the ``SandboxHostRef`` list of ``start_sandbox_hosts``, when
    ``cluster.sandbox_hosts > 0``) every sandbox is a ``RemoteSandbox`` on one of them: the
    backend was resolved on each host's node (``backend``: their backends, comma-joined when
    they differ), no pool is kept here (the hosts keep it), and a ``HostBalancer`` starting
    at ``engine_index`` picks the host (``balancer``).

    Attributes:
        env_kwargs: the kwargs every environment is made with (``env.kwargs``; another
            factory over the same sandboxes with other kwargs: ``with_env_kwargs``).
        backend: the sandbox backend (``"bwrap"``, ``"docker"``, the hosts' joined), or None
            for an environment without sandboxes.
        pool: the local ``SandboxPool``, or None.
        balancer: the ``HostBalancer`` over ``sandbox_hosts``, or None.

    Raises:
        ConfigError: the env id is not registered in this process, or an unknown backend.
    """

    def __init__(self, cfg: Config, run_id: str, sandbox_hosts: Sequence[SandboxHostRef] | None = None, *,
                 engine_index: int = 0) -> None:
        environments.import_env_modules(cfg.env.import_modules)
        try:
            env_spec = gymnasium.spec(cfg.env.id)
        except Exception as exc:
            raise ConfigError(f"env.id={cfg.env.id!r} is not registered in the rollout process ({exc})"
                              f"{close_env_ids(cfg.env.id)}; list the module that registers it in env.import_modules"
                              ) from None
        entry = env_spec.entry_point
        env_cls = load_env_creator(entry) if isinstance(entry, str) else entry
        self.uses_sandbox = bool(getattr(env_cls, "uses_sandbox", True))
        self.spec = sandbox_spec(cfg, run_id)  # the same spec a sandbox host's pool holds
        mounts = env_sandbox_mounts(env_cls)
        if mounts and self.uses_sandbox:
            if sandbox_hosts:
                raise ConfigError(f"env.id={cfg.env.id!r} binds {[m[0] for m in mounts]} of the rollout's machine "
                                  "into its sandboxes (an agent command reaching the gateway), which sandbox hosts "
                                  "cannot; set cluster.sandbox_hosts: 0")
            self.spec = dataclasses.replace(self.spec, ro_mounts=self.spec.ro_mounts + mounts)
        self.docker_host = cfg.sandbox.docker_host
        self.hosts = list(sandbox_hosts or ())
        self.backend: str | None = None
        self.balancer: HostBalancer | None = None
        self.pool: SandboxPool | None = None
        self.env_kwargs: dict[str, Any] = dict(cfg.env.kwargs)
        if self.uses_sandbox and self.hosts:
            self.balancer = HostBalancer(len(self.hosts), start=engine_index)
            self.backend = ",".join(dict.fromkeys(h.backend for h in self.hosts))
        elif self.uses_sandbox:
            choice = sandboxes.choose_sandboxes(cfg.sandbox.backend, self.spec.image, cfg.sandbox.docker_host)
            self.backend, self.docker_host = choice.backend, choice.docker_host
            log.info("sandboxes: %s", choice.why)
        if self.uses_sandbox and not self.hosts and cfg.sandbox.pool_size > 0:
            cap = cfg.sandbox.max_sandboxes or max(cfg.sandbox.pool_size, cfg.rollout.max_num_seqs)
            self.pool = SandboxPool(self._new_sandbox, size=cfg.sandbox.pool_size, max_sandboxes=cap,
                                    between_episodes=cfg.sandbox.between_episodes)
            self.pool.wait_ready(timeout_s=300.0)  # warm before the first episode asks

    def with_env_kwargs(self, env_kwargs: Mapping[str, Any]) -> EnvFactory:
        """A factory over the same sandboxes (backend, pool, hosts and balancer shared) that
        makes environments with ``env_kwargs`` (e.g. the eval judge's, ``agentrl.driver.judge``);
        this one is left as it is."""
        other = copy.copy(self)
        other.env_kwargs = dict(env_kwargs)
        return other

    def _new_sandbox(self) -> Any:
        return sandboxes.make_sandbox(self.backend, self.spec, docker_host=self.docker_host)

    def __call__(self, req: EpisodeRequest) -> tuple[Any, Any]:
        """``(env, sandbox)`` for ``req``: ``gymnasium.make(req.env_id, sandbox=..., **env_kwargs)``
        (no ``sandbox`` argument and ``None`` for an environment without one). A sandbox whose
        environment could not be made is closed before the error propagates."""
        if not self.uses_sandbox:
            return gymnasium.make(req.env_id, disable_env_checker=True, **self.env_kwargs), None
        if self.balancer is not None:
            sandbox = make_remote_sandbox(self.hosts, self.balancer, self.spec)
        elif self.pool is not None:
            sandbox = sandboxes.PooledSandbox(self.pool, self.pool.acquire())
        else:
            sandbox = self._new_sandbox()
        try:
            env = gymnasium.make(req.env_id, sandbox=sandbox, disable_env_checker=True, **self.env_kwargs)
        except BaseException:
            sandbox.close()
            raise
        return env, sandbox
