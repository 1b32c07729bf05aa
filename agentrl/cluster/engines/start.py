"""Waiting for rollout engines to start, within bounds (``EnginePool.ready``).

An engine's actor whose resources the cluster has in total, but other actors or jobs hold,
stays pending with Ray for ever; ``ray.get`` on its ``ready()`` would never return. So the
wait has two bounds, as the trainer ranks' start has (``agentrl.cluster.actors.trainer_group``):

- placed: Ray must give the actor a worker on some node within ``place_timeout_s``
  (``cluster.rendezvous_timeout_s``). Placement is read from Ray's actor table
  (``actor_node_id``); where that table cannot be read, the bound is ``place_timeout_s +
  start_timeout_s`` from the start.
- started: once placed, its engine (vLLM loading the model) must answer within
  ``start_timeout_s`` (``ENGINE_START_S``).

Either miss is a ``ClusterError`` naming the engine, what it asks for, and what the cluster
has in all and free.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import ray
from ray.exceptions import RayActorError

from agentrl.cluster.actors.actor_errors import actor_failure_message
from agentrl.cluster.actors.placement import resources_text
from agentrl.errors import ClusterError

ENGINE_START_S = 600.0
"""Seconds a placed engine has to start its vLLM engine."""

POLL_S = 0.5
"""How often the engines still pending are looked at."""


def actor_node_id(actor: Any) -> str | None:
    """The node id (hex) Ray placed ``actor`` on (its constructor may still be running),
    ``""`` while it waits for resources, None when Ray's actor table cannot say.

    Reads the GCS actor table (``ray._private.state.actors``, a developer API; needs no
    dashboard): an actor waiting for resources is ``PENDING_CREATION`` with no worker (port
    0, pid 0); once placed it has both, while its constructor runs and after.
    """
    try:
        from ray._private.state import actors as actor_table  # heavy: ray

        info = actor_table(actor._actor_id.hex())
    except Exception:  # a Ray whose actor table moved or answers nothing: no placement signal
        return None
    if not info:
        return None
    address = info.get("Address") or {}
    # While it waits, Ray already names the node whose raylet queues the request (measured,
    # Ray 2.60): only a worker (its port and pid) says the actor is placed.
    if not (address.get("Port") or info.get("Pid")):
        return ""
    return str(address.get("NodeID") or "") or None


@dataclass
class Started:
    """One engine that answered ``ready()``."""

    index: int
    start_s: float
    node: dict


def wait_ready(engines: Sequence[tuple[int, Any]], asked: Mapping[str, float], *, place_timeout_s: float,
               start_timeout_s: float = ENGINE_START_S, what: str = "cluster.placement.rollout",
               place_key: str = "cluster.rendezvous_timeout_s") -> list[Started]:
    """Wait for every ``(engine_index, RolloutActor handle)`` to answer ``ready()`` and
    ``node()``, within the bounds of the module docstring.

    Args:
        engines: the engines to wait for.
        asked: the Ray resources one engine reserves (``{"CPU": 1.0, "rollout": 1.0}``),
            for the message.
        place_timeout_s: seconds each engine has to be placed on a node.
        start_timeout_s: seconds each placed engine has to start.
        what: the config key of the placement (for the message).
        place_key: the config key ``place_timeout_s`` comes from (for the message).

    Returns:
        One ``Started`` per engine, in the order given.

    Raises:
        ClusterError: an engine was not placed, or did not start, in time, or its actor
            died while starting, or its constructor raised (the error it raised, e.g.
            ``ConfigError: env.import_modules: module 'calc_env' could not be imported ...``,
            on the one line; the ``RayActorError`` is its ``__cause__``).
    """
    t0 = time.monotonic()
    refs = {e.ready.remote(): (i, e) for i, e in engines}
    placed_at: dict[int, float] = {}
    out: dict[int, Started] = {}
    while len(out) < len(engines):
        pending = [r for r, (i, _) in refs.items() if i not in out]
        done, _ = ray.wait(pending, num_returns=len(pending), timeout=POLL_S)
        for ref in done:
            i, actor = refs[ref]
            try:
                start_s = float(ray.get(ref))
                node = dict(ray.get(actor.node.remote()))
            except RayActorError as exc:
                # Its constructor raised (a ConfigError, an env module the node cannot import) or
                # Ray killed it: one line with the error it raised, or where it died and why.
                raise ClusterError(f"rollout engine {i} did not start: "
                                   f"{actor_failure_message(exc, f'rollout engine {i}')}") from exc
            out[i] = Started(i, start_s, node)
        now = time.monotonic()
        for ref in pending:
            i, actor = refs[ref]
            if i in out:
                continue
            if i in placed_at:
                if now - placed_at[i] > start_timeout_s:
                    raise ClusterError(f"rollout engine {i} was placed on node {actor_node_id(actor) or '?'} but did "
                                       f"not start within {start_timeout_s:g} s")
                continue
            node_id = actor_node_id(actor)
            if node_id:
                placed_at[i] = now
                continue
            bound = place_timeout_s + (start_timeout_s if node_id is None else 0.0)
            if now - t0 > bound:
                raise ClusterError(not_placed_message(i, now - t0, asked, what=what, bound=(
                    f"{place_key}={place_timeout_s:g} s" if node_id is not None
                    else f"{place_key}={place_timeout_s:g} s + {start_timeout_s:g} s to start")))
    return [out[i] for i, _ in engines]


def not_placed_message(index: int, waited_s: float, asked: Mapping[str, float], *, what: str, bound: str) -> str:
    """``rollout engine 1 was not placed on any node within ...: it asks for CPU 1, rollout 1
    (cluster.placement.rollout); the cluster has CPU 4, rollout 2 in all, CPU 0.5 free; ...``"""
    free = resources_text(ray.available_resources())
    return (f"rollout engine {index} was not placed on any node within {bound} (waited {waited_s:.1f} s): it asks for "
            f"{resources_text({k: v for k, v in asked.items() if v})} ({what}); the cluster has "
            f"{resources_text(ray.cluster_resources())} in all, {'nothing' if free == 'nothing placeable' else free} free; "
            "other actors or jobs hold the rest: free them, add a node, or ask for less "
            f"({what}, rollout.num_engines)")


__all__ = ["ENGINE_START_S", "Started", "actor_node_id", "not_placed_message", "wait_ready"]
