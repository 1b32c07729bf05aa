"""Sandboxes on nodes of their own: the ``sandbox`` role of a cluster.

With ``cluster.sandbox_hosts = N > 0`` the driver starts N ``SandboxHost`` actors (placed
with ``cluster.placement.sandbox``, e.g. on nodes started with ``--resources
'{"sandbox": 4}'``) and every rollout actor reaches its sandboxes through them:

* ``SandboxHost`` (a threaded Ray actor) resolves ``sandbox.backend`` on *its* node
  (``sandboxes.choose_sandboxes``: Docker where that node has a daemon of ours, named by
  ``sandbox.docker_host`` or ``DOCKER_HOST`` or started by agentrl's scripts, with the image,
  else bubblewrap; the driver prints each host's choice), creates sandboxes on request, runs their ``exec`` / ``write_file`` /
  ``read_file`` / ``close`` by id, and closes all of them on ``shutdown()``. With
  ``sandbox.pool_size > 0`` it keeps a ``SandboxPool`` of warm sandboxes of the run's spec.
* ``RemoteSandbox`` (``agentrl.cluster.actors.remote_sandbox``) is the rollout side: it implements ``sandboxes.base.Sandbox``, so an
  environment cannot tell it from a local sandbox. Listeners fire in the rollout process
  with the ``ExecResult`` the host returned (the rollout records it into the turn). An
  exec's own ``timeout_s`` is enforced on the host (the backend kills the command there);
  the Ray call waits ``timeout_s + exec_margin_s`` at most. A host that died, or whose node
  is gone, makes the call raise ``SandboxError`` naming the host and its node, so the
  episode ends ``infra_error`` and is never scored.
* ``HostBalancer`` (``agentrl.cluster.actors.remote_sandbox`` too) spreads sandboxes: each rollout actor sends a new sandbox to the live
  host where it has the fewest open (its own count: no extra Ray call per episode), ties
  broken in turn starting at the engine's index, so two engines do not both start on host 0.
  A host seen lost takes no new sandboxes; a creation that meets a lost host moves on to the
  next live one.

Cleanup (docs/design.md, invariant 8): the controller calls ``stop_sandbox_hosts`` in its
``finally`` (each host's ``shutdown()`` closes every sandbox and reaps what earlier crashed
owners of this run left on its node, then the actor is killed). If a host process dies
instead (killed, node lost, driver gone), its bubblewrap sandboxes die with it
(``--die-with-parent``) and what they leave on disk, like the Docker containers of that
node (each carries the run label), is removed by the reaper of the next sandbox process on
that node (``sandboxes.reap_orphans``; on a one-machine cluster the controller's own
``reap_orphans`` at exit reaches them too).
"""

from __future__ import annotations

import dataclasses
import itertools
import logging
import os
import socket
import threading
import time
from collections.abc import Mapping, Sequence
from typing import Any

import ray
from ray.exceptions import RayError

import sandboxes
from agentrl.cluster.actors.placement import role_options
from agentrl.cluster.actors.remote_sandbox import CREATE_TIMEOUT_S, EXEC_MARGIN_S, SandboxHostRef
from agentrl.cluster.actors.sandbox_choice import announce
from agentrl.errors import AgentRLError, ClusterError, ConfigError, SandboxError
from sandboxes.base import SandboxSpec

log = logging.getLogger(__name__)

START_TIMEOUT_S = 300.0
"""Seconds ``start_sandbox_hosts`` waits for every host to start (placed and its pool warm)."""
CONTROL_CONCURRENCY = 4
"""Threads of the ``control`` group (``node``, ``stats``, ``shutdown``): answered even while
every exec thread is busy."""


def _spec_of(spec: SandboxSpec | Mapping[str, Any]) -> SandboxSpec:
    if isinstance(spec, SandboxSpec):
        return spec
    if isinstance(spec, Mapping):
        try:
            return SandboxSpec(**spec)
        except TypeError as exc:
            raise ConfigError(f"sandbox spec {dict(spec)!r} is not a SandboxSpec: {exc}") from None
    raise ConfigError(f"sandbox spec of type {type(spec).__name__} must be a SandboxSpec or a dict of its fields")


def _error_reply(exc: BaseException) -> tuple:
    """What a host method returns for an error, re-raised by ``RemoteSandbox`` as the same
    class (``ConfigError`` or ``SandboxError``, every other error a ``SandboxError``) with the
    command and output a ``SandboxError`` carries."""
    kind = "ConfigError" if isinstance(exc, ConfigError) else "SandboxError"
    msg = str(exc) if isinstance(exc, AgentRLError) else f"{type(exc).__name__}: {exc}"
    command = getattr(exc, "command", None)
    try:
        ray.cloudpickle.dumps(command)
    except Exception:  # noqa: BLE001 - a command that cannot travel is sent as its repr
        command = repr(command)
    return ("error", kind, msg, command, getattr(exc, "output", "") or "")


@ray.remote(concurrency_groups={"control": CONTROL_CONCURRENCY})
class SandboxHost:
    """Holds sandboxes on its node for the rollout actors (module docstring). Threaded:
    create it with ``.options(max_concurrency=...)`` at least the number of calls the
    rollout actors can have in flight (``start_sandbox_hosts`` does).

    Every sandbox method returns ``("ok", value)`` or ``("error", kind, message, command,
    output)`` instead of raising, so the rollout side re-raises ``ConfigError`` /
    ``SandboxError`` with a clean message (no remote traceback) and keeps Ray's own errors
    (actor died, node lost) for infrastructure faults of the host.

    Args:
        name: how errors and logs name this host (``sandbox-host-<i>``).
        run_id: the run; every sandbox carries it in its label.
        backend: ``sandbox.backend`` (``"auto"``, ``"bwrap"`` or ``"docker"``), resolved here.
        image: the image ``"auto"`` checks for when a Docker daemon answers.
        docker_host: ``sandbox.docker_host`` (``None``: this node's ``DOCKER_HOST``), the
            daemon ``sandboxes.choose_sandboxes`` judges and Docker sandboxes are made on.
        pool: with a warm pool, ``{"spec": SandboxSpec, "size": int, "max_sandboxes": int,
            "between_episodes": "reset" | "replace"}``; ``None``: a fresh sandbox per
            ``create``.

    Raises (at creation, surfacing as a Ray actor error):
        ConfigError: unknown backend or a bad pool setting.
        SandboxError: the pool's sandboxes did not start.
    """

    def __init__(self, name: str, run_id: str, backend: str = "auto",
                 image: str = SandboxSpec.image, pool: Mapping[str, Any] | None = None,
                 docker_host: str | None = None) -> None:
        self.name = name
        self.run_id = run_id
        choice = sandboxes.choose_sandboxes(backend, image, docker_host)
        self.backend, self.why, self.docker_host = choice.backend, choice.why, choice.docker_host
        self._reap_host = docker_host
        log.info("%s: sandboxes: %s", name, self.why)
        self._make = sandboxes.make_sandbox
        self._lock = threading.Lock()
        self._open: dict[str, Any] = {}
        self._ids = itertools.count()
        self._created = 0
        self._shut = False
        self._pool = None
        self._pool_spec: SandboxSpec | None = None
        if pool is not None:
            self._pool_spec = _spec_of(pool["spec"])
            spec, chosen, daemon = self._pool_spec, self.backend, self.docker_host
            self._pool = sandboxes.SandboxPool(lambda: sandboxes.make_sandbox(chosen, spec, docker_host=daemon), size=int(pool["size"]),
                                     max_sandboxes=pool.get("max_sandboxes"),
                                     between_episodes=pool.get("between_episodes", "reset"),
                                     workdir=spec.workdir)
            self._pool.wait_ready(timeout_s=START_TIMEOUT_S)

    # -------------------------------------------------------------- control (own threads)

    @ray.method(concurrency_group="control")
    def node(self) -> dict[str, Any]:
        """Where this host runs: ``{"name", "node_id", "node_ip", "hostname", "pid",
        "backend", "why"}`` (``backend``: what ``sandbox.backend`` resolved to here)."""
        return {"name": self.name, "node_id": ray.get_runtime_context().get_node_id(),
                "node_ip": ray.util.get_node_ip_address(), "hostname": socket.gethostname(),
                "pid": os.getpid(), "backend": self.backend, "why": self.why}

    @ray.method(concurrency_group="control")
    def stats(self) -> dict[str, Any]:
        """``{"open": sandboxes open now, "created": total created, "pool": PoolStats as a
        dict or None}``."""
        with self._lock:
            out: dict[str, Any] = {"open": len(self._open), "created": self._created}
        out["pool"] = dataclasses.asdict(self._pool.stats()) if self._pool is not None else None
        return out

    @ray.method(concurrency_group="control")
    def shutdown(self) -> int:
        """Close every sandbox (execs in flight end with ``SandboxError``), the pool's idle
        ones included, and reap what dead owners of this run left on this node; later
        ``create`` calls fail. Returns how many open sandboxes were closed. Idempotent."""
        with self._lock:
            self._shut = True
            items = list(self._open.items())
            self._open.clear()
        for sid, sb in items:
            try:
                sb.close()
            except Exception:  # noqa: BLE001 - closing the others matters more
                log.exception("%s: closing sandbox %s failed", self.name, sid)
        if self._pool is not None:
            self._pool.close()
        try:
            sandboxes.reap_orphans(self.run_id, docker_host=self.docker_host or self._reap_host)
        except Exception:  # noqa: BLE001 - best effort at exit
            log.exception("%s: reaping orphaned sandboxes failed", self.name)
        return len(items)

    # -------------------------------------------------------------- sandboxes (by id)

    def create(self, spec: SandboxSpec | Mapping[str, Any]) -> tuple:
        """Start a sandbox of ``spec`` (a leased warm one when the pool holds that spec).
        Returns ``("ok", sandbox_id)``."""
        try:
            spec = _spec_of(spec)
            with self._lock:
                if self._shut:
                    raise SandboxError(f"{self.name} is shut down")
            if self._pool is not None and spec == self._pool_spec:
                sb: Any = sandboxes.PooledSandbox(self._pool, self._pool.acquire(timeout_s=CREATE_TIMEOUT_S - EXEC_MARGIN_S))
            else:
                sb = self._make(self.backend, spec, docker_host=self.docker_host)
            with self._lock:
                if self._shut:  # shut down while it started: it must not outlive the host
                    sb.close()
                    raise SandboxError(f"{self.name} is shut down")
                sid = f"sb{next(self._ids)}"
                self._open[sid] = sb
                self._created += 1
            return ("ok", sid)
        except Exception as exc:  # noqa: BLE001 - every error travels as a reply
            return _error_reply(exc)

    def _sandbox(self, sandbox_id: str) -> Any:
        with self._lock:
            sb = self._open.get(sandbox_id)
        if sb is None:
            raise SandboxError(f"sandbox {sandbox_id!r} is not open on {self.name} (closed, or the host shut down)")
        return sb

    def exec(self, sandbox_id: str, command: str | Sequence[str], timeout_s: float | None = None,
             stdin: bytes | str | None = None, env: Mapping[str, str] | None = None,
             cwd: str | None = None) -> tuple:
        """``Sandbox.exec`` of sandbox ``sandbox_id``; ``("ok", ExecResult)``."""
        try:
            return ("ok", self._sandbox(sandbox_id).exec(command, timeout_s=timeout_s, stdin=stdin, env=env, cwd=cwd))
        except Exception as exc:  # noqa: BLE001
            return _error_reply(exc)

    def write_file(self, sandbox_id: str, path: str, content: bytes | str) -> tuple:
        """``Sandbox.write_file``; ``("ok", None)``."""
        try:
            return ("ok", self._sandbox(sandbox_id).write_file(path, content))
        except Exception as exc:  # noqa: BLE001
            return _error_reply(exc)

    def read_file(self, sandbox_id: str, path: str) -> tuple:
        """``Sandbox.read_file``; ``("ok", bytes)``."""
        try:
            return ("ok", self._sandbox(sandbox_id).read_file(path))
        except Exception as exc:  # noqa: BLE001
            return _error_reply(exc)

    def close(self, sandbox_id: str) -> tuple:
        """Close sandbox ``sandbox_id`` (a pooled one goes back to the pool); ``("ok",
        None)``, also when it is not open (closing is idempotent)."""
        with self._lock:
            sb = self._open.pop(sandbox_id, None)
        try:
            if sb is not None:
                sb.close()
            return ("ok", None)
        except Exception as exc:  # noqa: BLE001
            return _error_reply(exc)


def start_sandbox_hosts(cfg: Any, run_id: str, *, start_timeout_s: float = START_TIMEOUT_S) -> list[SandboxHostRef]:
    """Start the run's ``cluster.sandbox_hosts`` hosts (driver side; Ray must be up), each
    with ``role_options(cfg, "sandbox")``, and wait until every one answers.

    Each host runs ``max_concurrency = rollout.env_workers * rollout.num_engines + 4``
    threads for sandbox calls (every env worker of every engine may be waiting on one host).

    Returns:
        One ``SandboxHostRef`` per host, ``[]`` when ``cluster.sandbox_hosts == 0``.

    Raises:
        ClusterError: a host did not start within ``start_timeout_s`` (placement no node
            can satisfy) or died starting (its error in the message); the hosts already
            started are killed.
    """
    n = int(cfg.cluster.sandbox_hosts)
    if n == 0:
        return []
    options = role_options(cfg, "sandbox")
    engines = cfg.rollout.num_engines
    concurrency = cfg.rollout.env_workers * engines + 4
    pool = None
    if cfg.sandbox.pool_size > 0:
        cap = cfg.sandbox.max_sandboxes or max(cfg.sandbox.pool_size, cfg.rollout.max_num_seqs * engines)
        pool = {"spec": sandbox_spec(cfg, run_id), "size": cfg.sandbox.pool_size, "max_sandboxes": cap,
                "between_episodes": cfg.sandbox.between_episodes}
    actors = [SandboxHost.options(max_concurrency=concurrency, **options).remote(
        f"sandbox-host-{i}", run_id, cfg.sandbox.backend, SandboxSpec.image, pool, cfg.sandbox.docker_host)
        for i in range(n)]
    refs = [a.node.remote() for a in actors]
    try:
        ready, _ = ray.wait(refs, num_returns=n, timeout=start_timeout_s)
        if len(ready) < n:
            missing = [f"sandbox-host-{i}" for i, r in enumerate(refs) if r not in ready]
            raise ClusterError(f"{', '.join(missing)} not started within {start_timeout_s:.0f} s with options "
                               f"{options} (cluster.placement.sandbox); the cluster has {ray.cluster_resources()}")
        hosts = []
        for i, (actor, ref) in enumerate(zip(actors, refs)):
            try:
                info = ray.get(ref)
            except RayError as exc:
                raise ClusterError(f"sandbox-host-{i} failed to start: {type(exc).__name__}: {exc}") from None
            hosts.append(SandboxHostRef(actor, i, info["name"], info["node_id"], info["node_ip"], info["backend"]))
            announce(f"{hosts[-1].where()}: sandboxes: {info['why']}")
        return hosts
    except BaseException:
        for a in actors:
            try:
                ray.kill(a)
            except Exception:  # noqa: BLE001
                pass
        raise


def stop_sandbox_hosts(hosts: Sequence[SandboxHostRef], *, timeout_s: float = 60.0) -> None:
    """Shut every host down (each closes its sandboxes) within ``timeout_s``, then kill the
    actors. Never raises: a host that is already gone took its sandboxes with it (module
    docstring), one that does not answer is killed."""
    if not hosts:
        return
    refs = {}
    for h in hosts:
        try:
            refs[h.name] = h.actor.shutdown.remote()
        except Exception:  # noqa: BLE001
            pass
    deadline = time.monotonic() + timeout_s
    for name, ref in refs.items():
        try:
            closed = ray.get(ref, timeout=max(0.1, deadline - time.monotonic()))
            if closed:
                log.info("%s closed %d open sandboxes at shutdown", name, closed)
        except Exception as exc:  # noqa: BLE001 - gone or stuck: killed below
            first = (str(exc).strip().splitlines() or [""])[0]
            log.warning("%s did not shut down cleanly (%s: %s); killing it", name, type(exc).__name__, first)
    for h in hosts:
        try:
            ray.kill(h.actor)
        except Exception:  # noqa: BLE001
            pass


def sandbox_spec(cfg: Any, run_id: str) -> SandboxSpec:
    """The run's ``SandboxSpec`` (the ``sandbox`` section's limits, the run label)."""
    return SandboxSpec(
        memory_mb=cfg.sandbox.memory_mb,
        cpus=cfg.sandbox.cpus,
        pids_limit=cfg.sandbox.pids_limit,
        default_timeout_s=cfg.sandbox.timeout_s,
        output_limit_bytes=cfg.sandbox.output_limit_bytes,
        run_id=run_id,
    )
