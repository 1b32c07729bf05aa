"""The trainer's Ray actor: ``TrainerActor``, one FSDP2 rank of the policy trainer (and of
the critic, when the run trains one), over gloo on CPU or NCCL on GPUs. The driver starts
the ranks through ``agentrl.cluster.actors.trainer_group.TrainerGroup``. Weight sync: rank 0
gathers the full state dict, puts it in the object store and returns the reference inside a
list, so only the reference passes through the driver (platform notes;
``agentrl.cluster.engines.weight_sync``).
"""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct
import time
from datetime import timedelta
from typing import Any

import ray

from agentrl.config import Config, trainer_configs
from agentrl.errors import ClusterError, ConfigError


def _interface_of(ip: str) -> str | None:
    """The name of the network interface that holds the IPv4 address ``ip`` (e.g.
    ``"eth0"``), or None when ``ip`` is loopback or IPv6, or no interface holds it (or the
    platform cannot say: the lookup is Linux's ``SIOCGIFADDR``). Gloo binds its
    connections to it (``GLOO_SOCKET_IFNAME``), so a host whose name resolves to
    127.0.1.1 still meets ranks on other nodes."""
    addr = ipaddress.ip_address(ip)
    if addr.is_loopback or addr.version != 4:
        return None
    siocgifaddr = 0x8915
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        for _, name in socket.if_nameindex():
            try:
                raw = fcntl.ioctl(s.fileno(), siocgifaddr, struct.pack("256s", name.encode()[:15]))
            except OSError:
                continue  # an interface without an IPv4 address
            if socket.inet_ntoa(raw[20:24]) == ip:
                return name
    return None


@ray.remote
class TrainerActor:
    """One FSDP2 rank of the policy trainer (and of the critic, when the run trains one).

    Started in phases, so that ranks on different nodes meet at rank 0's node
    (``agentrl.cluster.actors.trainer_group.TrainerGroup`` drives them):

    1. ``__init__``: keeps its arguments; no rendezvous, no model.
    2. ``endpoint()`` (rank 0): this node's IP and a TCP port bound there, held until ``setup``.
    3. ``setup(master_addr, master_port, timeout_s)`` (every rank): joins the process group
       at rank 0's endpoint within ``timeout_s`` seconds or raises ``ClusterError``.
    4. ``build()`` (every rank, collective): the ``PolicyTrainer`` / ``CriticTrainer``.
    """

    def __init__(self, rank: int, world_size: int, cfg_dict: dict, model_path: str) -> None:
        if not 0 <= rank < world_size:
            raise ConfigError(f"trainer rank={rank} is not in [0, world_size={world_size})")
        import torch.distributed  # noqa: F401  heavy: torch (imported here, so setup's clock measures the meeting only)

        self.cfg = Config.model_validate(cfg_dict)
        self.rank = rank
        self.world_size = world_size
        self.model_path = model_path
        self.trainer: Any = None
        self.critic: Any = None
        self._listen_sock: socket.socket | None = None  # rank 0: the port reserved by endpoint()
        self._store: Any = None  # the TCPStore of the group (kept alive with it)

    def node(self) -> dict:
        """Where this rank runs: ``{"rank": int, "node_id": hex str, "node_ip": str, "pid": int}``."""
        ctx = ray.get_runtime_context()
        return {"rank": self.rank, "node_id": ctx.get_node_id(), "node_ip": ray.util.get_node_ip_address(),
                "pid": os.getpid()}

    def endpoint(self) -> tuple[str, int]:
        """Rank 0's meeting point: ``(node_ip, port)``, a TCP port bound on this node's IP
        (Ray's node address) and listening, so nothing else can take it before ``setup``
        hands the socket to the process group's TCP store. Calling it again returns the
        same endpoint.

        Raises:
            ClusterError: called on a rank other than 0.
        """
        if self.rank != 0:
            raise ClusterError(f"endpoint() is rank 0's; this is rank {self.rank}")
        if self._listen_sock is None:
            ip = ray.util.get_node_ip_address()
            sock = socket.socket(socket.AF_INET6 if ":" in ip else socket.AF_INET, socket.SOCK_STREAM)
            sock.bind((ip, 0))
            sock.listen(128)  # ranks that dial before setup wait in the backlog instead of being refused
            self._listen_sock = sock
        host, port = self._listen_sock.getsockname()[:2]
        return str(host), int(port)

    def setup(self, master_addr: str, master_port: int, timeout_s: float) -> dict:
        """Join the trainer process group at rank 0's ``(master_addr, master_port)``.

        Sets ``MASTER_ADDR`` / ``MASTER_PORT`` / ``RANK`` / ``WORLD_SIZE``; rank 0 serves the
        TCP store on the socket ``endpoint()`` reserved and waits for every other rank to
        connect, the others connect to it; then ``init_process_group(trainer.backend,
        timeout=timeout_s)`` (gloo pinned to the interface of this node's IP unless
        ``GLOO_SOCKET_IFNAME`` is set) and one all-reduce as the first collective. Every
        wait of the meeting (store connect, waiting for the ranks, the backend's
        connection mesh, the first collective) is bounded by ``timeout_s``. Afterwards the
        group's collective timeout goes back to torch's default (30 min for gloo,
        10 min for NCCL), so a long checkpoint write on rank 0 does not trip it.

        Returns:
            ``node()`` of this rank.

        Raises:
            ClusterError: the ranks did not meet within ``timeout_s`` (names this rank and
                node, the endpoint and the timeout), or ``endpoint()`` was not called on rank 0.
        """
        import torch  # heavy: torch
        import torch.distributed as dist  # heavy: torch
        from torch.distributed.constants import default_pg_timeout  # heavy: torch

        backend = self.cfg.trainer.backend
        os.environ.update({"MASTER_ADDR": str(master_addr), "MASTER_PORT": str(master_port),
                           "RANK": str(self.rank), "WORLD_SIZE": str(self.world_size)})
        node_ip = ray.util.get_node_ip_address()
        if backend == "gloo" and not os.environ.get("GLOO_SOCKET_IFNAME"):
            ifname = _interface_of(node_ip)
            if ifname is not None:  # else gloo resolves the hostname (loopback on some hosts)
                os.environ["GLOO_SOCKET_IFNAME"] = ifname
        timeout = timedelta(seconds=float(timeout_s))
        t0 = time.monotonic()
        try:
            if self.rank == 0:
                if self._listen_sock is None:
                    raise ClusterError("trainer rank 0: setup() before endpoint(); the group asks rank 0 for its endpoint first")
                fd = self._listen_sock.detach()  # the store's server owns (and closes) the socket from here
                self._listen_sock = None
                store = dist.TCPStore(master_addr, int(master_port), self.world_size, is_master=True, timeout=timeout,
                                      wait_for_workers=True, master_listen_fd=fd)
            else:
                store = dist.TCPStore(master_addr, int(master_port), self.world_size, is_master=False, timeout=timeout)
            dist.init_process_group(backend, store=store, rank=self.rank, world_size=self.world_size, timeout=timeout)
            device = torch.device("cuda", torch.cuda.current_device()) if backend == "nccl" else torch.device("cpu")
            probe = torch.ones(1, device=device)
            dist.all_reduce(probe)
            if int(probe.item()) != self.world_size:
                raise ClusterError(f"trainer rank {self.rank}: the first all-reduce summed {probe.item()} "
                                   f"over world_size={self.world_size} ranks")
        except ClusterError:
            raise
        except (RuntimeError, OSError) as exc:  # torch's DistError / DistStoreError / DistNetworkError
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            who = (f"trainer rank 0 serving the meeting at {master_addr}:{master_port} (node {node_ip}): the other ranks "
                   "did not all arrive" if self.rank == 0 else
                   f"trainer rank {self.rank} (node {node_ip}) could not meet rank 0 at {master_addr}:{master_port}")
            raise ClusterError(
                f"{who} within cluster.rendezvous_timeout_s={float(timeout_s):g} s (after {time.monotonic() - t0:.1f} s): "
                f"{type(exc).__name__}: {first}"
            ) from None
        dist.distributed_c10d._set_pg_timeout(default_pg_timeout)
        store.set_timeout(default_pg_timeout)
        self._store = store
        return self.node()

    def build(self) -> None:
        """Build this rank's trainers from the run config (the model loads and FSDP2 shards
        it over the group ``setup`` joined). Collective: every rank calls it.

        Raises:
            ClusterError: ``setup`` has not completed on this rank.
            ConfigError: from ``trainer_configs`` (e.g. a reference model with another vocabulary).
        """
        import torch.distributed as dist  # heavy: torch

        from agentrl.trainer.critic_trainer import CriticTrainer  # heavy: torch
        from agentrl.trainer.trainer import PolicyTrainer  # heavy: torch

        if not dist.is_initialized():
            raise ClusterError(f"trainer rank {self.rank}: build() before setup() joined the process group")
        policy_cfg, critic_cfg = trainer_configs(self.cfg, self.model_path)  # critic_cfg: None without a critic
        self.trainer = PolicyTrainer(policy_cfg)
        self.critic = CriticTrainer(critic_cfg) if critic_cfg is not None else None

    def step(self, batch) -> Any:
        """``PolicyTrainer.step`` (all ranks must call): one update on a ``TokenBatch``; its
        ``StepResult``: metrics on every rank, the per-token log-probs and entropies
        (``[T]`` float32 each) on rank 0 only, so the other ranks send back metrics alone."""
        return self.trainer.step(batch)

    def compute_log_probs(self, batch) -> Any:
        return self.trainer.compute_log_probs(batch)

    def kl_to_reference(self, batch) -> tuple[Any, dict[str, float]]:
        """``PolicyTrainer.kl_to_reference`` (all ranks must call): per-token KL estimates
        of the sampled tokens to the reference, and the ``kl/*`` metrics."""
        return self.trainer.kl_to_reference(batch)

    # -- weight sync (agentrl.cluster.engines.weight_sync) --
    def _weight_sender(self) -> Any:
        if getattr(self, "_weights_out", None) is None:
            from agentrl.cluster.engines.weight_sync import WeightSender  # heavy: torch

            self._weights_out = WeightSender()
        return self._weights_out

    def state_dict_ref(self) -> list | None:
        """The weights for the engines, packed into one buffer in Ray's object store. All
        ranks must call (the gather is collective); rank 0 returns ``[ref, stats]`` (a
        list, so the driver passes the reference on unresolved; ``stats``: ``gather_s``,
        ``pack_s``, ``put_s``, ``mb``), the others ``None``."""
        out = self._weight_sender().gather(self.trainer, self.rank, self.cfg.model.dtype)
        if out is None:
            return None
        layout, stats = out
        ref, put_s = self._weight_sender().put()
        return [ref, {**stats, "put_s": put_s, "mb": layout.nbytes / 1e6}]

    def warm_weight_sync(self) -> float:
        """All ranks, once before the first sync: pre-touch the sync's buffers
        (``WeightSender.warm``); seconds taken."""
        return self._weight_sender().warm(self.trainer, self.rank, self.cfg.model.dtype, self.cfg.cluster.weight_sync)

    def gather_weights(self) -> tuple | None:
        """The collective path's gather (all ranks): rank 0 returns ``(layout, stats,
        key of the weight-sync group it holds or None)``, the others ``None``."""
        out = self._weight_sender().gather(self.trainer, self.rank, self.cfg.model.dtype)
        return None if out is None else (*out, self._weight_sender().group_key())

    def weight_group_endpoint(self) -> tuple[str, int, str]:
        """Rank 0: ``(node_ip, port, backend)`` for a new weight-sync group."""
        return self._weight_sender().endpoint()

    def join_weight_group(self, spec: Any) -> None:
        """Rank 0: host and join the weight-sync group ``spec`` as its rank 0."""
        self._weight_sender().join(spec)

    def broadcast_weights(self, key: str) -> float:
        """Rank 0: broadcast the gathered weights to group ``key``; seconds taken."""
        return self._weight_sender().broadcast(key)

    def critic_values(self, batch) -> Any:
        return self.critic.compute_values(batch)

    def critic_step(self, batch) -> dict[str, float]:
        return self.critic.step(batch)

    def save_checkpoint(self, path: str) -> None:
        self.trainer.save_checkpoint(path)
        if self.critic is not None:
            self.critic.save_checkpoint(path + "_critic")

    def load_checkpoint(self, path: str) -> None:
        self.trainer.load_checkpoint(path)
        if self.critic is not None:
            self.critic.load_checkpoint(path + "_critic")

    def save_hf(self, path: str) -> None:
        self.trainer.save_hf(path)
