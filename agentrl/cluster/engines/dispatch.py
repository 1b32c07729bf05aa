"""How the engine pool (``agentrl.cluster.engines.pool``) hands requests to its engines, as
pure functions (no Ray): water-filling counts over the engines' loads (``assign_requests``) and
contiguous slices of them (``split_contiguous``); a lost engine's requests as aborted episodes
and retries (``abort_requests``); and the pool metrics of a rollout and its refills
(``merge_rollout_metrics``). The pool's module docstring says why dispatch is one slice per
engine, up front.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Mapping, Sequence

from agentrl.cluster.actors.actor_errors import actor_failure_message
from agentrl.types import Episode, EpisodeRequest, TerminationReason

_SUMMED = ("cluster/engines_lost", "cluster/engines_replaced", "cluster/replacement_wait_s", "rollout/aborted_episodes")


def assign_requests(num_requests: int, loads: Sequence[int]) -> list[int]:
    """How many of ``num_requests`` new requests each engine gets, so that the engines'
    in-flight counts ``loads[i] + counts[i]`` are as even as possible (water-filling: each
    request goes to the engine with the fewest in flight, the lowest position on a tie).

    Args:
        num_requests: new requests, ``>= 0``.
        loads: ``[E]`` episodes each live engine has in flight now (``E >= 1``).

    Returns:
        ``[E]`` counts summing to ``num_requests``. The caller hands engine ``i`` the
        contiguous slice after engine ``i - 1``'s (``split_contiguous``).

    Raises:
        ValueError: no engine, or a negative count or load.
    """
    if not loads:
        raise ValueError("assign_requests: no engine to assign requests to")
    if num_requests < 0 or any(x < 0 for x in loads):
        raise ValueError(f"assign_requests: num_requests={num_requests}, loads={list(loads)}; expected counts >= 0")
    level = list(loads)
    counts = [0] * len(loads)
    for _ in range(num_requests):
        i = min(range(len(level)), key=lambda j: (level[j], j))
        level[i] += 1
        counts[i] += 1
    return counts


def whole_groups(counts: Sequence[int], group_ids: Sequence[str]) -> list[int]:
    """``counts`` (``assign_requests``) with every slice boundary that would cut a group moved
    forward to the end of that group, so no group spans two engines (a group-mode judge
    judges each group in one call on its engine). Items of one group must be adjacent in
    ``group_ids`` (as ``TaskSource`` orders them).

    Returns:
        ``[E]`` counts summing to ``len(group_ids)``; a later engine may get fewer (or none).
    """
    n, out, start = len(group_ids), [], 0
    for i, c in enumerate(counts):
        if i == len(counts) - 1:
            out.append(n - start)
            break
        end = min(n, start + max(0, c))
        while 0 < end < n and group_ids[end - 1] == group_ids[end]:
            end += 1
        out.append(end - start)
        start = end
    return out


def split_contiguous(items: Sequence[Any], counts: Sequence[int]) -> list[list[Any]]:
    """``items`` cut into consecutive slices of ``counts[i]`` items (``sum(counts) ==
    len(items)``)."""
    if sum(counts) != len(items):
        raise ValueError(f"split_contiguous: counts {list(counts)} sum to {sum(counts)}, not {len(items)} items")
    out, start = [], 0
    for c in counts:
        out.append(list(items[start:start + c]))
        start += c
    return out


def describe_engine(engine_index: int, node: Mapping[str, Any] | None) -> str:
    """``"rollout engine 1 on node 3f2a... (10.0.0.5)"`` (``node``: ``RolloutActor.node()``,
    or None when the engine never reported it)."""
    if not node:
        return f"rollout engine {engine_index} (node unknown)"
    return f"rollout engine {engine_index} on node {node.get('node_id', '?')} ({node.get('node_ip', '?')})"


def abort_requests(requests: Sequence[EpisodeRequest], engine_index: int, node: Mapping[str, Any] | None,
                   exc: BaseException, *, prompt_mode: str = "full_history") -> tuple[list[Episode], list[EpisodeRequest]]:
    """The requests a lost engine had in flight, turned into aborted episodes and retries.

    Returns:
        ``(aborted, retries)``, both ``[len(requests)]`` in order: ``aborted[k]`` an
        ``Episode`` of ``requests[k]`` (its ``episode_id``, no turns, termination reason
        ``aborted``, neither terminated nor truncated, ``error`` ``{"type", "message",
        "engine_index", "node_id", "node_ip"}``); ``retries[k]`` the same request with
        ``attempt + 1``.
    """
    where = describe_engine(engine_index, node)
    message = (f"{where} was lost while running this episode "
               f"({actor_failure_message(exc, f'rollout engine {engine_index}')})")
    aborted, retries = [], []
    for req in requests:
        aborted.append(Episode(
            group_id=req.group_id, env_id=req.env_id, task_id=req.task_id, seed=req.seed,
            termination_reason=TerminationReason.ABORTED, episode_id=req.episode_id, prompt_mode=prompt_mode,
            error={"type": type(exc).__name__, "message": message, "engine_index": str(engine_index),
                   "node_id": str((node or {}).get("node_id", "")), "node_ip": str((node or {}).get("node_ip", ""))},
        ))
        retries.append(replace(req, attempt=req.attempt + 1))
    return aborted, retries


def merge_rollout_metrics(total: Mapping[str, float], new: Mapping[str, float]) -> dict[str, float]:
    """Pool metrics of two ``rollout`` calls of one iteration (a rollout and its refills):
    counts and seconds add up, ``cluster/engines`` is the later call's."""
    out = dict(total)
    for k, v in new.items():
        if k in out and (k in _SUMMED or (k.startswith("rollout/engine_") and k.endswith(("_episodes", "_s")))):
            out[k] = out[k] + v
        else:
            out[k] = v
    return out
