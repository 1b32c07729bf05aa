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
* ``RemoteSandbox`` is the rollout side: it implements ``sandboxes.base.Sandbox``, so an
  environment cannot tell it from a local sandbox. Listeners fire in the rollout process
  with the ``ExecResult`` the host returned (the rollout records it into the turn). An
  exec's own ``timeout_s`` is enforced on the host (the backend kills the command there);
  the Ray call waits ``timeout_s + exec_margin_s`` at most. A host that died, or whose node
  is gone, makes the call raise ``SandboxError`` naming the host and its node, so the
  episode ends ``infra_error`` and is never scored.
* ``HostBalancer`` spreads sandboxes: each rollout actor sends a new sandbox to the live
  host where it has the fewest open (its own count: no extra Ray call per episode), ties
  broken in turn starting at the engine's index, so two engines do not both start on host 0.
  A host seen lost takes no new sandboxes; a creation that meets a lost host moves on to the
  next live one.

Cleanup (design.md, invariant 8): the controller calls ``stop_sandbox_hosts`` in its
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
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError

from agentrl.cluster.ray_setup import role_options
from agentrl.errors import AgentRLError, ClusterError, ConfigError, SandboxError
from agentrl.types import ExecResult
from sandboxes.base import ExecListener, ExecListeners, SandboxSpec

log = logging.getLogger(__name__)

EXEC_MARGIN_S = 30.0
"""Seconds a Ray call of ``exec`` waits beyond the exec's own ``timeout_s`` (starting the
command, the backend's kill grace, the transfer) before it counts as a host fault."""
CALL_TIMEOUT_S = 60.0
"""Seconds a ``write_file`` / ``read_file`` / ``close`` call may take."""
CREATE_TIMEOUT_S = 300.0
"""Seconds a sandbox creation may take (a pool at its cap waits for a release)."""
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
        from sandboxes import SandboxPool, choose_sandboxes, make_sandbox

        self.name = name
        self.run_id = run_id
        choice = choose_sandboxes(backend, image, docker_host)
        self.backend, self.why, self.docker_host = choice.backend, choice.why, choice.docker_host
        self._reap_host = docker_host
        log.info("%s: sandboxes: %s", name, self.why)
        self._make = make_sandbox
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
            self._pool = SandboxPool(lambda: make_sandbox(chosen, spec, docker_host=daemon), size=int(pool["size"]),
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
        from sandboxes import reap_orphans

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
            reap_orphans(self.run_id, docker_host=self.docker_host or self._reap_host)
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
                from sandboxes import PooledSandbox

                sb: Any = PooledSandbox(self._pool, self._pool.acquire(timeout_s=CREATE_TIMEOUT_S - EXEC_MARGIN_S))
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


@dataclass(frozen=True)
class SandboxHostRef:
    """A started ``SandboxHost`` and where it runs: what the driver hands the rollout actors
    (picklable: the actor handle travels with it).

    Attributes:
        actor: the ``SandboxHost`` actor handle.
        index: its position in ``cluster.sandbox_hosts`` (0-based).
        name: ``sandbox-host-<index>``.
        node_id: Ray node id (hex) of its node.
        node_ip: that node's address.
        backend: ``"bwrap"`` or ``"docker"``, resolved on that node.
    """

    actor: Any
    index: int
    name: str
    node_id: str
    node_ip: str
    backend: str

    def where(self) -> str:
        """``"sandbox host 'sandbox-host-0' on node 10.0.0.5 (id 1a2b3c4d5e6f)"``."""
        return f"sandbox host {self.name!r} on node {self.node_ip} (id {self.node_id[:12]})"


def _node_state(node_id: str) -> str:
    """``"the node is dead"`` / ``"the node is alive"`` from Ray's node table, or ``""``."""
    try:
        for n in ray.nodes():
            if n.get("NodeID") == node_id:
                return "the node is alive" if n.get("Alive") else "the node is dead"
        return "the node is no longer in the cluster"
    except Exception:  # noqa: BLE001 - only for the message
        return ""


class HostBalancer:
    """Which sandbox host a rollout actor sends its next sandbox to: the live host where
    this actor has the fewest sandboxes open, ties broken in turn (round-robin) starting at
    ``start``. Thread-safe (the rollout's env workers create sandboxes concurrently).

    Args:
        n_hosts: number of hosts (>= 1).
        start: the first host to prefer on a tie (e.g. the engine index), taken mod ``n_hosts``.

    Raises:
        ConfigError: ``n_hosts < 1``.
    """

    def __init__(self, n_hosts: int, start: int = 0) -> None:
        if not isinstance(n_hosts, int) or n_hosts < 1:
            raise ConfigError(f"n_hosts={n_hosts!r} must be an integer >= 1")
        self._lock = threading.Lock()
        self._open = [0] * n_hosts
        self._lost = [False] * n_hosts
        self._next = start % n_hosts

    def pick(self) -> int | None:
        """The host for the next sandbox, or ``None`` when every host is lost."""
        with self._lock:
            n = len(self._open)
            order = [(self._next + k) % n for k in range(n)]
            live = [i for i in order if not self._lost[i]]
            if not live:
                return None
            best = min(live, key=lambda i: self._open[i])  # min keeps the first of equals: round-robin order
            self._next = (best + 1) % n
            return best

    def opened(self, i: int) -> None:
        with self._lock:
            self._open[i] += 1

    def closed(self, i: int) -> None:
        with self._lock:
            self._open[i] = max(0, self._open[i] - 1)

    def lost(self, i: int) -> None:
        """Host ``i`` is gone: it takes no new sandboxes."""
        with self._lock:
            self._lost[i] = True

    def open_counts(self) -> list[int]:
        with self._lock:
            return list(self._open)

    def lost_hosts(self) -> list[int]:
        with self._lock:
            return [i for i, gone in enumerate(self._lost) if gone]


class HostLost(SandboxError):
    """The sandbox host (its actor process or its node) is gone. A ``SandboxError``, so an
    ``InfraError``: the episode ends ``infra_error``, never with a reward."""


def _call(host: SandboxHostRef, method: str, *args: Any, timeout_s: float, command: object = None) -> Any:
    """Call ``host.actor.<method>(*args)`` and unwrap its reply.

    Raises:
        HostLost: the host's actor died or its node is gone (names host and node).
        SandboxError: no answer within ``timeout_s``, another Ray fault, or the error the
            host replied with.
        ConfigError: the host replied with a ``ConfigError`` (a bad argument).
    """
    ref = getattr(host.actor, method).remote(*args)
    try:
        reply = ray.get(ref, timeout=timeout_s)
    except RayActorError as exc:
        state = _node_state(host.node_id)
        first = (str(exc).strip().splitlines() or [""])[0]
        raise HostLost(f"{host.where()} is lost{' (' + state + ')' if state else ''} during {method}: "
                       f"{type(exc).__name__}: {first}", command=command) from exc
    except GetTimeoutError:
        try:
            ray.cancel(ref)
        except Exception:  # noqa: BLE001 - best effort
            pass
        raise SandboxError(f"{host.where()} did not answer {method} within {timeout_s:.0f} s", command=command) from None
    except RayError as exc:
        raise SandboxError(f"{host.where()}: {method} failed in Ray: {type(exc).__name__}: {exc}", command=command) from exc
    if reply[0] == "ok":
        return reply[1]
    _, kind, msg, cmd, output = reply
    if kind == "ConfigError":
        raise ConfigError(msg)
    raise SandboxError(f"{msg} (on {host.where()})", command=cmd if cmd is not None else command, output=output)


class RemoteSandbox:
    """A sandbox on a ``SandboxHost``, used like a local one (``sandboxes.base.Sandbox``).

    Args:
        host: where to create it.
        spec: its limits and layout (validated on the host).
        exec_margin_s: seconds the Ray call of an exec waits beyond the exec's ``timeout_s``.
        on_close: called once when it is closed (the balancer's count).
        on_lost: called when the host is found lost (the balancer stops using it).

    Attributes:
        spec: as given.
        host: the ``SandboxHostRef``.
        sandbox_id: its id on the host.

    Raises:
        HostLost: the host is gone (names host and node).
        SandboxError: the sandbox did not start there, or the host did not answer within
            ``CREATE_TIMEOUT_S``.
        ConfigError: an invalid spec.

    Thread safety: as the host's backend (``exec`` may run from several threads); listeners
    fire in the calling thread, after the host returned the result.
    """

    def __init__(self, host: SandboxHostRef, spec: SandboxSpec, *, exec_margin_s: float = EXEC_MARGIN_S,
                 on_close: Callable[[], None] | None = None, on_lost: Callable[[], None] | None = None) -> None:
        self.spec = spec
        self.host = host
        self._margin = float(exec_margin_s)
        self._on_close, self._on_lost = on_close, on_lost
        self._listeners = ExecListeners()
        self._closed = False
        self._lock = threading.Lock()
        self.sandbox_id: str = self._call("create", spec, timeout_s=CREATE_TIMEOUT_S)

    def _call(self, method: str, *args: Any, timeout_s: float, command: object = None) -> Any:
        try:
            return _call(self.host, method, *args, timeout_s=timeout_s, command=command)
        except HostLost:
            if self._on_lost is not None:
                self._on_lost()
            raise

    def _check_open(self, command: object = None) -> None:
        if self._closed:
            raise SandboxError(f"{self!r} is closed", command=command)

    def exec(self, command: str | Sequence[str], *, timeout_s: float | None = None,
             stdin: bytes | str | None = None, env: Mapping[str, str] | None = None,
             cwd: str | None = None) -> ExecResult:
        """Run ``command`` on the host (``Sandbox.exec``): the host enforces ``timeout_s``
        (default ``spec.default_timeout_s``); this call waits ``timeout_s + exec_margin_s``.
        Every listener is called here with the result.

        Raises:
            ConfigError: an invalid argument (the host's checks).
            HostLost: the host or its node is gone.
            SandboxError: the sandbox failed, was closed, or the host did not answer in time.
        """
        self._check_open(command)
        if isinstance(stdin, (bytearray, memoryview)):
            stdin = bytes(stdin)
        limit = self.spec.default_timeout_s if timeout_s is None else timeout_s
        wait = (float(limit) if isinstance(limit, (int, float)) and limit > 0 else 0.0) + self._margin
        result = self._call("exec", self.sandbox_id, command, timeout_s, stdin,
                            dict(env) if env is not None else None, cwd, timeout_s=wait, command=command)
        self._listeners.notify(result)
        return result

    def write_file(self, path: str, content: bytes | str) -> None:
        """``Sandbox.write_file`` on the host. Raises SandboxError (HostLost), ConfigError."""
        self._check_open()
        if isinstance(content, (bytearray, memoryview)):
            content = bytes(content)
        self._call("write_file", self.sandbox_id, path, content, timeout_s=CALL_TIMEOUT_S)

    def read_file(self, path: str) -> bytes:
        """``Sandbox.read_file`` on the host. Raises SandboxError (HostLost; a missing file
        with FileNotFoundError's message)."""
        self._check_open()
        return self._call("read_file", self.sandbox_id, path, timeout_s=CALL_TIMEOUT_S)

    def add_listener(self, listener: ExecListener) -> None:
        """Call ``listener(result)`` after every exec, in this process. Raises ConfigError:
        not callable."""
        self._listeners.add(listener)

    def remove_listener(self, listener: ExecListener) -> None:
        self._listeners.remove(listener)

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close it on the host (its execs in flight end with ``SandboxError``). Idempotent;
        a lost host is only logged (its sandboxes died with it).

        Raises:
            SandboxError: the host failed to close it, or did not answer in time.
        """
        with self._lock:
            if self._closed:
                return
            self._closed = True
        try:
            self._call("close", self.sandbox_id, timeout_s=CALL_TIMEOUT_S)
        except HostLost as exc:
            log.warning("closing sandbox %s: %s", self.sandbox_id, exc)
        finally:
            if self._on_close is not None:
                self._on_close()

    def __enter__(self) -> RemoteSandbox:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return (f"RemoteSandbox(id={getattr(self, 'sandbox_id', None)!r}, {self.host.where()}, "
                f"{'closed' if self._closed else 'open'})")


def make_remote_sandbox(hosts: Sequence[SandboxHostRef], balancer: HostBalancer, spec: SandboxSpec) -> RemoteSandbox:
    """A new ``RemoteSandbox`` on the host ``balancer`` picks; a host found lost while
    creating is marked and the next live one tried.

    Raises:
        HostLost: every host is lost (names each host and node).
        SandboxError, ConfigError: the host's answer (a sandbox that failed to start).
    """
    lost: list[str] = []
    while True:
        i = balancer.pick()
        if i is None:
            raise HostLost(f"no sandbox host is left: {'; '.join(lost) or ', '.join(h.where() + ' is lost' for h in hosts)}")
        host = hosts[i]
        try:
            sb = RemoteSandbox(host, spec, on_close=lambda i=i: balancer.closed(i), on_lost=lambda i=i: balancer.lost(i))
        except HostLost as exc:
            lost.append(str(exc))
            continue
        balancer.opened(i)
        return sb


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
    from agentrl.cluster.sandbox_choice import announce
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
