"""What the user reads when a Ray actor dies: ``actor_failure_message(exc)`` and
``as_cluster_error(exc)`` turn an actor killed by Ray's memory monitor, one that died with its
node, or one whose constructor raised, into one line naming the actor, the node and (for the
memory monitor) the memory it had, read from the text of Ray's exception.
"""

from __future__ import annotations

import re

from agentrl.cluster.actors.error_text import raised_error
from agentrl.errors import ClusterError


_OOM_NODE = re.compile(
    r"Memory on the node \(IP: (?P<ip>[^,)]+), ID: (?P<id>[0-9a-f]+)\) was (?P<used>[\d.]+\s*[KMGT]?B) used / "
    r"(?P<limit>[\d.]+\s*[KMGT]?B) limit")
_OOM_THRESHOLD = re.compile(r"threshold of \d+B \((?P<pct>[\d.]+)% of")
_OOM_KILLED = re.compile(
    r"Selected to kill: \((?:Actor\((?P<aid>[0-9a-f]+)\)|Task)[^)]*?task name=(?P<task>[^,]+),.*?pid=(?P<pid>\d+), "
    r"actual memory used=(?P<mem>[\d.]+\s*[KMGT]?B)")
_FIELD = re.compile(r"^\t(class_name|actor_id|pid|name|namespace|ip): (.*)$")
_NODE_ID = re.compile(r"Node Id: ([0-9a-f]+)")


def _one_line(text: str, limit: int = 300) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _is_memory_monitor_kill(text: str) -> bool:
    return "running low on memory" in text or "NODE_OUT_OF_MEMORY" in text


def _oom_message(text: str, actor_name: str | None) -> str:
    """``actor X (pid P) on node IP (node id N) was killed by Ray's memory monitor: it used M;
    the node had U used of L (kill threshold T%)`` from the memory monitor's report."""
    node = _OOM_NODE.search(text)
    victims = list(_OOM_KILLED.finditer(text))
    victim = victims[0] if victims else None
    if actor_name is not None:  # several workers killed at once: the one the caller asked about
        victim = next((v for v in victims if actor_name in v.group("task")), victim)
    name = actor_name
    if name is None and victim is not None:
        task = victim.group("task")  # "rollout-0:RolloutActor.__init__" or "RolloutActor.__init__"
        label, _, method = task.rpartition(":")
        cls = method.split(".")[0]
        name = f"{cls} {label!r}" if label else cls
    who = f"actor {name or '?'}"
    if victim is not None:
        who += f" (pid {victim.group('pid')})"
    where = f"node {node.group('ip')} (node id {node.group('id')})" if node else "its node"
    had = f"it used {victim.group('mem')}" if victim is not None else "its memory use was not reported"
    node_mem = ""
    if node:
        thr = _OOM_THRESHOLD.search(text)
        node_mem = (f"; the node had {node.group('used')} used of {node.group('limit')}"
                    + (f" (kill threshold {thr.group('pct')}%)" if thr else ""))
    others = f"; {len(victims) - 1} more worker(s) killed with it" if len(victims) > 1 else ""
    return (f"{who} on {where} was killed by Ray's memory monitor: {had}{node_mem}{others}; give the node more "
            "memory, place fewer actors on it (cluster.placement) or shrink them, or raise "
            "RAY_memory_usage_threshold (default 0.95) when starting Ray")


def actor_failure_message(exc: BaseException, actor_name: str | None = None) -> str:
    """One line saying which actor died where, and why, from a Ray actor/OOM exception.

    Args:
        exc: ``ray.exceptions.OutOfMemoryError``, ``ActorDiedError`` / ``RayActorError``, or
            another Ray error about a lost node or object.
        actor_name: how to call the actor (e.g. ``"rollout engine 1"``); None: the class and
            name Ray's message gives.

    Returns:
        For the memory monitor: ``actor RolloutActor 'rollout-0' (pid 123) on node 10.0.0.2
        (node id ...) was killed by Ray's memory monitor: it used 3.21GB; the node had 22.4GB
        used of 23.54GB (kill threshold 95.0%); ...``. Else ``actor X (pid P) on node IP died:
        <cause>``.
    """
    text = str(exc)
    if _is_memory_monitor_kill(text):
        return _oom_message(text, actor_name)
    if getattr(exc, "actor_init_failed", False):  # its constructor raised: that error is the cause
        cls = re.search(r"ray::(\w+)\.__init__\(\)", text)
        who = actor_name or (cls.group(1) if cls else "?")
        pid = re.search(r"\(pid=(\d+), ip=([^,)]+)", text)
        where = f" (pid {pid.group(1)}) on node {pid.group(2)}" if pid else ""
        return f"actor {who}{where} could not start: {raised_error(text) or _one_line(text)}"
    fields: dict[str, str] = {}
    rest: list[str] = []
    for line in text.splitlines():
        m = _FIELD.match(line)
        if m:
            fields[m.group(1)] = m.group(2).strip()
        elif line.strip() and line.strip() != "The actor died unexpectedly before finishing this task.":
            rest.append(line.strip())
    name = actor_name
    if name is None:
        cls, nm = fields.get("class_name"), fields.get("name")
        cls = cls.rsplit(".", 1)[-1] if cls else cls  # "test_x.<locals>.Probe" -> "Probe"
        name = (f"{cls} {nm!r}" if cls and nm else cls or nm
                or (f"id {fields.get('actor_id') or getattr(exc, 'actor_id', None)}"
                    if fields.get("actor_id") or getattr(exc, "actor_id", None) else "?"))
    who = f"actor {name}" + (f" (pid {fields['pid']})" if "pid" in fields else "")
    node_id = _NODE_ID.search(text)
    where = ""
    if "ip" in fields:
        where = f" on node {fields['ip']}" + (f" (node id {node_id.group(1)})" if node_id else "")
    cause = _NODE_ID.sub("", " ".join(rest))  # the node id is named in `where`
    cause = cause.split(" Some common causes include")[0]  # Ray's generic advice, not this failure
    cause = cause.removeprefix("The actor is dead because ").removeprefix("The actor died because ")
    return f"{who}{where} died: {_one_line(cause) or type(exc).__name__}"


def as_cluster_error(exc: BaseException) -> ClusterError | None:
    """The ``ClusterError`` for a Ray actor, node or memory-monitor fault, or None for anything
    else (including an actor whose constructor raised: that is the constructor's error, e.g.
    a ``ConfigError``, not the cluster's fault).

    Example::

        try:
            ...
        except Exception as exc:
            err = as_cluster_error(exc)
            if err is None:
                raise
            raise err from exc
    """
    from ray.exceptions import NodeDiedError, ObjectLostError, OutOfMemoryError, RayActorError  # heavy: ray

    if isinstance(exc, ClusterError):
        return None
    if isinstance(exc, RayActorError) and exc.actor_init_failed and not _is_memory_monitor_kill(str(exc)):
        return None
    if isinstance(exc, (RayActorError, OutOfMemoryError)):
        return ClusterError(actor_failure_message(exc))
    if isinstance(exc, (NodeDiedError, ObjectLostError)):
        return ClusterError(f"Ray lost a node or object the run needed: {_one_line(str(exc))}")
    return None
