"""The rollout side of the ``sandbox`` role (``agentrl.cluster.actors.sandbox_host`` has the
host side and the whole picture): ``SandboxHostRef`` (a started host and where it runs),
``RemoteSandbox`` (a sandbox on a host, satisfying ``sandboxes.base.Sandbox``, so an
environment cannot tell it from a local one), ``HostBalancer`` (which host a new sandbox goes
to) and ``make_remote_sandbox``. A host that died, or whose node is gone, makes a call raise
``HostLost`` (a ``SandboxError``) naming the host and its node, so the episode ends
``infra_error`` and is never scored.

It stays in ``agentrl.cluster`` rather than beside the backends in ``sandboxes/``: it calls
Ray, and ``sandboxes`` may import only types and errors (docs/design.md, "Who may import whom").
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayError

from agentrl.errors import ConfigError, SandboxError
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
