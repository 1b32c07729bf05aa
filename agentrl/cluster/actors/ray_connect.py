"""How a run starts or joins Ray: ``connect(cfg)``.

``cluster.address`` None always starts a new local Ray instance (``ray.init(address="local")``),
whatever ``RAY_ADDRESS`` or the record an earlier ``ray start`` left in ``/tmp/ray`` says (also
when that record points at a dead cluster); ``"auto"``, ``"host:port"`` or ``"ray://host:port"``
join a running cluster, and a join that fails is a ``ClusterError`` naming the address and what
Ray said. A join ships the user's modules of ``env.import_modules`` with the job
(``runtime_env`` ``py_modules``, ``agentrl.cluster.actors.ray_join``); a local start first ends
what the local instances of dead runs left (``agentrl.cluster.actors.ray_local``). Where the
run's actors then go: ``agentrl.cluster.actors.placement``.

Example::

    started = connect(cfg)
    check_placement(cfg)
    engine = RolloutActor.options(**role_options(cfg, "rollout")).remote(...)
"""

from __future__ import annotations

import logging
import os
from typing import Any

from agentrl.cluster.actors.placement import local_num_cpus
from agentrl.cluster.actors import ray_join, ray_local  # module attributes: tests stand in for their functions
from agentrl.errors import ClusterError
from agentrl.logs import filter_ray_logger, filter_worker_logs

log = logging.getLogger(__name__)

LOCAL_SYSTEM_CONFIG = {"prestart_worker_first_driver": False}
"""Ray's ``_system_config`` for a local instance started here. Ray prestarts a worker per
logical CPU for the job when the driver connects (``prestart_worker_first_driver``), for
tasks and actors with the job's runtime environment; a run's actors each carry their own
(``role_options``: OpenMP threads), so none ever used them: each cost about 1 CPU-s and
100 MB, and their start-up held Ray's worker start slots (as many as cores) while the run's
actors waited to start (measured: 2 idle workers of about 0.7-1 CPU-s each per start on 2
cores). Tasks and actors still get workers on demand."""



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
    import ray  # heavy: ray

    if ray.is_initialized():
        return False
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
        ray_local.reap_dead_ray_instances()  # what the local instances of killed runs left (agents ignore SIGTERM)
        try:
            with ray_local.labelled_start():  # every process of the instance names this driver as its owner
                ray.init(address="local", num_cpus=local_num_cpus(cfg), include_dashboard=False,
                         _system_config=LOCAL_SYSTEM_CONFIG, **common)
        except Exception as exc:  # e.g. "The current node timed out during startup" on a loaded machine
            raise ClusterError(_local_start_failed(exc)) from exc
        filter_worker_logs()  # the actors' forwarded output through the console filter
        return True
    target = address
    try:
        if address == "auto" and not os.environ.get("RAY_ADDRESS"):
            target = ray_join.recorded_cluster()
        if "://" not in target:
            ray_join.probe_gcs(target)
    except (ConnectionError, ValueError) as exc:
        raise ClusterError(_join_failed(address, exc, maybe_auth=False)) from exc
    ray_join.ship_user_modules(cfg, common["runtime_env"])
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
