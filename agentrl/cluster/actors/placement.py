"""Where a run's roles go: ``role_options(cfg, role)``, the ``.options(...)`` of one actor of a
role (``trainer`` rank, ``rollout`` engine, ``sandbox`` host, ``eval`` engine, ``judge`` engine) from
``cluster.placement``; and ``check_placement(cfg)``, at start-up: every role's actors must fit
the alive nodes, else a ``ConfigError`` naming the value and each node's resources (never a run
that waits forever for an actor Ray cannot place). Whether they fit together is an exact
packing search over the nodes (``_pack``), bounded in steps.
"""

from __future__ import annotations

import logging
import math
import os
from typing import Any, Sequence

from agentrl.cluster.actors.cpu_threads import actor_env_vars
from agentrl.errors import ConfigError

log = logging.getLogger(__name__)

ROLES = ("trainer", "rollout", "sandbox", "eval", "judge")
"""The placement roles, the keys of ``cluster.placement`` (``eval``: the dedicated eval engine
of asynchronous training, ``agentrl.driver.dedicated_eval``; ``judge``: an engine of the local
judge pool, ``agentrl.cluster.actors.judge_pool``)."""

_EPS = 1e-6  # Ray keeps resource amounts to 1e-4; never call 0.99999 CPU "less than 1"
_MAX_SEARCH_STEPS = 200_000  # exact packing search budget (a few hundred ms at most)
_MAX_SEARCH_DEPTH = 400  # actors; more than that and a packing first-fit misses is left to Ray


def local_num_cpus(cfg: Any) -> int:
    """Logical CPUs of a local instance: ``cluster.num_cpus``, else ``max(4, 2 x cores)`` so a
    trainer rank and an engine (1 CPU each) fit beside each other on a 2-core machine."""
    return cfg.cluster.num_cpus or max(4, 2 * (os.cpu_count() or 1))



def _placement(cfg: Any, role: str) -> Any:
    if role not in ROLES:
        raise ConfigError(f"role={role!r}: expected one of {', '.join(ROLES)}")
    return getattr(cfg.cluster.placement, role)


def role_options(cfg: Any, role: str, index: int | None = None) -> dict[str, Any]:
    """The ``ActorClass.options(**...)`` kwargs of one actor of ``role``.

    Args:
        cfg: the run's ``Config``.
        role: ``"trainer"`` (one rank), ``"rollout"`` (one engine), ``"sandbox"`` (one host),
            ``"eval"`` (the dedicated eval engine) or ``"judge"`` (one judge pool engine).
        index: the engine index of a ``rollout`` actor (its cores when engines share the
            local machine, ``agentrl.cluster.actors.cpu_threads.engine_cores``); None: not bound.

    Returns:
        ``{"num_cpus": float, "num_gpus": float, "runtime_env": {"env_vars": {...}}}`` plus
        ``"resources": {name: amount}`` when ``cluster.placement.<role>.resources`` is not
        empty. ``env_vars``: the actor's OpenMP threads (``OMP_NUM_THREADS``, and for a bound
        engine ``OMP_PLACES`` / ``OMP_PROC_BIND`` / ``VLLM_CPU_OMP_THREADS_BIND``), from
        ``agentrl.cluster.actors.cpu_threads.actor_env_vars``; Ray merges them over ``connect``'s.

    Raises:
        ConfigError: ``role`` is not one of ``ROLES``.
    """
    p = _placement(cfg, role)
    opts: dict[str, Any] = {"num_cpus": float(p.num_cpus), "num_gpus": float(p.num_gpus)}
    if p.resources:
        opts["resources"] = {k: float(v) for k, v in p.resources.items()}
    opts["runtime_env"] = {"env_vars": actor_env_vars(cfg, role, index)}
    return opts


def _demand(cfg: Any, role: str) -> dict[str, float]:
    """Ray resources one actor of ``role`` reserves (``CPU``, ``GPU``, custom), zeros dropped."""
    p = _placement(cfg, role)
    d = {"CPU": float(p.num_cpus), "GPU": float(p.num_gpus), **{k: float(v) for k, v in p.resources.items()}}
    return {k: v for k, v in d.items() if v > 0}


def _role_counts(cfg: Any) -> dict[str, tuple[str, int]]:
    """``role -> (config key, number of actors)``."""
    return {
        "trainer": ("trainer.num_ranks", int(cfg.trainer.num_ranks)),
        "rollout": ("rollout.num_engines", int(getattr(cfg.rollout, "num_engines", 1))),
        "sandbox": ("cluster.sandbox_hosts", int(getattr(cfg.cluster, "sandbox_hosts", 0))),
        "eval": ("eval engines", dedicated_eval_engines(cfg)),
        "judge": ("reward.judge.num_engines + eval.judge.num_engines", judge_pool_engines(cfg)),
    }


def judge_pool_engines(cfg: Any) -> int:
    """The judge engines the run places (role ``judge``): ``reward.judge.num_engines`` when the
    training reward's judge is a local pool (``kind: pool``), plus ``eval.judge.num_engines``
    when the eval judge is one; 0 without a pool."""
    total = 0
    for section in ("reward", "eval"):
        judge = getattr(getattr(cfg, section, None), "judge", None)
        if judge is not None and getattr(judge, "kind", None) == "pool":
            total += int(judge.num_engines)
    return total


def dedicated_eval_engines(cfg: Any) -> int:
    """1 when the run evaluates on a dedicated eval engine (``controller.mode: async`` with
    evaluation during training, ``agentrl.driver.dedicated_eval``), else 0."""
    ev = getattr(cfg, "eval", None)
    if ev is None or getattr(getattr(cfg, "controller", None), "mode", "sync") != "async":
        return 0
    during = ev.every > 0 or bool(getattr(ev, "after_training", False)) or bool(getattr(ev, "before_training", False))
    return 1 if during else 0


def _fits(free: dict[str, float], demand: dict[str, float]) -> bool:
    return all(free.get(k, 0.0) + _EPS >= v for k, v in demand.items())


def _per_node_capacity(total: dict[str, float], demand: dict[str, float]) -> float:
    """How many actors of ``demand`` one node of ``total`` holds (inf when it asks for nothing)."""
    if not demand:
        return math.inf
    return min(math.floor((total.get(k, 0.0) + _EPS) / v) for k, v in demand.items())


def _num(x: float) -> str:
    return f"{x:g}"


def _node_label(node: dict[str, Any]) -> str:
    ip = node.get("NodeManagerAddress") or "?"
    nid = str(node.get("NodeID") or "")[:8]
    head = ", head" if "node:__internal_head__" in node.get("Resources", {}) else ""
    return f"{ip} ({nid}{head})" if nid else f"{ip}{head}"


def _shown_resources(res: dict[str, float]) -> str:
    """``CPU 4, GPU 1, rollout 2``: what placement can ask for (no memory / node:ip keys)."""
    keys = [k for k in ("CPU", "GPU") if res.get(k)] + sorted(
        k for k in res
        if k not in ("CPU", "GPU", "memory", "object_store_memory")
        and not k.startswith("node:") and not k.startswith("accelerator_type:")
    )
    return ", ".join(f"{k} {_num(res[k])}" for k in keys) or "nothing placeable"


def resources_text(res: dict[str, float]) -> str:
    """``CPU 4, GPU 1, rollout 2``: the resources of ``res`` (``ray.cluster_resources()``-
    shaped) that placement can ask for, without memory and ``node:<ip>`` keys."""
    return _shown_resources(res)


def _cluster_text(nodes: Sequence[dict[str, Any]]) -> str:
    if not nodes:
        return "the cluster has no alive node"
    return "the cluster has: " + "; ".join(
        f"node {_node_label(n)}: {_shown_resources(n.get('Resources', {}))}" for n in nodes)


def _role_text(cfg: Any, role: str) -> str:
    p = _placement(cfg, role)
    parts = [f"num_cpus={_num(p.num_cpus)}"]
    if p.num_gpus:
        parts.append(f"num_gpus={_num(p.num_gpus)}")
    if p.resources:
        parts.append(f"resources={dict(p.resources)!r}")
    return f"cluster.placement.{role} ({', '.join(parts)})"


def _local_hint(cfg: Any) -> str:
    """For the local instance (``cluster.address`` unset), where its CPUs come from."""
    if cfg.cluster.address is not None:
        return ""
    why = f"cluster.num_cpus={cfg.cluster.num_cpus}" if cfg.cluster.num_cpus else "cluster.num_cpus unset: max(4, 2 x cores)"
    return (f"; cluster.address is unset, so this is a local Ray instance with {local_num_cpus(cfg)} CPUs ({why}): "
            "raise cluster.num_cpus or ask for fewer actors")


def _pack(items: list[tuple[str, dict[str, float]]], totals: list[dict[str, float]]) -> bool | None:
    """Can every ``(role, demand)`` go on a node at once? True / False, or None when the search
    ran out of steps (undecided). First-fit decreasing, and when that misses an exact
    depth-first search, largest demands first; actors of one role are interchangeable, so each
    goes on a node no earlier than the one before it."""
    order = sorted(items, key=lambda it: (-sum(it[1].values()), it[0]))
    free = [dict(t) for t in totals]
    for _, demand in order:  # first-fit decreasing: settles the usual case at once
        n = next((n for n, f in enumerate(free) if _fits(f, demand)), None)
        if n is None:
            break
        for k, v in demand.items():
            free[n][k] = free[n].get(k, 0.0) - v
    else:
        return True
    if len(order) > _MAX_SEARCH_DEPTH:
        return None
    asked = sorted({k for _, demand in order for k in demand})  # what tells nodes apart here
    free = [dict(t) for t in totals]
    steps = 0

    def place(i: int, first_node: int) -> bool | None:
        nonlocal steps
        if i == len(order):
            return True
        role, demand = order[i]
        start = first_node if i > 0 and order[i - 1][0] == role else 0
        tried: set[tuple] = set()  # nodes with the same free resources are interchangeable
        for n in range(start, len(free)):
            steps += 1
            if steps > _MAX_SEARCH_STEPS:
                return None
            if not _fits(free[n], demand):
                continue
            state = tuple(round(free[n].get(k, 0.0), 4) for k in asked)
            if state in tried:
                continue
            tried.add(state)
            for k, v in demand.items():
                free[n][k] = free[n].get(k, 0.0) - v
            got = place(i + 1, n)
            for k, v in demand.items():
                free[n][k] += v
            if got:
                return True
            if got is None:
                return None
        return False

    return place(0, 0)


def check_placement(cfg: Any, nodes: Sequence[dict[str, Any]] | None = None) -> None:
    """Check at start-up that the run's actors fit the cluster, so a bad placement is an error
    now instead of an actor Ray keeps pending forever.

    Each role's actors (``trainer.num_ranks`` ranks, ``rollout.num_engines`` engines,
    ``cluster.sandbox_hosts`` hosts, the eval engine, ``reward.judge.num_engines`` judge pool
    engines), each reserving ``cluster.placement.<role>``: one actor of
    every role must fit on some alive node, each role's count must fit the cluster on its own,
    and all of them must fit together (an exact search over the nodes; when it cannot decide
    within its budget it logs a warning and lets Ray try).

    Args:
        cfg: the run's ``Config``.
        nodes: ``ray.nodes()``-shaped dicts (``Alive``, ``NodeID``, ``NodeManagerAddress``,
            ``Resources``); None: ``ray.nodes()`` of the connected cluster. Dead nodes are skipped.

    Raises:
        ConfigError: naming the value (``rollout.num_engines=3``,
            ``cluster.placement.rollout (num_cpus=1, resources={'rollout': 1.0})``) and every
            alive node's resources.
    """
    if nodes is None:
        import ray  # heavy: ray

        nodes = ray.nodes()
    alive = [n for n in nodes if n.get("Alive", n.get("alive", False))]
    totals = [{k: float(v) for k, v in n.get("Resources", {}).items()} for n in alive]
    counts = _role_counts(cfg)
    items: list[tuple[str, dict[str, float]]] = []
    for role in ROLES:
        key, count = counts[role]
        if count <= 0:
            continue
        demand = _demand(cfg, role)
        if not any(_fits(t, demand) for t in totals):
            missing = sorted({k for k in demand if not any(t.get(k, 0.0) > 0 for t in totals)})
            why = (f"no node has {', '.join(repr(k) for k in missing)} at all" if missing
                   else "no single node has all of it")
            raise ConfigError(
                f"{_role_text(cfg, role)} is what one actor of {key}={count} needs, and no node of the cluster "
                f"can hold it ({why}); {_cluster_text(alive)}"
            )
        capacity = sum(_per_node_capacity(t, demand) for t in totals)
        if count > capacity:
            raise ConfigError(
                f"{key}={count} with {_role_text(cfg, role)} each: the cluster holds at most {capacity:g} of them; "
                f"{_cluster_text(alive)}{_local_hint(cfg)}"
            )
        if demand:  # an actor that reserves nothing fits anywhere
            items.extend((role, demand) for _ in range(count))
    if not items:
        return
    fit = _pack(items, totals)
    wanted = ", ".join(f"{counts[r][0]}={counts[r][1]}" for r in ROLES if counts[r][1] > 0)
    if fit is False:
        need: dict[str, float] = {}
        for _, demand in items:
            for k, v in demand.items():
                need[k] = need.get(k, 0.0) + v
        roles = "; ".join(_role_text(cfg, r) for r in ROLES if counts[r][1] > 0)
        raise ConfigError(
            f"{wanted} do not fit the cluster together ({roles}; in all "
            f"{', '.join(f'{k} {_num(v)}' for k, v in sorted(need.items()))}); {_cluster_text(alive)}"
            f"{_local_hint(cfg)}"
        )
    if fit is None:
        log.warning("could not decide within %d steps whether %s fit the cluster together; letting Ray place "
                    "them (%s)", _MAX_SEARCH_STEPS, wanted, _cluster_text(alive))
