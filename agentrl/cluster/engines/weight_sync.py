"""How new weights travel from the trainer to every rollout engine (``cluster.weight_sync``).

Both paths move one flat byte buffer: the full state dict (the tied ``lm_head.weight`` left
out, its source sent once) packed back to back in state-dict order by ``FlatLayout``, a
small index of ``(name, dtype, shape, byte offset)`` beside it. Trainer rank 0 keeps the
buffer across iterations (its pages stay mapped, so packing is one warm memcpy), and the
engine's views into it are zero-copy; q/k/v and gate/up lie next to each other, so the
engine repacks its fused ``qkv_proj`` / ``gate_up_proj`` straight from them
(``agentrl.rollout.weight_load``).

- ``"object_store"`` (default; CPU, any node layout): rank 0 puts the buffer in Ray's object
  store once (one memcpy into shared memory); every engine gets it in parallel, zero-copy on
  the same node (one transfer per other node), and loads it.
- ``"collective"``: a process group of its own between trainer rank 0 (rank 0 here) and the
  N engines (ranks 1..N), built on a ``TCPStore`` at rank 0's node; it never touches the
  trainer's FSDP group or the group vLLM keeps in the engine process (both stay the
  processes' default groups). gloo on CPU, NCCL where the trainer has a GPU. Rank 0
  broadcasts the buffer into each engine's receive buffer (kept across iterations). The
  group is built on the first sync and again whenever the set of engines changes.

The driver calls ``sync_weights``; the actors' methods (``TrainerActor.state_dict_ref``,
``gather_weights``, ``weight_group_endpoint``, ``join_weight_group``, ``broadcast_weights``;
``RolloutActor.update_weights``, ``join_weight_group``, ``receive_weights``) delegate to
``WeightSender`` / ``WeightReceiver`` here.

Memory: rank 0 keeps one buffer of the model's size (540 MB for SmolLM2-135M fp32); the
object-store path holds one more copy in shared memory while a sync is in flight; the
collective path keeps one receive buffer per engine.
"""

from __future__ import annotations

import hashlib
import logging
import socket
import time
import warnings
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Literal, Mapping, Sequence

import torch

from agentrl.errors import ClusterError, ConfigError

log = logging.getLogger(__name__)

WeightSyncMethod = Literal["object_store", "collective"]
METHODS: tuple[str, ...] = ("object_store", "collective")


# --------------------------------------------------------------------- the flat buffer

@dataclass(frozen=True)
class WeightSlot:
    """One tensor in the flat buffer: ``nbytes`` bytes at byte ``offset``."""

    name: str
    dtype: str  # torch dtype name, e.g. "float32"
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass(frozen=True)
class FlatLayout:
    """Where each weight lies in a flat ``uint8`` buffer of ``nbytes`` bytes.

    Tensors are placed back to back in the given order, each offset aligned to its dtype's
    size (so a state dict of one dtype has no gaps, and neighbours like q/k/v stay
    adjacent)."""

    slots: tuple[WeightSlot, ...]
    nbytes: int

    @staticmethod
    def of(state: Mapping[str, torch.Tensor]) -> "FlatLayout":
        slots, offset = [], 0
        for name, t in state.items():
            size = t.element_size()
            offset = -(-offset // size) * size
            nbytes = t.numel() * size
            slots.append(WeightSlot(name, str(t.dtype).removeprefix("torch."), tuple(t.shape), offset, nbytes))
            offset += nbytes
        return FlatLayout(tuple(slots), offset)

    def views(self, buffer: torch.Tensor) -> dict[str, torch.Tensor]:
        """``{name: tensor}`` views of ``buffer`` (``uint8 [nbytes]``), no copy."""
        if buffer.dtype != torch.uint8 or buffer.numel() != self.nbytes:
            raise ClusterError(f"weight buffer of {buffer.numel()} {buffer.dtype} elements does not fit a layout "
                               f"of {self.nbytes} bytes")
        return {s.name: buffer[s.offset:s.offset + s.nbytes].view(getattr(torch, s.dtype)).view(s.shape)
                for s in self.slots}


class FlatBuffer:
    """A ``uint8`` buffer kept across syncs (grown when the layout needs more bytes)."""

    def __init__(self, device: str | torch.device = "cpu") -> None:
        self.device = torch.device(device)
        self._buf: torch.Tensor | None = None

    def get(self, nbytes: int) -> torch.Tensor:
        """The buffer's first ``nbytes`` bytes (``uint8 [nbytes]``)."""
        if self._buf is None or self._buf.numel() < nbytes:
            self._buf = None  # free the old one first
            self._buf = torch.empty(nbytes, dtype=torch.uint8, device=self.device)
        return self._buf[:nbytes]

    @torch.no_grad()
    def pack(self, state: Mapping[str, torch.Tensor]) -> tuple[FlatLayout, torch.Tensor]:
        """Copy ``state`` into the buffer; ``(layout, buffer[:layout.nbytes])``."""
        layout = FlatLayout.of(state)
        buf = self.get(layout.nbytes)
        for slot, t in zip(layout.slots, state.values()):
            src = t.to_local() if hasattr(t, "to_local") else t
            buf[slot.offset:slot.offset + slot.nbytes].view(src.dtype).view(src.shape).copy_(src)
        return layout, buf


def _numpy_views(layout: FlatLayout, array: Any) -> dict[str, torch.Tensor]:
    """Views of an object-store array (read-only, zero-copy) as the layout's tensors."""
    with warnings.catch_warnings():  # the loaders only read them
        warnings.filterwarnings("ignore", message="The given NumPy array is not writable")
        return layout.views(torch.from_numpy(array))


# --------------------------------------------------------------------- the group

@dataclass(frozen=True)
class GroupSpec:
    """A weight-sync process group: trainer rank 0 is rank 0, engine ``i`` is rank ``i + 1``."""

    key: str
    host: str
    port: int
    world_size: int
    backend: Literal["gloo", "nccl"]
    timeout_s: float


class WeightGroup:
    """A process group of its own (``ProcessGroupGloo`` / ``ProcessGroupNCCL`` on a
    ``TCPStore``), independent of the process's default group.

    Raises:
        ClusterError: the members did not meet within ``spec.timeout_s``.
    """

    def __init__(self, spec: GroupSpec, rank: int, node_ip: str, listen_sock: socket.socket | None = None) -> None:
        import torch.distributed as dist  # heavy: torch

        self.spec, self.rank = spec, rank
        timeout = timedelta(seconds=float(spec.timeout_s))
        t0 = time.monotonic()
        try:
            if rank == 0:
                if listen_sock is None:
                    raise ClusterError("weight-sync group: rank 0 needs the socket reserved by weight_group_endpoint()")
                self.store = dist.TCPStore(spec.host, spec.port, spec.world_size, is_master=True, timeout=timeout,
                                           wait_for_workers=False, master_listen_fd=listen_sock.detach())
            else:
                self.store = dist.TCPStore(spec.host, spec.port, spec.world_size, is_master=False, timeout=timeout)
            prefix = dist.PrefixStore(f"agentrl-weights/{spec.key}", self.store)
            if spec.backend == "nccl":
                opts = dist.ProcessGroupNCCL.Options()
                opts._timeout = timeout
                self.pg = dist.ProcessGroupNCCL(prefix, rank, spec.world_size, opts)
                self.device = torch.device("cuda", torch.cuda.current_device())
            else:
                opts = dist.ProcessGroupGloo._Options()
                opts._timeout = timeout
                opts._devices = [dist.ProcessGroupGloo.create_device(hostname=node_ip)]
                self.pg = dist.ProcessGroupGloo(prefix, rank, spec.world_size, opts)
                self.device = torch.device("cpu")
            probe = torch.ones(1, device=self.device)
            self.pg.allreduce([probe]).wait()  # everyone is here
            if int(probe.item()) != spec.world_size:
                raise ClusterError(f"weight-sync group {spec.key}: the first all-reduce summed {probe.item()} "
                                   f"over {spec.world_size} members")
        except ClusterError:
            raise
        except (RuntimeError, OSError) as exc:  # torch's DistError / DistStoreError / DistNetworkError
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise ClusterError(
                f"weight-sync group member {rank} (node {node_ip}) could not meet trainer rank 0 at "
                f"{spec.host}:{spec.port} ({spec.backend}, {spec.world_size} members) within {spec.timeout_s:g} s "
                f"(after {time.monotonic() - t0:.1f} s): {type(exc).__name__}: {first}") from None

    def broadcast(self, buffer: torch.Tensor) -> None:
        """Rank 0's ``buffer`` into every member's ``buffer`` (same size, on ``self.device``)."""
        self.pg.broadcast([buffer], _broadcast_opts()).wait()
        if buffer.device.type == "cuda":  # NCCL's wait() only orders the streams: finish here (timing, reuse)
            torch.cuda.current_stream(buffer.device).synchronize()


def _broadcast_opts() -> Any:
    import torch.distributed as dist  # heavy: torch

    opts = dist.BroadcastOptions()
    opts.rootRank, opts.rootTensor = 0, 0
    return opts


def _node_ip() -> str:
    import ray  # heavy: ray

    return ray.util.get_node_ip_address()


# --------------------------------------------------------------------- trainer side

class WeightSender:
    """Trainer rank 0's side (every rank calls ``gather``; only rank 0 keeps anything)."""

    def __init__(self) -> None:
        self._cpu = FlatBuffer("cpu")
        self._dev: FlatBuffer | None = None  # NCCL: a GPU copy of the buffer to broadcast
        self._layout: FlatLayout | None = None
        self._group: WeightGroup | None = None
        self._listen: socket.socket | None = None

    def gather(self, trainer: Any, rank: int, dtype: str) -> tuple[FlatLayout, dict[str, float]] | None:
        """Collective over the trainer ranks: the full state dict (tied copies left out,
        cast to the engines' ``dtype``) packed into rank 0's buffer. Rank 0 returns
        ``(layout, {"gather_s", "pack_s"})``; the other ranks ``None``."""
        t0 = time.perf_counter()
        target = getattr(torch, dtype)
        sd = trainer.full_state_dict(None if target == torch.float32 else target, copy=False, tied_copies=False)
        t1 = time.perf_counter()
        if rank != 0:
            return None
        self._layout, _ = self._cpu.pack(sd)
        return self._layout, {"gather_s": t1 - t0, "pack_s": time.perf_counter() - t1}

    def put(self) -> Any:
        """The packed buffer in Ray's object store: ``(ref, put_s)``, the object being
        ``(layout, numpy uint8 array)``."""
        import ray  # heavy: ray

        if self._layout is None:
            raise ClusterError("weight sync: put() before gather()")
        t0 = time.perf_counter()
        ref = ray.put((self._layout, self._cpu.get(self._layout.nbytes).numpy()))
        return ref, time.perf_counter() - t0

    def warm(self, trainer: Any, rank: int, dtype: str, method: str) -> float:
        """Touch, once at start-up, the memory every later sync writes: the flat buffer
        (``gather``) and, on the object-store path, a region of the object store as large as
        the put (a put of the initial weights, dropped at once; the store reuses the region).
        First touches of 540 MB cost 0.5-1 s here (page faults); the controller starts this
        while the engines load, so the first sync runs as fast as the later ones. Collective
        over the trainer ranks, like ``gather``; seconds taken."""
        t0 = time.perf_counter()
        if self.gather(trainer, rank, dtype) is not None and method == "object_store":
            ref, _ = self.put()
            del ref
        return time.perf_counter() - t0

    # collective path
    def group_key(self) -> str | None:
        return None if self._group is None else self._group.spec.key

    def endpoint(self) -> tuple[str, int, str]:
        """``(node_ip, port, backend)``: a port bound and listening on this node until ``join``."""
        if self._listen is None:
            ip = _node_ip()
            sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((ip, 0))
            sock.listen(128)
            self._listen = sock
        host, port = self._listen.getsockname()[:2]
        return str(host), int(port), "nccl" if torch.cuda.is_available() else "gloo"

    def join(self, spec: GroupSpec) -> None:
        self._group = None  # an earlier group (another set of engines) is dropped
        sock, self._listen = self._listen, None
        self._group = WeightGroup(spec, 0, _node_ip(), listen_sock=sock)

    def broadcast(self, key: str) -> float:
        """Send the packed buffer to every engine of group ``key``; seconds taken."""
        if self._group is None or self._group.spec.key != key or self._layout is None:
            raise ClusterError(f"weight sync: trainer rank 0 holds no group {key!r} (has {self.group_key()!r}) "
                               "or nothing gathered")
        t0 = time.perf_counter()
        buf = self._cpu.get(self._layout.nbytes)
        if self._group.device.type != "cpu":
            if self._dev is None:
                self._dev = FlatBuffer(self._group.device)
            dev = self._dev.get(self._layout.nbytes)
            dev.copy_(buf, non_blocking=True)
            buf = dev
        self._group.broadcast(buf)
        return time.perf_counter() - t0


# --------------------------------------------------------------------- engine side

class WeightReceiver:
    """An engine's side: loads what the object store or the group delivers."""

    def __init__(self) -> None:
        self._group: WeightGroup | None = None
        self._buf: FlatBuffer | None = None
        self.last: dict[str, Any] = {}  # the last load: seconds per phase and the engine's load method

    def load_from_store(self, engine: Any, ref: Any) -> float:
        """Get ``(layout, array)`` from the object store (zero-copy on this node) and load
        it into ``engine`` (``VLLMEngine``); seconds taken."""
        import ray  # heavy: ray

        t0 = time.perf_counter()
        layout, array = ray.get(ref)
        views = _numpy_views(layout, array)
        t1 = time.perf_counter()
        method = engine.update_weights(views)
        del views, array
        t2 = time.perf_counter()
        self.last = {"get_s": t1 - t0, "load_s": t2 - t1, "method": method}
        return t2 - t0

    def join(self, spec: GroupSpec, rank: int) -> None:
        if spec.backend == "nccl" and not torch.cuda.is_available():
            raise ClusterError(f"weight-sync group {spec.key}: trainer rank 0 broadcasts over NCCL but engine "
                               f"(rank {rank}, node {_node_ip()}) has no GPU; use cluster.weight_sync=object_store")
        self._group = None
        self._group = WeightGroup(spec, rank, _node_ip())
        self._buf = FlatBuffer(self._group.device)

    def receive(self, engine: Any, key: str, layout: FlatLayout) -> float:
        """Receive group ``key``'s broadcast into the kept buffer and load it; seconds taken."""
        if self._group is None or self._group.spec.key != key or self._buf is None:
            have = None if self._group is None else self._group.spec.key
            raise ClusterError(f"weight sync: this engine holds no group {key!r} (has {have!r})")
        t0 = time.perf_counter()
        buf = self._buf.get(layout.nbytes)
        self._group.broadcast(buf)
        t1 = time.perf_counter()
        method = engine.update_weights(layout.views(buf))
        t2 = time.perf_counter()
        self.last = {"receive_s": t1 - t0, "load_s": t2 - t1, "method": method}
        return t2 - t0


# --------------------------------------------------------------------- the driver

def _actor_id(actor: Any) -> str:
    return actor._actor_id.hex()


def group_key(trainer_rank0: Any, engine_actors: Sequence[Any]) -> str:
    """Names the group of this trainer and exactly these engines (in this order)."""
    ids = "|".join([_actor_id(trainer_rank0), *(_actor_id(e) for e in engine_actors)])
    return hashlib.sha1(ids.encode()).hexdigest()[:16]


def weights_payload(trainer_actors: Sequence[Any]) -> list:
    """The trainers' current weights as one object-store snapshot: trainer rank 0's
    ``state_dict_ref`` (``[ref, stats]``; every rank takes part in the gather). Later updates
    do not change it, so it can be loaded later (the dedicated eval engine,
    ``agentrl.driver.dedicated_eval``) or handed to ``sync_weights(payload=...)``; the object
    store holds it (the model's size) until the last reference is dropped."""
    import ray  # heavy: ray

    return ray.get([t.state_dict_ref.remote() for t in trainer_actors])[0]


def sync_weights(trainer_actors: Sequence[Any], engine_actors: Sequence[Any], *,
                 method: WeightSyncMethod = "object_store", timeout_s: float = 120.0,
                 policy_version: int | None = None, mode: str = "continue",
                 payload: list | None = None) -> dict[str, float]:
    """Push the trainer's current weights to every engine; the engines load in parallel.

    Args:
        trainer_actors: every trainer rank (``TrainerActor``), rank 0 first; all take part
            in the gather.
        engine_actors: the ``RolloutActor``s to update.
        method: ``cluster.weight_sync`` (see the module docstring).
        timeout_s: how long the members of a new weight-sync group may take to meet
            (``"collective"`` only).
        policy_version: each engine's weight version after the load (``None`` keeps it).
        mode: what an engine whose rollout stream runs does with requests in flight:
            ``continue`` | ``drain`` | ``restart`` (``agentrl.rollout.session``); without a
            stream nothing is in flight and the load is immediate, as before.
        payload: ``"object_store"`` only: a ``weights_payload`` of the trainers' current
            weights to send instead of gathering them again (the caller keeps a reference:
            the async eval engine loads the same snapshot later); ignored by ``"collective"``.

    Returns:
        ``sync/gather_s`` (trainer side: gather and pack, plus the put on the object-store
        path), its parts ``sync/pack_s`` (into the flat buffer) and ``sync/put_s`` (into the
        object store), ``sync/broadcast_s`` (collective: rank 0's broadcast, from its start
        until every engine has received),
        ``sync/engine_{i}_s`` (engine ``i`` by position in ``engine_actors``: its get or
        receive plus its load), ``sync/total_s`` (the whole call; the caller records it as
        ``time/sync_s``), ``sync/mb`` (megabytes sent), and ``sync/group_setup_s`` when the
        collective path built its group in this call.

    Raises:
        ConfigError: an unknown ``method``, or no trainer actor.
        ClusterError: the collective group could not be formed; Ray's actor errors
            (``RayActorError``) pass through, so the caller can tell which engine died.
    """
    import ray  # heavy: ray

    if method not in METHODS:
        raise ConfigError(f"cluster.weight_sync={method!r} is not one of {list(METHODS)}")
    if not trainer_actors:
        raise ConfigError("sync_weights: no trainer actors")
    t0 = time.perf_counter()
    m: dict[str, float] = {}
    if method == "object_store":
        if payload is None:
            payload = weights_payload(trainer_actors)
        stats = payload[1]
        m["sync/gather_s"] = stats["gather_s"] + stats["pack_s"] + stats["put_s"]
        m["sync/pack_s"], m["sync/put_s"] = stats["pack_s"], stats["put_s"]
        m["sync/mb"] = stats["mb"]
        seconds = ray.get([e.update_weights.remote(payload, policy_version, mode) for e in engine_actors])
    else:
        rank0 = trainer_actors[0]
        key = group_key(rank0, engine_actors)
        outs = ray.get([t.gather_weights.remote() for t in trainer_actors])
        layout, stats, have_key = outs[0]
        if have_key != key:
            t1 = time.perf_counter()
            host, port, backend = ray.get(rank0.weight_group_endpoint.remote())
            spec = GroupSpec(key, host, port, 1 + len(engine_actors), backend, float(timeout_s))
            ray.get([rank0.join_weight_group.remote(spec),
                     *(e.join_weight_group.remote(spec, i + 1) for i, e in enumerate(engine_actors))])
            m["sync/group_setup_s"] = time.perf_counter() - t1
            log.info("weight-sync group %s (%s, %d engines) formed at %s:%d in %.2f s", key, backend,
                     len(engine_actors), host, port, m["sync/group_setup_s"])
        res = ray.get([rank0.broadcast_weights.remote(key),
                       *(e.receive_weights.remote(key, layout, policy_version, mode) for e in engine_actors)])
        m["sync/gather_s"] = stats["gather_s"] + stats["pack_s"]
        m["sync/pack_s"], m["sync/broadcast_s"] = stats["pack_s"], res[0]
        m["sync/mb"] = layout.nbytes / 1e6
        seconds = res[1:]
    m.update({f"sync/engine_{i}_s": float(s) for i, s in enumerate(seconds)})
    m["sync/total_s"] = time.perf_counter() - t0
    return m
