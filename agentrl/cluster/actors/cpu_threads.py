"""How many CPU threads each actor of a role runs, and on which cores a rollout engine's
threads run, as environment variables for the actor's ``runtime_env``.

Why: Ray starts every worker with ``OMP_NUM_THREADS`` from ``connect``'s job-wide
``runtime_env`` (the machine's core count); left there, two vLLM CPU engines on one node each
run as many OpenMP threads as the node has cores, their spinning threads fight over the same
cores and each engine runs at a fraction of one engine alone
(``tests/benchmarks/bench_rollout.py`` measures it). vLLM's CPU worker turns ``torch.set_num_threads``
into a no-op, and OpenMP reads ``OMP_NUM_THREADS`` / ``OMP_PLACES`` / ``OMP_PROC_BIND`` once,
when ``libgomp`` is loaded (``import torch``), so the only place to set them is the
environment the worker process starts with: the actor's ``runtime_env``. Ray merges an
actor's ``env_vars`` over the job's, the actor's value winning
(``tests/unit/cluster/test_cpu_threads.py`` checks that on a real Ray instance).

Threads per actor (``role_threads``):

- a joined cluster (``cluster.address`` set): ``max(1, floor(num_cpus))`` of the role's
  ``cluster.placement.<role>.num_cpus``, Ray's own rule (a node's logical CPUs are its cores
  unless ``ray start --num-cpus`` says otherwise);
- the local instance (``cluster.address`` unset): its logical CPUs are twice the cores on
  purpose (``placement.local_num_cpus``) because the roles take turns in the synchronous
  loop (rollout, then the update), so a role's actors share the machine's cores between
  them in proportion to their ``num_cpus``: ``max(1, cores // count)`` for ``count`` actors
  of equal ``num_cpus`` (one engine or one rank: every core, as before; two engines on two
  cores: one thread each).
- the local instance in async mode (``controller.mode: async``): rollout and update run at the
  same time, so instead of every role taking every core, the cores are split between the
  actors in proportion to their ``num_cpus`` (``cluster.placement.<role>.num_cpus``): an
  actor of ``role`` runs ``max(1, floor(cores * num_cpus[role] / total))`` threads, ``total`` =
  ``rollout.num_engines * rollout.num_cpus + trainer.num_ranks * trainer.num_cpus`` (equal
  shares when every ``num_cpus`` is 0). Default placement (1 CPU each), one engine and one
  rank on 2 cores: one thread each (before, two each on two cores: four spinning OpenMP
  threads on two cores while both roles compute). With fewer cores than actors every actor
  gets one thread (some oversubscription is then unavoidable).
- sandbox hosts: 1 (they wait on processes; they compute nothing).
- the dedicated eval engine of async mode (``agentrl.driver.dedicated_eval``, role ``eval``,
  ``cluster.placement.eval``): on the local instance ``max(1, floor(cores * num_cpus[eval] /
  (total + num_cpus[eval])))``, its share counted beside the engines' and ranks'; theirs stay
  as above without it, since the eval engine computes only while an eval runs (every
  ``eval.every`` updates) and sleeps otherwise, so during an eval the machine is
  oversubscribed by its threads (on 2 cores with the default placement: one thread each for
  the engine, the rank and the eval engine). On a joined cluster: its ``num_cpus``, like the
  others.
- an engine of the local judge pool (``agentrl.cluster.actors.judge_pool``, role ``judge``,
  ``cluster.placement.judge``): like the eval engine, its share counted beside the engines' and
  ranks' in async mode (``reward.judge.num_engines`` of them), ``max(1, cores // num_engines)``
  otherwise; on a joined cluster its ``num_cpus``.

Cores per engine (``engine_cores``): on the local instance with two or more engines, engine
``i`` gets its own ``threads`` consecutive cores of the driver's CPU affinity (wrapping
around when engines outnumber cores), bound with ``OMP_PLACES`` / ``OMP_PROC_BIND=true``
(the variables vLLM's own multiprocess executor sets for its CPU workers,
``vllm/utils/ompmultiprocessing.py``) and ``VLLM_CPU_OMP_THREADS_BIND`` (the same list, read
only by that multiprocess executor: vLLM 0.32's in-process engine, which agentrl runs,
binds nothing itself and ignores it). A single engine is not bound (the OS may move its
threads off a core another program is busy on). On a joined cluster the driver cannot know
which engines share a node, so engines get their thread count only.
"""

from __future__ import annotations

import math
import os
from typing import Any

SANDBOX_THREADS = 1
"""OpenMP threads of a sandbox host (it runs no tensor code)."""


def local_cores() -> list[int]:
    """The CPU ids this process may run on (its affinity), sorted; ``range(cpu_count)``
    where affinity is not available."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def _count(cfg: Any, role: str) -> int:
    if role == "trainer":
        return max(1, int(cfg.trainer.num_ranks))
    if role == "rollout":
        return max(1, int(getattr(cfg.rollout, "num_engines", 1)))
    if role == "eval":
        return 1
    if role == "judge":
        judge = getattr(getattr(cfg, "reward", None), "judge", None)
        return max(1, int(judge.num_engines)) if judge is not None else 1
    return max(1, int(getattr(cfg.cluster, "sandbox_hosts", 0) or 1))


def role_threads(cfg: Any, role: str, cores: int | None = None) -> int:
    """OpenMP threads for one actor of ``role`` (see the module docstring).

    Args:
        cfg: the run's ``Config`` (``cluster.address``, ``cluster.placement``,
            ``trainer.num_ranks``, ``rollout.num_engines``).
        role: ``"trainer"``, ``"rollout"``, ``"sandbox"``, ``"eval"`` or ``"judge"``.
        cores: the local machine's usable cores (None: ``len(local_cores())``); used for the
            local instance only.

    Returns:
        A thread count ``>= 1``.
    """
    if role == "sandbox":
        return SANDBOX_THREADS
    num_cpus = float(getattr(cfg.cluster.placement, role).num_cpus)
    if cfg.cluster.address is not None:
        return max(1, math.floor(num_cpus + 1e-6))
    n = len(local_cores()) if cores is None else int(cores)
    if _async_split(cfg):
        if role in ("eval", "judge"):
            return max(1, math.floor(n * _side_share(cfg, role) + 1e-6))
        return max(1, math.floor(n * _share(cfg, role) + 1e-6))
    return max(1, n // _count(cfg, role))


def _async_split(cfg: Any) -> bool:
    """Whether the local instance splits the cores between the roles (async mode)."""
    controller = getattr(cfg, "controller", None)
    return cfg.cluster.address is None and getattr(controller, "mode", "sync") == "async"


def _share(cfg: Any, role: str) -> float:
    """The fraction of the local cores one actor of ``role`` (``"rollout"`` or ``"trainer"``)
    gets in async mode: its ``num_cpus`` over every engine's and rank's (module docstring)."""
    weights = {r: float(getattr(cfg.cluster.placement, r).num_cpus) for r in ("rollout", "trainer")}
    if weights["rollout"] <= 0 and weights["trainer"] <= 0:
        weights = {"rollout": 1.0, "trainer": 1.0}
    total = sum(weights[r] * _count(cfg, r) for r in weights)
    return weights[role] / total if total > 0 else 0.0


def _side_share(cfg: Any, role: str) -> float:
    """The fraction of the local cores one eval engine or judge pool engine (``role``) gets in
    async mode (module docstring)."""
    weights = {r: float(getattr(cfg.cluster.placement, r).num_cpus) for r in ("rollout", "trainer", role)}
    if all(w <= 0 for w in weights.values()):
        weights = {r: 1.0 for r in weights}
    total = sum(weights[r] * _count(cfg, r) for r in weights)
    return weights[role] / total if total > 0 else 0.0


def engine_cores(cfg: Any, engine_index: int, cores: list[int] | None = None) -> list[int] | None:
    """The cores rollout engine ``engine_index`` is bound to, or None when it is not bound
    (one engine, or a joined cluster).

    Args:
        cfg: the run's ``Config``.
        engine_index: ``0 .. rollout.num_engines - 1`` (a replacement engine takes the index
            of the one it replaces, and so its cores).
        cores: the machine's usable CPU ids (None: ``local_cores()``).

    Returns:
        ``role_threads(cfg, "rollout")`` CPU ids, disjoint between engines as long as the
        engines' threads add up to at most the cores.
    """
    if cfg.cluster.address is not None or _count(cfg, "rollout") < 2:
        return None
    ids = local_cores() if cores is None else sorted(cores)
    threads = role_threads(cfg, "rollout", cores=len(ids))
    start = (engine_index * threads) % len(ids)
    return [ids[(start + k) % len(ids)] for k in range(min(threads, len(ids)))]


def _id_list(ids: list[int]) -> str:
    """``[0, 1, 2, 5]`` -> ``"0-2,5"`` (the form ``VLLM_CPU_OMP_THREADS_BIND`` parses)."""
    parts: list[str] = []
    run_start = prev = ids[0]
    for c in ids[1:] + [None]:  # type: ignore[list-item]
        if c is not None and c == prev + 1:
            prev = c
            continue
        parts.append(str(run_start) if run_start == prev else f"{run_start}-{prev}")
        if c is not None:
            run_start = prev = c
    return ",".join(parts)


def actor_env_vars(cfg: Any, role: str, index: int | None = None, cores: list[int] | None = None) -> dict[str, str]:
    """The ``runtime_env["env_vars"]`` of one actor of ``role``.

    Args:
        cfg: the run's ``Config``.
        role: ``"trainer"``, ``"rollout"`` or ``"sandbox"``.
        index: the engine index for ``rollout`` (None: no core binding).
        cores: the machine's usable CPU ids (None: ``local_cores()``).

    Returns:
        ``{"OMP_NUM_THREADS": "<n>"}``, plus for a bound engine ``OMP_PLACES`` (one place of
        its cores, ``"{0,1}"``), ``OMP_PROC_BIND="true"`` and ``VLLM_CPU_OMP_THREADS_BIND``
        (``"0-1"``).
    """
    ids = local_cores() if cores is None else sorted(cores)
    env = {"OMP_NUM_THREADS": str(role_threads(cfg, role, cores=len(ids)))}
    if role == "rollout" and index is not None:
        bound = engine_cores(cfg, index, cores=ids)
        if bound:
            env["OMP_NUM_THREADS"] = str(len(bound))
            env["OMP_PLACES"] = "{" + ",".join(str(c) for c in bound) + "}"
            env["OMP_PROC_BIND"] = "true"
            env["VLLM_CPU_OMP_THREADS_BIND"] = _id_list(bound)
    return env


__all__ = ["SANDBOX_THREADS", "actor_env_vars", "engine_cores", "local_cores", "role_threads"]
