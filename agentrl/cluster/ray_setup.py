"""How a run starts or joins Ray, where its roles go, and what the user reads when an actor dies.

- ``connect(cfg)``: ``cluster.address`` None always starts a new local Ray instance
  (``ray.init(address="local")``), whatever ``RAY_ADDRESS`` or the record an earlier
  ``ray start`` left in ``/tmp/ray`` says (also when that record points at a dead cluster);
  ``"auto"``, ``"host:port"`` or ``"ray://host:port"`` join a running cluster, and a join that
  fails is a ``ClusterError`` naming the address and what Ray said. A join ships the user's
  modules of ``env.import_modules`` with the job (``runtime_env`` ``py_modules``,
  ``agentrl.cluster.ray_join``); a local start first ends what the local instances of dead
  runs left (``agentrl.cluster.ray_local``).
- ``role_options(cfg, role)``: the ``.options(...)`` of one actor of a role (``trainer`` rank,
  ``rollout`` engine, ``sandbox`` host) from ``cluster.placement``.
- ``check_placement(cfg)``: at start-up, every role's actors must fit the alive nodes, else a
  ``ConfigError`` naming the value and each node's resources (never a run that waits forever
  for an actor Ray cannot place).
- ``actor_failure_message(exc)`` / ``as_cluster_error(exc)``: an actor killed by Ray's memory
  monitor, or one that died with its node, becomes one line naming the actor, the node and
  (for the memory monitor) the memory it had.

Example::

    started = connect(cfg)
    check_placement(cfg)
    engine = RolloutActor.options(**role_options(cfg, "rollout")).remote(...)
"""

from __future__ import annotations

import logging
import math
import os
import re
from typing import Any, Sequence

from agentrl.cluster.error_text import raised_error
from agentrl.errors import ClusterError, ConfigError

log = logging.getLogger(__name__)

ROLES = ("trainer", "rollout", "sandbox", "eval")
"""The placement roles, the keys of ``cluster.placement`` (``eval``: the dedicated eval engine
of asynchronous training, ``agentrl.cluster.async_eval``)."""

_EPS = 1e-6  # Ray keeps resource amounts to 1e-4; never call 0.99999 CPU "less than 1"
_MAX_SEARCH_STEPS = 200_000  # exact packing search budget (a few hundred ms at most)
_MAX_SEARCH_DEPTH = 400  # actors; more than that and a packing first-fit misses is left to Ray
LOCAL_SYSTEM_CONFIG = {"prestart_worker_first_driver": False}
"""Ray's ``_system_config`` for a local instance started here. Ray prestarts a worker per
logical CPU for the job when the driver connects (``prestart_worker_first_driver``), for
tasks and actors with the job's runtime environment; a run's actors each carry their own
(``role_options``: OpenMP threads), so none ever used them: each cost about 1 CPU-s and
100 MB, and their start-up held Ray's worker start slots (as many as cores) while the run's
actors waited to start (measured: 2 idle workers of about 0.7-1 CPU-s each per start on 2
cores). Tasks and actors still get workers on demand."""


def _local_num_cpus(cfg: Any) -> int:
    """Logical CPUs of a local instance: ``cluster.num_cpus``, else ``max(4, 2 x cores)`` so a
    trainer rank and an engine (1 CPU each) fit beside each other on a 2-core machine."""
    return cfg.cluster.num_cpus or max(4, 2 * (os.cpu_count() or 1))


def connect(cfg: Any) -> bool:
    """Start or join Ray for this run, as ``cluster.address`` says.

    Returns:
        True when this call initialised Ray (a new local instance, or a connection to the
        cluster at ``cluster.address``): the caller owns it and calls ``ray.shutdown()`` at
        the end (which, for a joined cluster, only disconnects). False when Ray was already
        initialised in this process (e.g. by a test), which is then used as it is.

    Raises:
        ClusterError: joining ``cluster.address`` failed (no cluster there, a dead cluster,
            an unreachable host); the message names the address and Ray's own words.
            Or a local instance would not start (e.g. Ray's "node timed out during startup"
            on a loaded machine): one line with Ray's words and where its logs are.
    """
    import ray

    if ray.is_initialized():
        return False
    from agentrl.logs import filter_ray_logger, filter_worker_logs

    filter_ray_logger()  # the command's console filter (agentrl.logs) on Ray's logger, before ray.init logs
    num_threads = str(max(1, os.cpu_count() or 1))
    common: dict[str, Any] = dict(
        log_to_driver=True, logging_level="WARNING",
        runtime_env={"env_vars": {"OMP_NUM_THREADS": num_threads, "TOKENIZERS_PARALLELISM": "false",
                                  "RAY_DEDUP_LOGS": "0"}},
    )
    address = cfg.cluster.address
    if address is None:
        # "local", never None: None would follow RAY_ADDRESS or /tmp/ray/ray_current_cluster
        # (an earlier `ray start`, maybe long dead) and then refuse num_cpus.
        from agentrl.cluster.ray_local import labelled_start, reap_dead_ray_instances

        reap_dead_ray_instances()  # what the local instances of killed runs left (agents ignore SIGTERM)
        try:
            with labelled_start():  # every process of the instance names this driver as its owner
                ray.init(address="local", num_cpus=_local_num_cpus(cfg), include_dashboard=False,
                         _system_config=LOCAL_SYSTEM_CONFIG, **common)
        except Exception as exc:  # e.g. "The current node timed out during startup" on a loaded machine
            raise ClusterError(_local_start_failed(exc)) from exc
        filter_worker_logs()  # the actors' forwarded output through the console filter
        return True
    from agentrl.cluster.ray_join import probe_gcs, recorded_cluster, ship_user_modules

    target = address
    try:
        if address == "auto" and not os.environ.get("RAY_ADDRESS"):
            target = recorded_cluster()
        if "://" not in target:
            probe_gcs(target)
    except (ConnectionError, ValueError) as exc:
        raise ClusterError(_join_failed(address, exc, maybe_auth=False)) from exc
    ship_user_modules(cfg, common["runtime_env"])
    try:
        ray.init(address=target, **common)
    except Exception as exc:  # ConnectionError, ValueError, RuntimeError, AuthenticationError
        raise ClusterError(_join_failed(address, exc, maybe_auth=True)) from exc
    filter_worker_logs()
    log.info("joined the Ray cluster at %s (cluster.address=%r)", ray.get_runtime_context().gcs_address, address)
    return True


def _said(exc: BaseException) -> str:
    """What Ray said, on one line."""
    return " ".join(str(exc).split()) or type(exc).__name__


def _local_start_failed(exc: BaseException) -> str:
    """One line for a local Ray instance that would not start (``cluster.address`` unset):
    Ray's own words, and where its processes logged why (Ray's exception omits the raylet's
    error, which is in the session's logs)."""
    said = _said(exc)
    return (f"starting a local Ray instance failed (cluster.address unset): {said}. Nothing of the run was done "
            "yet. On a heavily loaded machine Ray's start can time out: retry when the load is lower. Ray's own "
            "logs: /tmp/ray/session_latest/logs (raylet.err, gcs_server.err)")


def _join_failed(address: str, exc: BaseException, *, maybe_auth: bool) -> str:
    said = _said(exc)
    env = os.environ.get("RAY_ADDRESS")
    via = f" (RAY_ADDRESS={env!r})" if address == "auto" and env else ""
    auth = ""
    if maybe_auth and os.environ.get("RAY_AUTH_MODE") is None and (
            os.environ.get("RAY_AUTH_TOKEN") or os.path.exists(os.path.expanduser("~/.ray/auth_token"))):
        auth = ("; if the cluster uses token authentication (the default of `ray start` since Ray 2.59), "
                "export RAY_AUTH_MODE=token here (the token from ~/.ray/auth_token or RAY_AUTH_TOKEN)")
    return (f"cluster.address={address!r}{via}: could not join the Ray cluster: {type(exc).__name__}: {said}; "
            "start it first (`ray start --head` on the head node), check the address, or leave "
            f"cluster.address unset to start a local instance{auth}")


def _placement(cfg: Any, role: str) -> Any:
    if role not in ROLES:
        raise ConfigError(f"role={role!r}: expected one of {', '.join(ROLES)}")
    return getattr(cfg.cluster.placement, role)


def role_options(cfg: Any, role: str, index: int | None = None) -> dict[str, Any]:
    """The ``ActorClass.options(**...)`` kwargs of one actor of ``role``.

    Args:
        cfg: the run's ``Config``.
        role: ``"trainer"`` (one rank), ``"rollout"`` (one engine), ``"sandbox"`` (one host)
            or ``"eval"`` (the dedicated eval engine).
        index: the engine index of a ``rollout`` actor (its cores when engines share the
            local machine, ``agentrl.cluster.cpu_threads.engine_cores``); None: not bound.

    Returns:
        ``{"num_cpus": float, "num_gpus": float, "runtime_env": {"env_vars": {...}}}`` plus
        ``"resources": {name: amount}`` when ``cluster.placement.<role>.resources`` is not
        empty. ``env_vars``: the actor's OpenMP threads (``OMP_NUM_THREADS``, and for a bound
        engine ``OMP_PLACES`` / ``OMP_PROC_BIND`` / ``VLLM_CPU_OMP_THREADS_BIND``), from
        ``agentrl.cluster.cpu_threads.actor_env_vars``; Ray merges them over ``connect``'s.

    Raises:
        ConfigError: ``role`` is not one of ``ROLES``.
    """
    from agentrl.cluster.cpu_threads import actor_env_vars

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
    }


def dedicated_eval_engines(cfg: Any) -> int:
    """1 when the run evaluates on a dedicated eval engine (``controller.mode: async`` with
    evaluation during training, ``agentrl.cluster.async_eval``), else 0."""
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
    return (f"; cluster.address is unset, so this is a local Ray instance with {_local_num_cpus(cfg)} CPUs ({why}): "
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
    ``cluster.sandbox_hosts`` hosts), each reserving ``cluster.placement.<role>``: one actor of
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
        import ray

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


# ---------------------------------------------------------------------------------------------
# Actor deaths as one line


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
    from ray.exceptions import NodeDiedError, ObjectLostError, OutOfMemoryError, RayActorError

    if isinstance(exc, ClusterError):
        return None
    if isinstance(exc, RayActorError) and exc.actor_init_failed and not _is_memory_monitor_kill(str(exc)):
        return None
    if isinstance(exc, (RayActorError, OutOfMemoryError)):
        return ClusterError(actor_failure_message(exc))
    if isinstance(exc, (NodeDiedError, ObjectLostError)):
        return ClusterError(f"Ray lost a node or object the run needed: {_one_line(str(exc))}")
    return None
